"""`connector demo`: the whole flow on one laptop, with nothing installed.

It starts a throw-away embedded PostgreSQL, a Salesforce and a HubSpot sandbox (local
simulators of both APIs), writes a config folder for two orgs, and runs the service parts
in-process: the webhook receiver under uvicorn, the scheduled poll and the outbox
dispatchers. Then it sends a burst the way the CRMs would: Salesforce Outbound Messages
(SOAP) and signed HubSpot webhooks from 16 concurrent senders, with redeliveries, while some
Salesforce leads are never pushed and must be found by the poll. The dispatchers write the
owners back through simple-salesforce and hubspot-api-client. Leads at the domain of a
Salesforce Account go to the Account's owner (``route_to: account_owner``) without moving the
rotation. Finally it prints the
fairness table, ACK and lead-to-CRM latency percentiles and CRM API call counts, checks
every guarantee, and exits 0 only when all of them held.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import Engine, text

from connector.core.pacing import Nudges
from connector.intake.accounts_sync import refresh_accounts
from connector.intake.hubspot_events import creation_events, events_body
from connector.intake.receivers import create_app
from connector.intake.signatures import signed_headers
from connector.intake.soap import OUTBOUND_MESSAGE_HEADERS, build_outbound_message
from connector.shell.adapters import Adapters
from connector.shell.demo_notify import show_notifications
from connector.shell.demo_world import (
    DEMO_CAP,
    ENV,
    HS_PORTAL,
    SF_ORG_ID,
    World,
    make_world,
)
from connector.shell.embedded_pg import make_embedded_tempdir, start_embedded
from connector.shell.migrations import migrate
from connector.shell.notifying import start_notifiers
from connector.shell.scheduling import start_scheduler
from connector.shell.service import serve_in_thread, start_dispatchers
from connector.shell.status import org_status
from connector.shell.store import make_engine
from crm_adapters.base import AccountSource
from crm_sandboxes import HubSpotSandbox, SalesforceSandbox, SlackSandbox


@dataclass
class Sent:
    ack_ms: dict[str, list[float]] = field(
        default_factory=lambda: {"salesforce": [], "hubspot": []}
    )
    pushed_at: dict[str, float] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    deliveries: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, kind: str, ms: float, ids: list[str], sent_at: float) -> None:
        with self.lock:
            self.ack_ms[kind].append(ms)
            self.deliveries += 1
            for i in ids:
                self.pushed_at.setdefault(i, sent_at)


def send_soap(
    client: httpx.Client, url: str, batch: list[tuple[str, dict[str, str]]], sent: Sent, n: int
) -> None:
    body = build_outbound_message(
        SF_ORG_ID,
        [(f"04l{n:010d}{i:02d}AAA", "Lead", {"Id": rid, **f}) for i, (rid, f) in enumerate(batch)],
    )
    t0 = time.time()
    r = client.post(url, content=body, headers=OUTBOUND_MESSAGE_HEADERS)
    ms = (time.time() - t0) * 1000
    if r.status_code != 200 or b"<Ack>true</Ack>" not in r.content:
        sent.errors.append(f"salesforce {r.status_code}")
        return
    sent.record("salesforce", ms, [rid for rid, _ in batch], t0)


def send_hubspot(
    client: httpx.Client, url: str, ids: list[str], sent: Sent, first_event: int
) -> None:
    now_ms = int(time.time() * 1000)
    body = events_body(
        creation_events(HS_PORTAL, "contacts", [int(rid) for rid in ids], first_event, now_ms)
    )
    headers = signed_headers(ENV["DEMO_HS_WEBHOOK_SECRET"], url, body, now_ms)
    t0 = time.time()
    r = client.post(url, content=body, headers=headers)
    ms = (time.time() - t0) * 1000
    if r.status_code != 200:
        sent.errors.append(f"hubspot {r.status_code}")
        return
    sent.record("hubspot", ms, ids, t0)


def _pct(xs: list[float], p: float) -> float:
    if not xs:
        return 0.0
    s = sorted(xs)
    return s[min(len(s) - 1, int(p / 100 * len(s)))]


def forge_outbound_messages(client: httpx.Client, base: str, ids: list[str]) -> bool:
    """What anyone who read the org id off a Web-to-Lead form could send: refused (404)?"""
    body = build_outbound_message(
        SF_ORG_ID, [(f"04l{n:012d}AAA", "Lead", {"Id": rid}) for n, rid in enumerate(ids)]
    )
    codes = [
        client.post(f"{base}{path}", content=body, headers=OUTBOUND_MESSAGE_HEADERS).status_code
        for path in (
            "/webhooks/salesforce/demo-sf",
            "/webhooks/salesforce/demo-sf/guessed-secret-guessed-secret",
        )
    ]
    return codes == [404, 404]


def wait_until_done(engine: Engine, expected: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with engine.connect() as conn:
            leads, assigned, open_rows, inbox = conn.execute(
                text(
                    "SELECT (SELECT count(*) FROM leads), (SELECT count(*) FROM assignments), "
                    "(SELECT count(*) FROM outbox WHERE finished_at IS NULL), "
                    "(SELECT count(*) FROM intake_events WHERE state IN ('pending', 'claimed'))"
                )
            ).one()
        if leads >= expected and assigned >= expected and open_rows == 0 and inbox == 0:
            return True
        time.sleep(0.2)
    return False


def _fairness_lines(
    status: dict[str, Any], turns: dict[tuple[str, str], int]
) -> tuple[list[str], bool]:
    """The fairness table; a rep's turns are its leads plus the turns it was passed over
    (capped or away) and credited: those stay within one of its weighted share."""
    lines, ok = [], True
    for team in status["teams"]:
        members = [m for m in team["members"] if m["active"]]
        total = sum(turns[team["name"], m["crm_user_id"]] for m in members)
        leads = sum(m["assigned"] for m in members)
        weight = sum(m["weight"] for m in members)
        lines.append(f"  team {team['name']}: {leads} leads")
        for m in members:
            t = turns[team["name"], m["crm_user_id"]]
            share = total * m["weight"] / weight if weight else 0.0
            ok = ok and abs(t - share) < 1
            by_account = m.get("account_matched", 0)
            rotated = m["assigned"] - by_account  # leads given to an account's owner are no turn
            notes = []
            if t != rotated:
                notes.append(f"{t - rotated} turns passed over")
            if by_account:
                notes.append(f"+{by_account} by account")
            note = f"  ({', '.join(notes)})" if notes else ""
            lines.append(
                f"    {m['name']:<20} weight {m['weight']}  {m['assigned']:>5} leads  "
                f"turns {t:>5}  fair share {share:>7.2f}  off by {t - share:+.2f}{note}"
            )
    return lines, ok


def rotation_turns(engine: Engine) -> dict[tuple[str, str], int]:
    """(team, crm_user_id) -> leads + credited turns in the current epoch."""
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT t.name, m.crm_user_id, m.assigned_in_epoch + m.credited_in_epoch "
                "FROM members m JOIN teams t ON t.id = m.team_id"
            )
        ).all()
    return {(r[0], r[1]): r[2] for r in rows}


def crm_mismatches(engine: Engine, sf: SalesforceSandbox, hs: HubSpotSandbox) -> int:
    """How many leads' CRM owner differs from the owner Postgres assigned."""
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT l.org, l.crm_id, a.crm_user_id FROM leads l "
                "JOIN assignments a ON a.lead_id = l.id"
            )
        ).all()
    wrong = 0
    for org, crm_id, owner in rows:
        if org == "demo-sf":
            rec = sf.get_record(crm_id)
            wrong += rec is None or rec.get("OwnerId") != owner
        else:
            hrec = hs.get_record(crm_id)
            wrong += hrec is None or hrec["properties"].get("hubspot_owner_id") != owner
    return wrong


