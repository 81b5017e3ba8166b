"""The outbox dispatcher end to end: real Postgres, sandbox CRMs over real HTTP, and the
real client libraries (simple-salesforce, hubspot-api-client) inside the adapters."""

from __future__ import annotations

import itertools
import math
import threading
import time

from sqlalchemy import Engine, text

from connector.core.config import OrgConfig
from connector.routing.assign import Lead, Router
from connector.routing.teams import apply_teams
from connector.shell.adapters import adapter_for
from connector.shell.store import make_engine
from connector.writeback.dispatch import Dispatcher
from connector.writeback.finished import finished_rows, retry_dead
from connector.writeback.outcomes import Dead, requests_of
from connector.writeback.stats import DispatchStats
from crm_sandboxes import HubSpotSandbox, SalesforceSandbox
from testbed.crm_orgs import hubspot_org, salesforce_org
from testbed.pg import with_database


def _states(engine: Engine, org: str) -> dict[str, int]:
    with engine.connect() as conn:
        return {
            r[0]: r[1]
            for r in conn.execute(
                text("SELECT state, count(*) FROM outbox WHERE org = :o GROUP BY state"), {"o": org}
            )
        }


def _db_owners(engine: Engine, org: str) -> dict[str, str]:
    with engine.connect() as conn:
        return {
            r[0]: r[1]
            for r in conn.execute(
                text(
                    "SELECT l.crm_id, a.crm_user_id FROM leads l "
                    "JOIN assignments a ON a.lead_id = l.id WHERE l.org = :o"
                ),
                {"o": org},
            )
        }


def _seed_contacts(sf: SalesforceSandbox, n: int, accounts: int) -> tuple[list[str], list[Lead]]:
    reps = [sf.add_user(f"Rep {i}") for i in range(4)]
    accts = [sf.add_account() for _ in range(accounts)]
    leads = []
    for i in range(n):
        acct = accts[0] if i % 3 == 0 else accts[i % accounts]  # one Account holds a third
        rid = sf.add_record("Contact", account_id=acct)
        leads.append(Lead(rid, {"AccountId": acct}))
    return reps, leads


def _routed_contacts(
    engine: Engine, sf: SalesforceSandbox, n: int, accounts: int
) -> tuple[OrgConfig, list[Lead]]:
    """A Salesforce org of 4 reps whose `n` Contacts are routed (outbox rows pending)."""
    reps, leads = _seed_contacts(sf, n, accounts)
    cfg = salesforce_org(sf, reps)
    apply_teams(engine, cfg)
    Router(engine, cfg).assign_many(leads, "import")
    return cfg, leads


