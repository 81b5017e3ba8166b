"""Scenario 5: a dispatcher paused (SIGSTOP) past its lease, then resumed.

Dispatcher A (`connector dispatch --lease-seconds 2`) claims every pending row and is frozen
while its first CRM request is in flight. Dispatcher B, started at once, cannot take the rows
before A's lease expires; then it re-claims and writes them all. When A resumes, its late
result is ignored (the finish checks the claim token): no outbox row changes, and A does not
go on writing the rest of a claim it no longer holds.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
from sqlalchemy import Engine, Row, text

from connector.routing.assign import Lead, Router
from connector.routing.teams import apply_teams
from testbed.processes import Forked, wait_or_kill
from testbed.waiting import wait_until
from tests.helpers.faults import (
    ROOT,
    Proc,
    TwoOrgs,
    assert_clean_logs,
    check_invariants,
    connector_env,
    lead_email,
    record_figures,
)

pytestmark = [pytest.mark.fault, pytest.mark.slow]

LEADS, LEASE_S = 300, 2.0

SNAPSHOT = text(
    "SELECT id, state, claimed_by, attempts, finished_at, last_error, lease_until "
    "FROM outbox ORDER BY id"
)


def _claimed(engine: Engine) -> Row[tuple[int, str | None, object]] | None:
    """(count, a claim token, its lease end) of the claimed outbox rows, or None."""
    with engine.connect() as conn:
        row = conn.execute(
            text(
                "SELECT count(*), min(claimed_by), max(lease_until) FROM outbox "
                "WHERE state = 'claimed'"
            )
        ).one()
    return row if row[0] else None


@pytest.mark.two_orgs(sf={"record_work_ms": 0.0}, poll=False, hubspot=False)
def test_paused_dispatcher_is_overtaken_and_its_late_result_ignored(
    engine: Engine, db_url: str, tmp_path: Path, two_orgs: TwoOrgs
) -> None:
    sf, intake, config_dir = two_orgs.sf, two_orgs.intake, two_orgs.config_dir
    cfg = two_orgs.configs["demo-sf"]
    apply_teams(engine, cfg)
    ids = [sf.add_record("Lead", owner_id=intake) for _ in range(LEADS)]
    Router(engine, cfg).assign_many(
        [Lead(i, {"Country": "US", "Email": lead_email(i)}) for i in ids], "api"
    )
    sf.set_latency(1.5)  # A's first request is in flight when it is frozen

    env = connector_env(db_url)
    lease = ["--lease-seconds", str(LEASE_S)]
    a = Proc(
        "dispatch-a",
        ["--config", str(config_dir), "dispatch", "--concurrency", "1", *lease],
        env,
        tmp_path,
    ).start()
    claimed = wait_until(lambda: _claimed(engine), 60, "dispatcher A's claim")
    assert claimed[0] == LEADS, (claimed, a.tail())
    token_a, lease_a = claimed[1], claimed[2]
    # A's first write request is at the CRM (held there by the latency)
    sf.writes.wait_for("A's first write request", lambda w: w.received > 0)
    a.signal(signal.SIGSTOP)
    paused_at = time.monotonic()
    sf.set_latency(0.0)

    b_log = tmp_path / "dispatch-b.log"
    once = ["--timeout", "30", *lease]
    b = Forked(
        ["--log-level", "INFO", "--config", str(config_dir), "dispatch", "--once", *once],
        env,
        b_log,
        ROOT,
    )
    wait_or_kill(b, 60)
    assert b.returncode == 0, b_log.read_text()[-2000:]
    with engine.connect() as conn:
        before = conn.execute(SNAPSHOT).all()
        first_finish = conn.execute(
            text("SELECT min(finished_at) FROM outbox WHERE state = 'sent'")
        ).scalar_one()
    assert all(r.state == "sent" and r.claimed_by != token_a for r in before)
    assert first_finish >= lease_a  # nothing was taken from A before its lease expired
    sf.writes.wait_for(  # A's frozen request answered
        "every write request answered", lambda w: len(w.attempts) >= w.received
    )
    writes_before_resume = len(sf.writes.attempts)

    a.signal(signal.SIGCONT)
    resumed_at = time.monotonic()
    a.wait_logged(b"after their lease expired", timeout=20)
    # A's claim held two requests (LEADS > one Salesforce request): after the late
    # result of the first, A must give the second up rather than write it; it logs that
    # once it has decided, so anything it wrongly wrote would be in sf.writes by now.
    a.wait_logged(b"unsent writes left to another dispatcher", timeout=20)
    code_a = a.stop()
    with engine.connect() as conn:
        after = conn.execute(SNAPSHOT).all()
    late_writes = len(sf.writes.attempts) - writes_before_resume
    inv = check_invariants(engine, sf, None)
    figures = {
        "leads": LEADS,
        "lease_s": LEASE_S,
        "paused_s": round(resumed_at - paused_at, 1),
        "rows_reclaimed": sum(r.attempts >= 2 for r in before),
        "outbox_rows_changed_by_late_result": sum(
            x != y for x, y in zip(before, after, strict=True)
        ),
        "crm_write_requests_after_resume": late_writes,
        **inv.figures(),
    }
    record_figures("sigstop", figures)
    assert before == after, figures
    assert late_writes == 0, figures
    assert inv.double_owners == 0 and inv.crm_mismatches == [] and inv.dead == 0
    assert code_a == 0
    assert_clean_logs([*a.logs, b_log])