def _deliveries(
    sf: SalesforceSandbox, world: World, rng: random.Random, sf_leads: int
) -> tuple[list[tuple[str, Any]], int, int, int]:
    """The burst as the CRMs would send it, 10% redelivered, in random order: (jobs, SOAP
    messages, HubSpot batches, Salesforce records pushed)."""
    pushed = world.sf_ids[: int(sf_leads * 0.8)] + world.sf_person  # the rest only the poll finds
    rng.shuffle(pushed)
    hs_pushed = world.hs_ids + world.hs_person
    rng.shuffle(hs_pushed)
    sf_batches = [
        [
            (rid, {"Country": str(sf.get_record(rid)["Country"])})  # type: ignore[index]
            for rid in pushed[i : i + 4]
        ]
        for i in range(0, len(pushed), 4)
    ]
    hs_batches = [hs_pushed[i : i + 8] for i in range(0, len(hs_pushed), 8)]
    jobs: list[tuple[str, Any]] = [("sf", b) for b in sf_batches]
    jobs += [("hs", b) for b in hs_batches]
    jobs += [("sf", b) for b in rng.sample(sf_batches, len(sf_batches) // 10)]
    jobs += [("hs", b) for b in rng.sample(hs_batches, len(hs_batches) // 10)]
    rng.shuffle(jobs)
    return jobs, len(sf_batches), len(hs_batches), len(pushed)


def _send_burst(
    client: httpx.Client, base: str, jobs: list[tuple[str, Any]], senders: int
) -> tuple[Sent, float]:
    """Send every delivery from ``senders`` threads: (what was sent, seconds it took)."""
    sf_url = f"/webhooks/salesforce/demo-sf/{ENV['DEMO_SF_OUTBOUND_SECRET']}"
    sent = Sent()
    t_burst = time.perf_counter()
    with ThreadPoolExecutor(senders) as pool:
        for n, (kind, batch) in enumerate(jobs):
            if kind == "sf":
                pool.submit(send_soap, client, f"{base}{sf_url}", batch, sent, n)
            else:
                pool.submit(
                    send_hubspot,
                    client,
                    f"{base}/webhooks/hubspot/demo-hs",
                    batch,
                    sent,
                    1_000_000 + n * 100,
                )
    return sent, time.perf_counter() - t_burst


@dataclass
class _Outcome:
    """What the database holds once the burst is routed."""

    finished: dict[str, float]  # crm_id -> when its owner write was accepted (epoch s)
    double: int  # leads with two assignments
    sources: dict[str, int]  # leads by input path
    by_account: list[Any]  # (crm_id, owner, account id) of account-matched leads
    skipped: dict[str, int]  # pushed records not routed, by reason


def _read_outcome(engine: Engine) -> _Outcome:
    with engine.connect() as conn:
        finished: dict[str, float] = dict(
            conn.execute(
                text(
                    "SELECT l.crm_id, extract(epoch FROM o.finished_at) FROM outbox o "
                    "JOIN leads l ON l.id = o.lead_id WHERE o.state = 'sent'"
                )
            ).all()
        )
        double = conn.execute(
            text(
                "SELECT count(*) FROM (SELECT lead_id FROM assignments GROUP BY lead_id "
                "HAVING count(*) > 1) x"
            )
        ).scalar_one()
        sources: dict[str, int] = dict(
            conn.execute(text("SELECT source, count(*) FROM leads GROUP BY source")).all()
        )
        by_account = conn.execute(
            text(
                "SELECT l.crm_id, a.crm_user_id, a.account_match->>'account_id' FROM leads l "
                "JOIN assignments a ON a.lead_id = l.id "
                "WHERE a.account_match->>'result' = 'matched'"
            )
        ).all()
        skipped: dict[str, int] = dict(
            conn.execute(text("SELECT reason, count(*) FROM skipped_records GROUP BY reason")).all()
        )
    return _Outcome(finished, double, sources, list(by_account), skipped)


def _print_figures(
    engine: Engine,
    world: World,
    sent: Sent,
    outcome: _Outcome,
    sf: SalesforceSandbox,
    hs: HubSpotSandbox,
) -> bool:
    """The fairness table, latencies, input paths and API calls; whether turns were fair."""
    configs = world.configs
    lead_to_crm = [
        (float(outcome.finished[i]) - t) * 1000
        for i, t in sent.pushed_at.items()
        if i in outcome.finished
    ]
    print()
    fair = True
    turns = rotation_turns(engine)
    for org in ("demo-sf", "demo-hs"):
        status = org_status(engine, configs[org])
        lines, ok = _fairness_lines(status, turns)
        fair = fair and ok
        print(
            f"org {org} ({configs[org].crm.kind}): {status['leads']['assigned']} of "
            f"{status['leads']['total']} leads assigned; outbox {status['outbox']}"
        )
        print("\n".join(lines))
    print()
    for kind in ("salesforce", "hubspot"):
        xs = sent.ack_ms[kind]
        print(
            f"ACK latency {kind:<10}: p50 {_pct(xs, 50):6.1f} ms  p99 {_pct(xs, 99):6.1f} ms"
            f"  ({len(xs)} deliveries)"
        )
    print(
        f"lead-to-CRM latency    : p50 {_pct(lead_to_crm, 50):6.1f} ms  "
        f"p99 {_pct(lead_to_crm, 99):6.1f} ms  (push sent -> owner accepted by the CRM)"
    )
    print(f"leads by input path    : {outcome.sources}")
    print(
        f"account-matched leads  : {len(outcome.by_account)} at Initech's domain, to its owner "
        f"{configs['demo-sf'].team('emea_ae').members[0].name} (not rotation turns)"
    )
    print(f"pushed but not routed  : {outcome.skipped or 'none'} (read back from the CRM first)")
    for name, box in (("Salesforce", sf), ("HubSpot", hs)):
        calls = box.counters()["calls"]
        print(f"{name} API calls     : " + ", ".join(f"{k} {v}" for k, v in sorted(calls.items())))
    return fair


def _checks(
    engine: Engine,
    world: World,
    sent: Sent,
    outcome: _Outcome,
    sf: SalesforceSandbox,
    hs: HubSpotSandbox,
    *,
    done: bool,
    fair: bool,
    forged: bool,
) -> dict[str, bool]:
    """Every guarantee the demo shows, by name."""
    wrong = crm_mismatches(engine, sf, hs)
    people_kept = all(
        (sf.get_record(r) or {}).get("OwnerId") == world.reps[0] for r in world.sf_person
    ) and all(
        (hs.get_record(r) or {"properties": {}})["properties"].get("hubspot_owner_id")
        == world.owners[0]
        for r in world.hs_person
    )
    sf_counts = {
        m["name"]: m["assigned"]
        for t in org_status(engine, world.configs["demo-sf"])["teams"]
        for m in t["members"]
    }
    return {
        "every lead assigned and written back": done,
        "no delivery refused": not sent.errors,
        "no lead with two owners": outcome.double == 0,
        "CRM owner equals the database owner for every lead": wrong == 0,
        "every rep's turns within one of its weighted share": fair,
        f"capped rep (Tony Hoare) got exactly his cap of {DEMO_CAP}": sf_counts["Tony Hoare"]
        == DEMO_CAP,
        "rep away (Barbara Liskov) got no lead": sf_counts["Barbara Liskov"] == 0,
        "leads at an Account's domain went to its owner, outside the rotation": sorted(
            (r[0], r[1], r[2]) for r in outcome.by_account
        )
        == sorted((i, world.reps[3], world.initech) for i in world.account_leads),
        "forged Outbound Messages (no or a guessed URL secret) refused": forged,
        "records a person owns skipped, their CRM owner unchanged": people_kept
        and outcome.skipped.get("owned", 0) == len(world.sf_person) + len(world.hs_person),
    }


def run_demo(sf_leads: int = 600, hs_leads: int = 400, senders: int = 16) -> int:
    """Run the whole flow and print the figures; 0 when every guarantee held."""
    started = time.perf_counter()
    root = Path(tempfile.mkdtemp(prefix="connector-demo-"))
    pgroot = make_embedded_tempdir("connector-demo-pg-")  # as root the server user must reach it
    os.environ.update(ENV)
    rng = random.Random(7)
    stop = threading.Event()
    sched = None
    threads: list[threading.Thread] = []
    nudges = Nudges()  # the inbox worker wakes the dispatchers, as in `connector run`
    sf = SalesforceSandbox(lock_wait_s=10.0, record_work_ms=0.5).start()
    hs = HubSpotSandbox(limit_per_10s=100).start()
    slack = SlackSandbox().start()
    try:
        print(f"embedded PostgreSQL, Salesforce sandbox {sf.url}, HubSpot sandbox {hs.url}")
        url = start_embedded(pgroot / "pgdata", cleanup_mode="delete")
        engine = make_engine(url, pool_size=10)
        migrate(engine)
        world = make_world(engine, root, sf, hs, rng, sf_leads, hs_leads, slack)
        configs = world.configs

        adapters = Adapters(configs)
        sf_adapter = adapters.get("demo-sf")
        assert isinstance(sf_adapter, AccountSource)
        mirror = refresh_accounts(engine, configs["demo-sf"], sf_adapter)
        print(f"account mirror of demo-sf: {mirror.stored} account(s) read from Salesforce")
        app = create_app(engine, configs, adapters=adapters.get)
        with serve_in_thread(app) as base, httpx.Client(timeout=30) as client:
            app.state.inbox_worker.on_routed = nudges.nudge
            threads = start_dispatchers(
                engine, configs, adapters, stop, per_org=2, metrics=app.state.metrics, nudges=nudges
            ) + start_notifiers(engine, configs, stop)
            forged = forge_outbound_messages(client, base, world.sf_person)
            jobs, n_soap, n_hubspot, n_pushed = _deliveries(sf, world, rng, sf_leads)
            n_person = len(world.sf_person)
            print(
                f"sending {len(jobs)} deliveries ({n_soap} SOAP messages, "
                f"{n_hubspot} HubSpot webhook batches, 10% redelivered) "
                f"from {senders} senders; {sf_leads - n_pushed + n_person} Salesforce "
                f"leads are left for the poll; {n_person + len(world.hs_person)} pushed records "
                "already belong to a person ..."
            )
            sent, burst_s = _send_burst(client, base, jobs, senders)
            sched = start_scheduler(engine, configs, adapters)
            done = wait_until_done(engine, sf_leads + hs_leads, timeout=60)

        outcome = _read_outcome(engine)
        fair = _print_figures(engine, world, sent, outcome, sf, hs)
        checks = _checks(engine, world, sent, outcome, sf, hs, done=done, fair=fair, forged=forged)
        checks["every demo-sf rep told of each of their leads on Slack"] = show_notifications(
            engine, slack
        )
        engine.dispose()
        print()
        for name, ok in checks.items():
            print(f"  [{'ok' if ok else 'FAILED'}] {name}")
        print(
            f"burst sent in {burst_s:.2f} s; demo finished in {time.perf_counter() - started:.1f} s"
        )
        return 0 if all(checks.values()) else 1
    finally:
        stop.set()
        nudges.wake_all()
        if sched is not None:
            sched.shutdown(wait=True)
        for t in threads:
            t.join(timeout=10)
        sf.stop()
        hs.stop()
        slack.stop()
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(pgroot, ignore_errors=True)
