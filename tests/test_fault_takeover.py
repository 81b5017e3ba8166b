"""Scenario 11: webhook events and owner writes held by a process killed with SIGKILL are
taken over by a living one within 15 s.

Two `connector serve` processes share one database. Process A stores 200 pushed HubSpot
events (one delivery) and claims them (B starts once A holds them all); the HubSpot sandbox
answers after 30 s, so A is still reading them back. The claims' lease is 10 s
(connector/core/leases.py): A's LeaseKeeper renews it while A works, so process B, running
beside it, takes none of them for longer than a lease. Then A is killed with SIGKILL (the
sandbox answers at once again), and the time until B has claimed every one of A's events is
measured: about one lease, plus B's next full claim.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
from sqlalchemy import Engine, text

from connector.routing.assign import Lead, Router
from connector.routing.teams import apply_teams
from testbed.waiting import wait_until
from tests.helpers.faults import (
    Proc,
    RecordingHubSpot,
    TwoOrgs,
    assert_clean_logs,
    connector_env,
    hubspot_events,
    post_hubspot,
    record_figures,
    service,
)

pytestmark = [
    pytest.mark.fault,
    pytest.mark.slow,
    pytest.mark.two_orgs(hs={"limit_per_10s": 1000}, poll=False),
]

EVENTS = 200
TAKEOVER_LIMIT_S = 15.0
CRM_SLOW_S = 30.0


def held_by(engine: Engine, pid: int) -> tuple[int, int]:
    """(events claimed by a worker of process ``pid``, events not done yet)."""
    with engine.connect() as conn:
        row = conn.execute(
            text(
                "SELECT count(*) FILTER (WHERE state = 'claimed' AND claimed_by LIKE :mine),"
                " count(*) FILTER (WHERE state NOT IN ('done', 'skipped'))"
                " FROM intake_events"
            ),
            {"mine": f"%:{pid}:%"},
        ).one()
    return int(row[0]), int(row[1])


def test_a_killed_process_events_are_taken_over_within_15_s(
    engine: Engine, db_url: str, tmp_path: Path, two_orgs: TwoOrgs
) -> None:
    env = connector_env(db_url)
    a = service("a", "serve", two_orgs.config_dir, env, tmp_path)
    b = service("b", "serve", two_orgs.config_dir, env, tmp_path)
    hs = two_orgs.hs
    try:
        a.start()
        a.wait_healthy()
        assert a.proc is not None
        ids = [hs.add_record("contacts", properties={"country": "Canada"}) for _ in range(EVENTS)]
        hs.set_latency(CRM_SLOW_S)  # A's read-back hangs while it holds the claims
        url = f"{a.url}/webhooks/hubspot/demo-hs"
        with httpx.Client(timeout=10) as client:  # one delivery: A's first claim takes all
            assert post_hubspot(client, url, hubspot_events(ids, 9_000)) == 200
        wait_until(
            lambda: held_by(engine, a.proc.pid)[0] == EVENTS,  # type: ignore[union-attr]
            30,
            "A to claim every event",
        )
        b.start()  # only now: B would otherwise claim some of the events itself
        b.wait_healthy()
        # Longer than a lease: A's keeper renews it, so B takes nothing of A's claim.
        time.sleep(12.0)  # not synchronisation: outliving the lease is the point
        renewed = held_by(engine, a.proc.pid)[0]
        a.kill9()
        killed = time.monotonic()
        hs.set_latency(0.0)
        wait_until(
            lambda: held_by(engine, a.proc.pid)[0] == 0,  # type: ignore[union-attr]
            120,
            "B to take over A's events",
            0.1,
        )
        takeover_s = time.monotonic() - killed
        wait_until(lambda: held_by(engine, -1)[1] == 0, 60, "every event to be routed", 0.1)
        drained_s = time.monotonic() - killed
    finally:
        hs.set_latency(0.0)
        codes = [p.stop() for p in (a, b)]
    figures = {
        "events": EVENTS,
        "held_after_12_s": renewed,
        "takeover_s": round(takeover_s, 1),
        "routed_after_kill_s": round(drained_s, 1),
    }
    record_figures("takeover", figures)
    assert renewed == EVENTS, figures  # the lease was renewed while A worked
    assert takeover_s <= TAKEOVER_LIMIT_S, figures
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM leads")).scalar_one() == EVENTS
    assert codes[1] == 0
    assert_clean_logs(b.logs)


def test_a_killed_dispatchers_owner_writes_are_taken_over_within_15_s(
    engine: Engine, db_url: str, tmp_path: Path, two_orgs: TwoOrgs
) -> None:
    """The same for outbox rows: dispatcher A holds a claim of 100 owner writes while the
    sandbox answers after 30 s, keeps it past a lease, and is killed; dispatcher B then
    writes them all."""
    cfg = two_orgs.configs["demo-hs"]
    apply_teams(engine, cfg)
    env = connector_env(db_url)
    args = ["--config", str(two_orgs.config_dir), "dispatch", "--org", "demo-hs"]
    a = Proc("da", [*args, "--concurrency", "1"], env, tmp_path)
    b = Proc("db", [*args, "--concurrency", "1"], env, tmp_path)
    hs = two_orgs.hs
    try:
        ids = [hs.add_record("contacts", properties={"country": "Canada"}) for _ in range(100)]
        hs.set_latency(CRM_SLOW_S)
        Router(engine, cfg).assign_many([Lead(i, {"country": "Canada"}) for i in ids], "import")
        a.start()
        wait_until(lambda: outbox_states(engine).get("claimed", 0) == 100, 60, "A's claim")
        b.start()
        b.wait_handles()
        time.sleep(12.0)  # not synchronisation: outliving the lease is the point
        renewed = outbox_states(engine).get("claimed", 0)
        a.kill9()
        killed = time.monotonic()
        hs.set_latency(0.0)
        wait_until(lambda: outbox_states(engine) == {"sent": 100}, 120, "B to write them", 0.1)
        takeover_s = time.monotonic() - killed
    finally:
        hs.set_latency(0.0)
        codes = [p.stop() for p in (a, b)]
    figures = {
        "rows": 100,
        "held_after_12_s": renewed,
        "written_after_kill_s": round(takeover_s, 1),
    }
    record_figures("takeover_outbox", figures)
    assert renewed == 100, figures  # A's keeper renewed the lease while its CRM call hung
    assert takeover_s <= TAKEOVER_LIMIT_S, figures
    assert {_owner(hs, i) for i in ids} <= set(two_orgs.owners)
    assert codes[1] == 0
    assert_clean_logs(b.logs)


def outbox_states(engine: Engine) -> dict[str, int]:
    with engine.connect() as conn:
        return dict(conn.execute(text("SELECT state, count(*) FROM outbox GROUP BY state")).all())


def _owner(hs: RecordingHubSpot, rid: str) -> str | None:
    rec = hs.get_record(rid)
    return None if rec is None else rec["properties"].get("hubspot_owner_id")
