"""The CRM is the system of record: every input is a hint, read back before routing, and an
owner a person set is never overwritten. End to end: real Postgres, the app under uvicorn, the
CRM simulators over real HTTP and the real client libraries inside the adapters."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import Engine, text

from connector.core.config import OrgConfig, Rule
from connector.intake.hubspot_events import creation_events, events_body
from connector.intake.importer import ingest_file
from connector.intake.inbox import list_events
from connector.intake.inbox import retry_dead as retry_dead_events
from connector.intake.receivers import create_app
from connector.intake.signatures import signed_headers
from connector.intake.soap import OUTBOUND_MESSAGE_HEADERS, ack_response, build_outbound_message
from connector.routing.assign import Lead, Router
from connector.routing.teams import apply_teams
from connector.shell.adapters import Adapters, adapter_for
from connector.shell.retention import purge
from connector.shell.service import serve_in_thread
from connector.shell.status import org_status
from connector.writeback.dispatch import Dispatcher
from connector.writeback.finished import finished_rows, retry_dead
from crm_adapters.salesforce_ids import to_18
from crm_sandboxes import HubSpotSandbox, SalesforceSandbox
from testbed.crm_orgs import (
    HS_WEBHOOK_SECRET,
    OUTBOUND_SECRET,
    PORTAL_ID,
    SF_ORG_ID,
    hubspot_org,
    salesforce_org,
)
from testbed.waiting import wait_until

SOAP_HEADERS = OUTBOUND_MESSAGE_HEADERS


class SfOrg:
    """A Salesforce org routing Leads: reps, an intake user, and a person who owns records."""

    def __init__(self, sf: SalesforceSandbox, engine: Engine) -> None:
        self.sf = sf
        self.reps = [sf.add_user(f"Rep {i}") for i in range(3)]
        self.intake = sf.add_user("Lead intake")
        self.person = sf.add_user("A person")
        cfg = salesforce_org(sf, self.reps, org="acme", obj="Lead", intake=[self.intake])
        us = Rule(team="ae", when={"Country": ["US", "CA"]}, name="north america")
        self.cfg = cfg.model_copy(update={"rules": [us, *cfg.rules]})
        apply_teams(engine, self.cfg)

    def leads(self, n: int, owner: str | None) -> list[str]:
        return [
            self.sf.add_record("Lead", owner_id=owner, fields={"Country": "US"}) for _ in range(n)
        ]

    def owner(self, rid: str) -> str | None:
        rec = self.sf.get_record(rid)
        assert rec is not None
        owner: str | None = rec["OwnerId"]
        return owner


def message(ids: list[str], org_id: str = SF_ORG_ID, first: int = 0) -> bytes:
    return build_outbound_message(
        org_id,
        [
            (f"04l{first + n:012d}AAA", "Lead", {"Id": rid, "Country": "FR"})
            for n, rid in enumerate(ids)
        ],
    )


def table_counts(engine: Engine) -> dict[str, int]:
    with engine.connect() as conn:
        return {
            t: conn.execute(text(f"SELECT count(*) FROM {t}")).scalar_one()
            for t in ("intake_events", "leads", "assignments", "outbox", "skipped_records")
        }


def rotation_total(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT sum(assigned_in_epoch) FROM members")).scalar_one())


def skips(engine: Engine) -> dict[str, str]:
    with engine.connect() as conn:
        return dict(conn.execute(text("SELECT crm_id, reason FROM skipped_records")).all())


def running_app(engine: Engine, configs: dict[str, OrgConfig]) -> tuple[object, Adapters]:
    adapters = Adapters(configs)
    return create_app(engine, configs, adapters=adapters.get), adapters


def drain_inbox(app: object) -> None:
    worker = app.state.inbox_worker  # type: ignore[attr-defined]
    worker.drain()


# --- 1. authenticated Outbound Messages --------------------------------------------------


def test_forged_outbound_message_changes_nothing(engine: Engine, sf: SalesforceSandbox) -> None:
    """The issue's attack: a SOAP message carrying only a real OrganizationId (it is on every
    Web-to-Lead form) used to change the owners of Leads a person owned. Without the URL
    secret it is refused like an unknown org, and nothing is stored or written."""
    org = SfOrg(sf, engine)
    owned = org.leads(10, org.person)
    app, _ = running_app(engine, {"acme": org.cfg})
    with serve_in_thread(app) as base, httpx.Client(base_url=base, timeout=10) as client:
        answers = [
            client.post(path, content=message(owned), headers=SOAP_HEADERS)
            for path in (
                "/webhooks/salesforce/acme",
                "/webhooks/salesforce/acme/" + "x" * len(OUTBOUND_SECRET),
                "/webhooks/salesforce/acme/" + OUTBOUND_SECRET[:-1] + "X",
                "/webhooks/salesforce/nobody/" + OUTBOUND_SECRET,
            )
        ]
    assert {(a.status_code, a.content) for a in answers} == {(404, answers[0].content)}
    assert b"not_found" in answers[0].content
    drain_inbox(app)
    dispatcher = Dispatcher(engine, "acme", adapter_for(org.cfg), intake_owner_ids=[org.intake])
    dispatcher.drain(timeout=10)
    assert table_counts(engine) == dict.fromkeys(
        ("intake_events", "leads", "assignments", "outbox", "skipped_records"), 0
    )
    assert all(org.owner(r) == org.person for r in owned)


def test_invented_ids_from_an_authenticated_sender_route_nothing(
    engine: Engine, sf: SalesforceSandbox
) -> None:
    """100 invented ids in one (authenticated) message used to create 100 leads, move the
    rotation and leave 100 dead outbox rows. Read back, they are simply not found."""
    org = SfOrg(sf, engine)
    invented = [to_18(f"00Q5g00000Zz{i:03d}") for i in range(100)]
    app, _ = running_app(engine, {"acme": org.cfg})
    with serve_in_thread(app) as base, httpx.Client(base_url=base, timeout=10) as client:
        resp = client.post(
            f"/webhooks/salesforce/acme/{OUTBOUND_SECRET}",
            content=message(invented),
            headers=SOAP_HEADERS,
        )
    assert resp.status_code == 200 and resp.content == ack_response()
    drain_inbox(app)
    counts = table_counts(engine)
    assert (counts["leads"], counts["assignments"], counts["outbox"]) == (0, 0, 0)
    assert counts["skipped_records"] == 100
    assert set(skips(engine).values()) == {"not_found"}
    assert rotation_total(engine) == 0
    assert org_status(engine, org.cfg)["skipped"] == {"not_found": 100}


# --- 2. person-owned records on every path -----------------------------------------------


def test_outbound_messages_route_only_what_the_crm_says_is_unrouted(
    engine: Engine, sf: SalesforceSandbox
) -> None:
    org = SfOrg(sf, engine)
    intake = org.leads(6, org.intake)
    owned = org.leads(4, org.person)
    contact = sf.add_record("Contact", owner_id=org.intake)
    app, _ = running_app(engine, {"acme": org.cfg})
    with serve_in_thread(app) as base, httpx.Client(base_url=base, timeout=10) as client:
        ids = intake + owned
        resp = client.post(
            f"/webhooks/salesforce/acme/{OUTBOUND_SECRET}",
            content=message(ids),
            headers=SOAP_HEADERS,
        )
        assert resp.content == ack_response()
        # A Contact id in a Lead message (another object): never read as a Lead.
        body = build_outbound_message(SF_ORG_ID, [("04l000000000999AAA", "Lead", {"Id": contact})])
        assert (
            client.post(
                f"/webhooks/salesforce/acme/{OUTBOUND_SECRET}", content=body, headers=SOAP_HEADERS
            ).content
            == ack_response()
        )
    drain_inbox(app)
    Dispatcher(engine, "acme", adapter_for(org.cfg), intake_owner_ids=[org.intake]).drain(10)

    with engine.connect() as conn:
        routed = dict(
            conn.execute(
                text(
                    "SELECT l.crm_id, l.fields->>'Country' FROM leads l "
                    "JOIN assignments a ON a.lead_id = l.id"
                )
            ).all()
        )
    assert set(routed) == set(intake)
    # The rules saw the CRM's Country (US), not the message's (FR).
    assert set(routed.values()) == {"US"}
    assert all(org.owner(r) in org.reps for r in intake)
    assert all(org.owner(r) == org.person for r in owned)
    assert skips(engine) == {**dict.fromkeys(owned, "owned"), contact: "wrong_object"}
    assert rotation_total(engine) == len(intake)
    status = org_status(engine, org.cfg)
    assert status["skipped"] == {"owned": 4, "wrong_object": 1}
    assert status["outbox"]["sent"] == len(intake)


def written_while_routing_waits(engine: Engine, route: Callable[[], object]) -> set[str]:
    """Run ``route`` in a thread while another transaction holds every team's lock of org
    acme: the tables its transaction has written when it waits for that lock (their
    RowExclusiveLock), read from a connection of its own (a transaction sees
    pg_stat_activity as it was when it first looked). The lock goes and ``route`` ends."""
    with (
        engine.connect() as holder,
        engine.connect().execution_options(isolation_level="AUTOCOMMIT") as look,
    ):
        holder.execute(text("SELECT id FROM teams WHERE org = 'acme' FOR UPDATE"))
        mine = holder.execute(text("SELECT pg_backend_pid()")).scalar_one()
        thread = threading.Thread(target=route)
        thread.start()
        try:
            waiting = wait_until(
                lambda: look.execute(
                    text(
                        "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                        "AND datname = current_database() AND pid <> :mine"
                    ),
                    {"mine": mine},
                ).scalar(),
                timeout=30,
                what="a routing transaction waiting for the team's lock",
            )
            return set(
                look.execute(
                    text(
                        "SELECT c.relname FROM pg_locks l JOIN pg_class c ON c.oid = l.relation "
                        "WHERE l.pid = :pid AND l.granted AND l.mode = 'RowExclusiveLock'"
                    ),
                    {"pid": waiting},
                ).scalars()
            )
        finally:
            holder.rollback()  # the team's lock goes: routing goes on
            thread.join(timeout=60)


def test_the_inbox_writes_its_rows_before_it_waits_for_a_teams_lock(
    engine: Engine, sf: SalesforceSandbox
) -> None:
    """The routing transaction marks its events and records its skips first, then routes: a
    team's lock is held for the routing and the commit, not for those rows too (its claim's
    events took 3.4 ms to mark at 100 events). And skips before teams is the order the
    import takes too, so the two never wait for each other in opposite orders."""
    org = SfOrg(sf, engine)
    intake = org.leads(3, org.intake)
    owned = org.leads(2, org.person)
    # The events are received by an app without a worker (they wait in the inbox: a served
    # app's own worker could route them before the team's lock is taken) and drained by the
    # worker of an app that is never served.
    receiver = create_app(engine, {"acme": org.cfg})
    with serve_in_thread(receiver) as base, httpx.Client(base_url=base, timeout=10) as client:
        resp = client.post(
            f"/webhooks/salesforce/acme/{OUTBOUND_SECRET}",
            content=message(intake + owned),
            headers=SOAP_HEADERS,
        )
        assert resp.content == ack_response()
    assert len(list_events(engine, "acme", "pending")) == len(intake) + len(owned)
    app, _ = running_app(engine, {"acme": org.cfg})
    drained: list[int] = []
    written = written_while_routing_waits(
        engine,
        lambda: drained.append(app.state.inbox_worker.drain()),  # type: ignore[attr-defined]
    )
    # the events are marked and the skips recorded; nothing is routed yet
    assert {"intake_events", "skipped_records"} <= written, written
    assert "assignments" not in written, written
    assert drained == [len(intake) + len(owned)]
    assert rotation_total(engine) == len(intake)
    assert skips(engine) == dict.fromkeys(owned, "owned")
    assert len(list_events(engine, "acme", "done")) == len(intake)
    assert len(list_events(engine, "acme", "skipped")) == len(owned)


def test_an_import_records_its_skips_before_it_waits_for_a_teams_lock(
    engine: Engine, sf: SalesforceSandbox, tmp_path: Path
) -> None:
    org = SfOrg(sf, engine)
    intake = org.leads(3, org.intake)
    owned = org.leads(2, org.person)
    path = tmp_path / "leads.jsonl"
    path.write_text("".join(json.dumps({"Id": r}) + "\n" for r in [*intake, *owned]))
    summaries: list[Any] = []

    def ingest() -> None:
        router = Router(engine, org.cfg)
        summaries.append(ingest_file(router, path, "jsonl", "Id", adapter=adapter_for(org.cfg)))

    written = written_while_routing_waits(engine, ingest)
    assert "skipped_records" in written and "assignments" not in written, written
    assert [(s.assigned, s.skipped) for s in summaries] == [(3, {"owned": 2})]
    assert skips(engine) == dict.fromkeys(owned, "owned")


def hubspot_delivery(
    client: httpx.Client, base: str, ids: list[str], first_event: int, portal: int = PORTAL_ID
) -> httpx.Response:
    now_ms = int(time.time() * 1000)
    body = events_body(
        creation_events(portal, "contacts", [int(rid) for rid in ids], first_event, now_ms)
    )
    url = f"{base}/webhooks/hubspot/hsdemo"
    headers = signed_headers(HS_WEBHOOK_SECRET, url, body, now_ms)
    return client.post(url, content=body, headers=headers)


def test_hubspot_creation_of_an_owned_contact_keeps_its_owner(
    engine: Engine, hs: HubSpotSandbox
) -> None:
    """A contact.creation event does not mean the contact is unowned: forms, imports and
    workflows set owners at creation."""
    owners = [hs.add_owner(f"O{i}") for i in range(2)]
    person = hs.add_owner("Person")
    cfg = hubspot_org(hs, owners)
    apply_teams(engine, cfg)
    free = [hs.add_record("contacts") for _ in range(3)]
    taken = [hs.add_record("contacts", owner_id=person) for _ in range(2)]
    app, _ = running_app(engine, {"hsdemo": cfg})
    with serve_in_thread(app) as base, httpx.Client(timeout=10) as client:
        resp = hubspot_delivery(client, base, free + taken, 100)
        assert resp.status_code == 200 and resp.json()["queued"] == 5
        # Another portal's events on the same URL: refused, nothing of them stored.
        foreign = hubspot_delivery(client, base, free, 200, portal=PORTAL_ID + 1)
        assert (foreign.status_code, foreign.json()["error"]) == (403, "wrong_portal")
    drain_inbox(app)
    Dispatcher(engine, "hsdemo", adapter_for(cfg), intake_owner_ids=cfg.intake_owner_ids).drain(10)
    assert table_counts(engine)["intake_events"] == 5
    assert skips(engine) == dict.fromkeys(taken, "owned")
    for rid in taken:
        rec = hs.get_record(rid)
        assert rec is not None and rec["properties"]["hubspot_owner_id"] == person
    for rid in free:
        rec = hs.get_record(rid)
        assert rec is not None and rec["properties"]["hubspot_owner_id"] in owners


def test_import_verifies_each_batch_against_the_crm(
    engine: Engine, sf: SalesforceSandbox, tmp_path: Path
) -> None:
    org = SfOrg(sf, engine)
    intake = org.leads(5, org.intake)
    owned = org.leads(3, org.person)
    missing = to_18("00Q5g00000Zz001")
    path = tmp_path / "backfill.jsonl"
    rows = [{"Id": r, "Country": "DE"} for r in [*intake, *owned, missing]]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    router = Router(engine, org.cfg)
    summary = ingest_file(router, path, "jsonl", "Id", batch_size=4, adapter=adapter_for(org.cfg))
    assert (summary.assigned, summary.duplicate) == (5, 0)
    assert summary.skipped == {"owned": 3, "not_found": 1}
    assert skips(engine) == {**dict.fromkeys(owned, "owned"), missing: "not_found"}
    with engine.connect() as conn:
        countries = set(conn.execute(text("SELECT fields->>'Country' FROM leads")).scalars())
    assert countries == {"US"}  # the CRM's value, not the file's
    # A re-import changes nothing: routed leads are not read again.
    again = ingest_file(router, path, "jsonl", "Id", adapter=adapter_for(org.cfg))
    assert (again.new, again.duplicate) == (0, 5)
    assert rotation_total(engine) == 5


# --- 3. owner-safe write-back -------------------------------------------------------------


def test_a_persons_change_between_assignment_and_write_back_is_kept(
    engine: Engine, sf: SalesforceSandbox
) -> None:
    """The issue's case: the first write-back got a 503, a person then changed the owner in
    the CRM, and the retry overwrote it while the outbox said `sent`."""
    org = SfOrg(sf, engine)
    rids = org.leads(3, org.intake)
    Router(engine, org.cfg).assign_many([Lead(r, {"Country": "US"}) for r in rids], "api")
    d = Dispatcher(
        engine, "acme", adapter_for(org.cfg), intake_owner_ids=[org.intake], backoff_base=0.05
    )
    sf.inject_failures(1, 503, path_contains="composite/sobjects")
    first = d.run_once()
    assert (first.retried, first.sent) == (3, 0)

    sf.person_edit(rids[0], org.person)  # a person takes the first Lead meanwhile
    d.drain(timeout=10)
    assert org.owner(rids[0]) == org.person
    assert org.owner(rids[1]) in org.reps and org.owner(rids[2]) in org.reps
    rows = finished_rows(engine, "acme", "superseded")
    assert [(r["crm_id"], r["found_owner"]) for r in rows] == [(rids[0], org.person)]
    assert org_status(engine, org.cfg)["outbox"]["superseded"] == 1


def test_outbox_retry_goes_through_the_same_check(engine: Engine, sf: SalesforceSandbox) -> None:
    org = SfOrg(sf, engine)
    rids = org.leads(2, org.intake)
    Router(engine, org.cfg).assign_many([Lead(r, {}) for r in rids], "api")
    d = Dispatcher(engine, "acme", adapter_for(org.cfg), intake_owner_ids=[org.intake])
    sf.poison(rids)  # a validation rule fails both writes: dead
    assert d.drain(timeout=10).dead == 2
    sf.clear_faults()
    sf.person_edit(rids[0], org.person)  # days later a person took one of them
    assert retry_dead(engine, "acme") == 2
    stats = d.drain(timeout=10)
    assert (stats.sent, stats.superseded) == (1, 1)
    assert org.owner(rids[0]) == org.person
    assert org.owner(rids[1]) in org.reps


def test_a_record_that_already_has_our_owner_is_not_written_again(
    engine: Engine, sf: SalesforceSandbox
) -> None:
    org = SfOrg(sf, engine)
    rid = org.leads(1, org.intake)[0]
    out = Router(engine, org.cfg).assign(Lead(rid, {}), "api")
    sf.person_edit(rid, str(out.owner_id))  # e.g. our earlier write landed, its answer lost
    before = sf.counters()["calls"].get("PATCH composite/sobjects", 0)
    stats = Dispatcher(engine, "acme", adapter_for(org.cfg), intake_owner_ids=[org.intake]).drain(
        timeout=10
    )
    assert (stats.sent, stats.requests, stats.reads) == (1, 0, 1)
    assert sf.counters()["calls"].get("PATCH composite/sobjects", 0) == before


def test_one_owner_read_per_write_request(engine: Engine, sf: SalesforceSandbox) -> None:
    org = SfOrg(sf, engine)
    rids = org.leads(450, None)
    Router(engine, org.cfg).assign_many([Lead(r, {}) for r in rids], "api")
    stats = Dispatcher(engine, "acme", adapter_for(org.cfg), intake_owner_ids=[org.intake]).drain(
        timeout=30
    )
    assert stats.sent == 450
    assert stats.reads == stats.requests == 3  # ceil(450 / 200) writes, one read before each


# --- 6. operator tools ----------------------------------------------------------------------


def test_dead_inbox_events_can_be_listed_and_retried(engine: Engine, sf: SalesforceSandbox) -> None:
    org = SfOrg(sf, engine)
    rid = org.leads(1, org.intake)[0]
    app, _ = running_app(engine, {"acme": org.cfg})
    worker = app.state.inbox_worker  # type: ignore[attr-defined]
    worker.max_attempts = 1
    with serve_in_thread(app) as base, httpx.Client(base_url=base, timeout=10) as client:
        sf.inject_failures(1, 401, {"errorCode": "INVALID_AUTH_HEADER", "message": "no"})
        worker.stop()
        resp = client.post(
            f"/webhooks/salesforce/acme/{OUTBOUND_SECRET}",
            content=message([rid]),
            headers=SOAP_HEADERS,
        )
        assert resp.status_code == 200
    worker.drain()
    dead = list_events(engine, "acme", "dead")
    assert [(e["crm_id"], e["attempts"]) for e in dead] == [(rid, 1)]
    assert "CRM read failed" in dead[0]["last_error"]
    assert org_status(engine, org.cfg)["inbox"]["dead"] == 1
    assert retry_dead_events(engine, "acme") == 1
    worker.drain()
    assert list_events(engine, "acme", "dead") == []
    assert org.owner(rid) == org.intake  # routed; the dispatcher has not run
    assert table_counts(engine)["assignments"] == 1


def test_retention_purges_old_payloads_and_finished_rows(
    engine: Engine, sf: SalesforceSandbox
) -> None:
    org = SfOrg(sf, engine)
    rids = org.leads(4, org.intake)
    Router(engine, org.cfg).assign_many([Lead(r, {"Email": "x@y.z"}) for r in rids], "api")
    Dispatcher(engine, "acme", adapter_for(org.cfg), intake_owner_ids=[org.intake]).drain(10)
    with engine.begin() as conn:  # two of them are 40 days old
        conn.execute(
            text(
                "UPDATE leads SET received_at = now() - interval '40 days' WHERE crm_id = ANY(:ids)"
            ),
            {"ids": rids[:2]},
        )
        conn.execute(
            text(
                "UPDATE outbox SET finished_at = now() - interval '40 days' "
                "WHERE crm_id = ANY(:ids)"
            ),
            {"ids": rids[:2]},
        )
    before = org_status(engine, org.cfg)
    done = purge(engine, "acme", 30)
    assert (done.fields_cleared, done.outbox_deleted, done.ran) == (2, 2, True)
    with engine.connect() as conn:
        kept = dict(conn.execute(text("SELECT crm_id, fields FROM leads")).all())
    assert {r: kept[r] for r in rids[:2]} == {rids[0]: {}, rids[1]: {}}
    assert all(kept[r] == {"Email": "x@y.z"} for r in rids[2:])
    after = org_status(engine, org.cfg)
    assert after["teams"] == before["teams"] and after["leads"] == before["leads"]
    assert after["outbox"]["sent"] == 2
    assert purge(engine, "acme", 30).fields_cleared == 0  # idempotent


def test_a_crm_quota_answer_never_dead_letters_pushed_events(
    engine: Engine, sf: SalesforceSandbox
) -> None:
    """A 429 on the read-back is the CRM's quota, not the event's fault: the event waits the
    Retry-After without spending an attempt (even with max_attempts=1), then is routed."""
    org = SfOrg(sf, engine)
    rid = org.leads(1, org.intake)[0]
    app, _ = running_app(engine, {"acme": org.cfg})
    worker = app.state.inbox_worker  # type: ignore[attr-defined]
    worker.max_attempts = 1
    with serve_in_thread(app) as base, httpx.Client(base_url=base, timeout=10) as client:
        worker.stop()
        sf.inject_failures(
            1, 429, [{"errorCode": "REQUEST_LIMIT", "message": "slow down"}], path_contains="query"
        )
        resp = client.post(
            f"/webhooks/salesforce/acme/{OUTBOUND_SECRET}",
            content=message([rid]),
            headers=SOAP_HEADERS,
        )
        assert resp.status_code == 200
    worker.drain()
    with engine.connect() as conn:
        state, attempts, wait = conn.execute(
            text(
                "SELECT state, attempts, extract(epoch FROM available_at - now()) "
                "FROM intake_events"
            )
        ).one()
    assert (state, attempts) == ("pending", 0)
    assert 0 < wait <= 1.0  # the adapter's Retry-After for a request-scoped 429

    def routed() -> int:  # the event waits out the Retry-After, then a drain routes it
        worker.drain()
        return table_counts(engine)["assignments"]

    wait_until(routed, 10, "the event to be routed after its Retry-After", interval=0.1)
    assert table_counts(engine)["assignments"] == 1
    assert list_events(engine, "acme", "dead") == []