def test_salesforce_owners_reach_the_crm_in_batches_without_lock_errors(
    engine: Engine, sf: SalesforceSandbox
) -> None:
    cfg, _ = _routed_contacts(engine, sf, 900, accounts=12)

    dispatchers = [
        Dispatcher(engine, cfg.org, adapter_for(cfg), intake_owner_ids=cfg.intake_owner_ids)
        for _ in range(3)
    ]
    threads = [threading.Thread(target=d.drain, kwargs={"timeout": 60}) for d in dispatchers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    assert _states(engine, cfg.org) == {"sent": 900}
    for crm_id, owner in _db_owners(engine, cfg.org).items():
        assert sf.get_record(crm_id)["OwnerId"] == owner  # type: ignore[index]
    counters = sf.counters()
    assert counters.get("lock_errors", 0) == 0
    writes = sum(v for k, v in counters["calls"].items() if "composite" in k)
    assert writes <= math.ceil(1.1 * math.ceil(900 / 200)) + 2


def test_naive_parallel_writes_hit_unable_to_lock_row(sf: SalesforceSandbox) -> None:
    """The failure the dispatcher avoids, on the same sandbox: one PATCH per record, sent
    straight over HTTP (the adapters' client library is not involved)."""
    import requests

    rep = sf.add_user("Rep")
    acct = sf.add_account()
    ids = [sf.add_record("Contact", account_id=acct) for _ in range(24)]
    sf.configure(record_work_ms=150, lock_wait_s=0.1)
    errors: list[str] = []

    def patch(rid: str) -> None:
        s = requests.Session()
        r = s.patch(
            f"{sf.url}/services/data/v62.0/sobjects/Contact/{rid}",
            json={"OwnerId": rep},
            headers={"Authorization": f"Bearer {sf.session_token}"},
            timeout=10,
        )
        if r.status_code >= 400:
            errors.append(r.text)

    threads = [threading.Thread(target=patch, args=(rid,)) for rid in ids]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert any("UNABLE_TO_LOCK_ROW" in e for e in errors)


def test_permanent_errors_go_dead_with_the_reason_and_can_be_retried(
    engine: Engine, sf: SalesforceSandbox
) -> None:
    cfg, leads = _routed_contacts(engine, sf, 20, accounts=4)
    sf.delete_record(leads[3].crm_id)
    d = Dispatcher(engine, cfg.org, adapter_for(cfg), intake_owner_ids=cfg.intake_owner_ids)
    d.drain(timeout=30)
    assert _states(engine, cfg.org) == {"sent": 19, "dead": 1}
    dead = finished_rows(engine, cfg.org)
    assert [r["crm_id"] for r in dead] == [leads[3].crm_id]
    # The owner read just before the write no longer finds it (SOQL skips deleted records).
    assert dead[0]["last_error"].startswith("NOT_FOUND")

    assert retry_dead(engine, cfg.org) == 1
    assert _states(engine, cfg.org)["pending"] == 1
    d.drain(timeout=30)
    assert _states(engine, cfg.org) == {"sent": 19, "dead": 1}


def test_server_errors_are_retried_until_sent(engine: Engine, sf: SalesforceSandbox) -> None:
    cfg, _ = _routed_contacts(engine, sf, 50, accounts=5)
    sf.inject_failures(3, status=503, path_contains="composite")
    d = Dispatcher(
        engine,
        cfg.org,
        adapter_for(cfg),
        intake_owner_ids=cfg.intake_owner_ids,
        backoff_base=0.05,
        backoff_cap=0.2,
    )
    stats = d.drain(timeout=30)
    assert _states(engine, cfg.org) == {"sent": 50}
    assert stats.retried >= 50


def test_a_dead_dispatchers_claim_is_taken_over_after_its_lease(
    engine: Engine, sf: SalesforceSandbox
) -> None:
    cfg, _ = _routed_contacts(engine, sf, 30, accounts=3)
    dying = Dispatcher(
        engine, cfg.org, adapter_for(cfg), intake_owner_ids=cfg.intake_owner_ids, lease_seconds=0.5
    )
    claimed = dying.claim("dead-worker-token")  # claims, then "dies" before writing
    assert len(claimed) == 30
    survivor = Dispatcher(engine, cfg.org, adapter_for(cfg), intake_owner_ids=cfg.intake_owner_ids)
    assert survivor.run_once().claimed == 0  # the lease still protects the claim
    stats = survivor.drain(timeout=30)
    assert stats.sent == 30
    assert _states(engine, cfg.org) == {"sent": 30}
    # the stale worker wakes up and reports failure for everything: nothing changes
    late = [Dead(c.id, "late") for c in claimed]
    s = DispatchStats()
    dying._record("dead-worker-token", late, s)
    assert s.stale == 30
    assert _states(engine, cfg.org) == {"sent": 30}


def test_a_long_claim_renews_its_lease_and_sends_every_request(
    engine: Engine, sf: SalesforceSandbox
) -> None:
    # 450 rows: one claim of 3 requests, each after an owner read, so 6 lease checks. The
    # dispatcher's clock moves 1 s at each reading (it is read once before the claim and once
    # per check): the claim lasts 6 s of that clock against its 3 s lease (a wall-clock version
    # of this test failed on a loaded machine; the database's lease is still real time, 3 s
    # a call). Each
    # check is a quarter of the lease or more after the last renewal, so each renews; without
    # renewals the third check finds the lease over and leaves the rest to others.
    cfg, _ = _routed_contacts(engine, sf, 450, accounts=12)
    ticks = itertools.count()
    d = Dispatcher(
        engine, cfg.org, adapter_for(cfg), intake_owner_ids=cfg.intake_owner_ids,
        lease_seconds=3.0, clock=lambda: float(next(ticks)),
    )  # fmt: skip
    stats = d.run_once()
    assert (stats.claimed, stats.sent, stats.stale, stats.requests) == (450, 450, 0, 3)
    assert stats.renewals == 6
    assert _states(engine, cfg.org) == {"sent": 450}


def test_a_claim_whose_rows_were_taken_back_sends_nothing_more(
    engine: Engine, db_url: str, sf: SalesforceSandbox
) -> None:
    cfg, _ = _routed_contacts(engine, sf, 30, accounts=3)
    d = Dispatcher(
        engine, cfg.org, adapter_for(cfg), intake_owner_ids=cfg.intake_owner_ids, lease_seconds=10
    )
    claimed = d.claim("paused-token")
    assert len(claimed) == 30
    with engine.begin() as conn:  # its lease ended and another dispatcher took two rows
        conn.execute(
            text("UPDATE outbox SET claimed_by = 'other' WHERE id = ANY(:ids)"),
            {"ids": [c.id for c in claimed[:2]]},
        )
    leases = text("SELECT id, lease_until FROM outbox WHERE claimed_by = 'paused-token'")
    with engine.connect() as conn:
        before = sorted(conn.execute(leases).all())
    batches = requests_of(claimed, 200)
    stats = DispatchStats()
    over_a_quarter = time.monotonic() - 6.0
    assert d._keep_lease("paused-token", batches, over_a_quarter, stats) is None
    assert (stats.renewals, stats.stale) == (0, 30)
    with engine.connect() as conn:  # rolled back: the rows still ours keep their lease
        assert sorted(conn.execute(leases).all()) == before and len(before) == 28
    # still well within the lease: no renewal asked, the claim goes on
    fresh = DispatchStats()
    now = time.monotonic()
    assert d._keep_lease("paused-token", batches, now, fresh) == now
    assert (fresh.renewals, fresh.stale) == (0, 0)
    # a lease that may have ended is never renewed
    late = DispatchStats()
    assert d._keep_lease("paused-token", batches, time.monotonic() - 10.0, late) is None
    assert (late.renewals, late.stale) == (0, 30)
    # a database that cannot be reached stops the claim; its rows wait for their lease
    gone = Dispatcher(
        make_engine(with_database(db_url, "no_such_database")), cfg.org, adapter_for(cfg),
        intake_owner_ids=cfg.intake_owner_ids, lease_seconds=10,
    )  # fmt: skip
    failed = DispatchStats()
    assert gone._keep_lease("paused-token", batches, over_a_quarter, failed) is None
    assert (failed.renewals, failed.stale) == (0, 30)
    gone.engine.dispose()


def test_hubspot_owners_reach_the_crm(engine: Engine, hs: HubSpotSandbox) -> None:
    owners = [hs.add_owner(f"Rep{i}") for i in range(3)]
    ids = [hs.add_record("contacts") for _ in range(250)]
    cfg = hubspot_org(hs, owners)
    apply_teams(engine, cfg)
    Router(engine, cfg).assign_many([Lead(i, {}) for i in ids], "import")
    stats = Dispatcher(
        engine, cfg.org, adapter_for(cfg), intake_owner_ids=cfg.intake_owner_ids
    ).drain(timeout=60)
    assert stats.sent == 250
    for crm_id, owner in _db_owners(engine, cfg.org).items():
        record = hs.get_record(crm_id)
        assert record is not None
        assert record["properties"]["hubspot_owner_id"] == owner
    assert stats.requests == 3  # ceil(250 / 100)


def test_hubspot_rate_limit_is_learned_and_waited_out_not_refused(engine: Engine) -> None:
    box = HubSpotSandbox(limit_per_10s=4).start()
    try:
        owners = [box.add_owner("A"), box.add_owner("B")]
        # 3 requests of 100, each after an owner read: 6 calls, over the 4 per 10 s allowed
        # (the wait is the scenario). The adapter learns the real limit from the first
        # answer's headers and waits for the window instead of being refused: before it did,
        # every retry re-read the records into the freed slots and the writes were refused
        # again (96 refusals in 11 s, and no end within 60 s on a busy machine).
        ids = [box.add_record("contacts") for _ in range(300)]
        cfg = hubspot_org(box, owners, limit_per_10s=100)  # configured above the real limit
        apply_teams(engine, cfg)
        Router(engine, cfg).assign_many([Lead(i, {}) for i in ids], "import")
        stats = Dispatcher(
            engine, cfg.org, adapter_for(cfg), intake_owner_ids=cfg.intake_owner_ids
        ).drain(timeout=60)
        assert _states(engine, cfg.org) == {"sent": 300}
        assert stats.dead == 0
        assert box.counters().get("rate_limited", 0) == 0
        assert box.counters()["total_calls"] == 6
    finally:
        box.stop()
