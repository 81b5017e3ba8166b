"""Scenario 4: the CRMs misbehave while owners are being written back.

One `connector dispatch` process writes to both sandboxes through simple-salesforce and
hubspot-api-client while each CRM in turn: is down (every write answered 503) for a while,
answers a storm of 429s with Retry-After, takes 2 s per request, and resets connections. A wave
of new leads arrives at the start of each phase. Afterwards: no owner write lost (nothing dead,
every CRM owner equals the database owner), no record retried before the Retry-After it was
given, and during the outage no row was scheduled to wait longer than max(its age, 0.5 s) (the
dispatcher's rule, so that after an outage of T every row is retried within about T; the drain
time after the outage is recorded as a figure, not asserted: it depends on the machine's load).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from connector.core.config import OrgConfig
from connector.routing.assign import Lead, Router
from connector.routing.teams import apply_teams
from tests.helpers.faults import (
    Proc,
    RecordingHubSpot,
    RecordingSalesforce,
    TwoOrgs,
    check_invariants,
    connector_env,
    lead_email,
    record_figures,
    scan_logs,
)

pytestmark = [
    pytest.mark.fault,
    pytest.mark.slow,
    pytest.mark.two_orgs(sf={"record_work_ms": 0.0}, hs={"limit_per_10s": 1000}),
]

WAVE = 150  # leads per org per phase
OUTAGE_S = 5.0
RETRY_AFTER_S = 2
TOLERANCE_S = 0.05


def _open(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                text("SELECT count(*) FROM outbox WHERE state IN ('pending', 'claimed')")
            ).scalar_one()
        )


def _scheduled_past_their_age(engine: Engine) -> list[int]:
    """Pending rows retried later than their age allows: a retry delay without Retry-After is
    at most max(the row's age, backoff_base = 0.5 s), so at any moment a row's available_at
    is at most now + max(now - created_at, 0.5 s); 0.2 s of slack on top."""
    with engine.connect() as conn:
        return [
            int(r[0])
            for r in conn.execute(
                text(
                    "SELECT id FROM outbox WHERE state = 'pending' AND attempts > 0 "
                    "AND available_at > now() + greatest(now() - created_at, "
                    "interval '0.5 seconds') + interval '0.2 seconds'"
                )
            )
        ]


def _wait_open_zero(engine: Engine, timeout: float) -> float | None:
    """Seconds until no outbox row is open (polling the database), None at the deadline."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if _open(engine) == 0:
            return time.monotonic() - t0
        time.sleep(0.1)
    return None


def _retry_after_violations(sb: RecordingSalesforce | RecordingHubSpot) -> list[str]:
    """Records written again sooner than the Retry-After their last refusal carried."""
    bad: list[str] = []
    not_before: dict[str, tuple[float, float]] = {}
    with sb.writes.lock:
        attempts = list(sb.writes.attempts)
    for t, _, ids, status, headers in attempts:
        for rid in ids:
            if rid in not_before and t < not_before[rid][0] - TOLERANCE_S:
                bad.append(f"{rid} retried {not_before[rid][0] - t:.2f} s early")
        ra = {k.lower(): v for k, v in headers.items()}.get("retry-after")
        if ra is not None and status >= 400:
            for rid in ids:
                not_before[rid] = (t + float(ra), float(ra))
    return bad


@pytest.mark.two_orgs(sf={"record_work_ms": 0.0}, hs={"limit_per_10s": 1000}, poll=False)
def test_crm_outage_429_storm_latency_and_resets(
    engine: Engine, db_url: str, tmp_path: Path, two_orgs: TwoOrgs
) -> None:
    sf, hs, intake, config_dir = two_orgs.sf, two_orgs.hs, two_orgs.intake, two_orgs.config_dir
    configs = two_orgs.configs
    for cfg in configs.values():
        apply_teams(engine, cfg)

    def wave(cfg: OrgConfig) -> None:
        if cfg.crm.kind == "salesforce":
            ids = [sf.add_record("Lead", owner_id=intake) for _ in range(WAVE)]
            leads = [Lead(i, {"Country": "US", "Email": lead_email(i)}) for i in ids]
        else:
            ids = [hs.add_record("contacts") for _ in range(WAVE)]
            leads = [Lead(i, {"country": "Japan"}) for i in ids]
        Router(engine, cfg).assign_many(leads, "api")

    def both_waves() -> None:
        for cfg in configs.values():
            wave(cfg)

    proc = Proc(
        "dispatch",
        ["--config", str(config_dir), "dispatch", "--concurrency", "2", "--lease-seconds", "30"],
        connector_env(db_url),
        tmp_path,
    ).start()
    figures: dict[str, object] = {}
    try:
        # 1. outage: every write answered 503 (no Retry-After) for OUTAGE_S
        sf.writes.outage(OUTAGE_S)
        hs.writes.outage(OUTAGE_S)
        outage_started = time.monotonic()
        both_waves()
        # not synchronisation: the CRM is down for OUTAGE_S (the scenario), and meanwhile the
        # rows' retry times are checked every 0.1 s; the drain time is measured from its end
        late: set[int] = set()
        while time.monotonic() < outage_started + OUTAGE_S:
            late.update(_scheduled_past_their_age(engine))
            time.sleep(0.1)
        late.update(_scheduled_past_their_age(engine))
        figures["rows_scheduled_past_their_age"] = len(late)
        drain = _wait_open_zero(engine, timeout=4 * OUTAGE_S)
        figures["outage_s"] = OUTAGE_S
        figures["outage_503_replies"] = sf.writes.outage_replies + hs.writes.outage_replies
        figures["outage_backlog_drained_after_s"] = None if drain is None else round(drain, 1)

        # 2. 429 storm with Retry-After (and Salesforce 503s with Retry-After)
        hs.inject_failures(
            8,
            429,
            body={
                "status": "error",
                "message": "You have reached your ten_secondly_rolling limit.",
                "errorType": "RATE_LIMIT",
                "policyName": "TEN_SECONDLY_ROLLING",
            },
            headers={"Retry-After": str(RETRY_AFTER_S)},
            path_contains="batch/update",
        )
        sf.inject_failures(
            6, 503, headers={"Retry-After": str(RETRY_AFTER_S)}, path_contains="composite"
        )
        t = time.monotonic()
        both_waves()
        drain = _wait_open_zero(engine, timeout=60)
        figures["storm_drained_s"] = None if drain is None else round(drain, 1)
        assert drain is not None, figures

        # 3. 2-second latency on every call
        sf.set_latency(2.0)
        hs.set_latency(2.0)
        t = time.monotonic()
        both_waves()
        drain = _wait_open_zero(engine, timeout=60)
        figures["latency_2s_drained_s"] = None if drain is None else round(drain, 1)
        sf.set_latency(0.0)
        hs.set_latency(0.0)
        assert drain is not None, figures

        # 4. connection resets: requests read, then the socket closed unanswered
        sf.drop_connections(5)
        hs.drop_connections(5)
        t = time.monotonic()
        both_waves()
        drain = _wait_open_zero(engine, timeout=60)
        figures["resets_drained_s"] = None if drain is None else round(drain, 1)
        del t
    finally:
        code = proc.stop()
    inv = check_invariants(engine, sf, hs)
    violations = _retry_after_violations(sf) + _retry_after_violations(hs)
    counters = {"sf": sf.counters(), "hs": hs.counters()}
    figures.update(
        {
            "leads": 8 * WAVE,
            **inv.figures(),
            "retry_after_violations": len(violations),
            "injected_replies": counters["sf"].get("injected", 0)
            + counters["hs"].get("injected", 0),
            "dropped_connections": counters["sf"].get("dropped", 0)
            + counters["hs"].get("dropped", 0),
        }
    )
    record_figures("crm_faults", figures)
    assert inv.leads == inv.assigned == 8 * WAVE
    assert inv.dead == 0 and inv.open_outbox == 0, figures
    assert inv.crm_mismatches == [] and inv.double_owners == 0, figures
    assert violations == [], violations[:10]
    assert figures["outage_backlog_drained_after_s"] is not None, figures
    assert figures["rows_scheduled_past_their_age"] == 0, figures
    assert code == 0
    # a dispatcher whose writes all end well may log nothing at INFO: only the scan applies
    assert scan_logs(proc.logs) == []


def test_a_long_outage_dead_letters_no_owner_write(engine: Engine, two_orgs: TwoOrgs) -> None:
    """A CRM down for "long" (here 3 s with the backoff scaled down 50x: like 150 s with the
    defaults) is not the records' fault: every write waits it out, none is dead-lettered."""
    import threading

    from connector.shell.adapters import adapter_for
    from connector.writeback.dispatch import Dispatcher

    sf, hs, intake, configs = two_orgs.sf, two_orgs.hs, two_orgs.intake, two_orgs.configs
    sf_ids = [sf.add_record("Lead", owner_id=intake, fields={"Country": "x"}) for _ in range(200)]
    hs_ids = [hs.add_record("contacts") for _ in range(200)]
    for cfg, ids, field in (
        (configs["demo-sf"], sf_ids, "Country"),
        (configs["demo-hs"], hs_ids, "country"),
    ):
        apply_teams(engine, cfg)
        Router(engine, cfg).assign_many([Lead(i, {field: "x"}) for i in ids], "api")
    outage = 3.0
    sf.writes.outage(outage)
    hs.writes.outage(outage)
    stop = threading.Event()
    threads = [
        threading.Thread(
            target=Dispatcher(
                engine,
                org,
                adapter_for(cfg),
                backoff_base=0.01,
                backoff_cap=0.3,
                intake_owner_ids=cfg.intake_owner_ids,
            ).run_forever,
            args=(stop,),
            kwargs={"poll_interval": 0.02},
        )
        for org, cfg in configs.items()
        for _ in range(2)
    ]
    for t in threads:
        t.start()
    try:
        time.sleep(outage)  # not synchronisation: the CRM is down this long (the scenario)
        drain = _wait_open_zero(engine, timeout=30)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30)
    with engine.connect() as conn:
        max_attempts = conn.execute(text("SELECT max(attempts) FROM outbox")).scalar_one()
    inv = check_invariants(engine, sf, hs)
    figures = {
        "leads": 400,
        "outage_s": outage,
        "backoff_base_s": 0.01,
        "max_attempts_of_a_row": max_attempts,
        "refused_requests": sf.writes.outage_replies + hs.writes.outage_replies,
        "drained_after_s": None if drain is None else round(drain, 1),
        **inv.figures(),
    }
    record_figures("crm_long_outage", figures)
    assert inv.dead == 0, figures
    assert drain is not None and inv.open_outbox == 0, figures
    assert inv.crm_mismatches == [], figures
