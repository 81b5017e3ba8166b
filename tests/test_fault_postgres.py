"""Scenario 2: PostgreSQL stopped immediately (`pg_ctl stop -m immediate`, then started again)
at one third and at one half of a run.

Always on a dedicated embedded server in a temp dir (even when TEST_DATABASE_URL is set: the
suite must not crash a shared server). Two `connector run` replicas take a paced mixed burst
(SOAP, HubSpot webhooks, poll-only leads); the senders retry refused deliveries as the CRMs
do. Checked: the same invariants as the kill test, the replicas never exit and are healthy
again within 30 s of each restart, and every delivery refused meanwhile succeeded on retry.
"""

from __future__ import annotations

import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from connector.core.database import create_engine
from connector.shell.store import sqlalchemy_url
from tests.helpers.faults import (
    PROBE,
    SF_PATH,
    DedicatedPostgres,
    Delivery,
    SendLog,
    TwoOrgs,
    assert_clean_logs,
    check_invariants,
    connector_env,
    dedicated_database,
    deliver_until_acked,
    fairness_violations,
    hubspot_events,
    lead_email,
    record_figures,
    service,
    soap_body,
    wait_drained,
)

pytestmark = [
    pytest.mark.fault,
    pytest.mark.slow,
    pytest.mark.two_orgs(sf={"record_work_ms": 0.2}, hs={"limit_per_10s": 1000}),
]

SF_PUSHED, SF_POLL_ONLY, HS_LEADS = 600, 100, 400
RUN_S = 12.0  # the burst is paced over this; Postgres is stopped at 1/3 and at 1/2 of it
DOWN_S = 1.0
RECONNECT_LIMIT_S = 30.0


def test_postgres_crash_at_one_third_and_one_half(
    dedicated_pg: DedicatedPostgres, tmp_path: Path, two_orgs: TwoOrgs
) -> None:
    db_url = dedicated_database(dedicated_pg, "fault_pg")
    # the test's own checks reconnect quietly after a crash (the connector's engines do not
    # ping: they must cope on their own)
    engine = create_engine(sqlalchemy_url(db_url), pool_pre_ping=True)

    sf, hs, intake, config_dir = two_orgs.sf, two_orgs.hs, two_orgs.intake, two_orgs.config_dir
    configs = two_orgs.configs
    procs = []
    try:
        rng = random.Random(2)
        sf_ids = [
            sf.add_record("Lead", owner_id=intake, fields={"Country": rng.choice(["US", "FR"])})
            for _ in range(SF_PUSHED + SF_POLL_ONLY)
        ]
        hs_ids = [
            hs.add_record("contacts", properties={"country": rng.choice(["Canada", "Japan"])})
            for _ in range(HS_LEADS)
        ]
        deliveries: list[Delivery] = []
        for n, i in enumerate(range(0, SF_PUSHED, 5)):
            ids = sf_ids[i : i + 5]
            batch = [
                (r, {"Country": str(sf.get_record(r)["Country"]), "Email": lead_email(r)})  # type: ignore[index]
                for r in ids
            ]
            deliveries.append(Delivery("sf", SF_PATH, soap_body(batch, n), ids))
        for n, i in enumerate(range(0, HS_LEADS, 8)):
            ids = hs_ids[i : i + 8]
            deliveries.append(
                Delivery("hs", "/webhooks/hubspot/demo-hs", hubspot_events(ids, 7_000 + n * 8), ids)
            )
        rng.shuffle(deliveries)

        env = connector_env(db_url)
        procs = [
            service(
                f"run{i}",
                "run",
                config_dir,
                env,
                tmp_path,
                "--dispatchers",
                "1",
                "--lease-seconds",
                "3",
            )
            for i in range(2)
        ]
        for p in procs:
            p.start()
        for p in procs:
            p.wait_healthy()
        urls = [p.url for p in procs]
        sent = SendLog()
        crashes: list[dict[str, Any]] = []
        t0 = time.monotonic()

        def crash_at(fraction: float) -> None:
            # not synchronisation: when the crash lands and how long Postgres stays down
            # are the scenario
            time.sleep(max(0.0, t0 + RUN_S * fraction - time.monotonic()))
            dedicated_pg.stop_immediate()
            stopped = time.monotonic()
            time.sleep(DOWN_S)
            dedicated_pg.start()
            started = time.monotonic()
            healthy: list[float] = []
            for p in procs:
                deadline = started + RECONNECT_LIMIT_S
                while time.monotonic() < deadline:
                    try:
                        if PROBE.get(f"{p.admin_url}/healthz").status_code == 200:
                            break
                    except httpx.HTTPError:
                        pass
                    time.sleep(0.05)  # a readiness probe, polled up to the deadline
                healthy.append(time.monotonic() - started)
            crashes.append(
                {
                    "at": fraction,
                    "down_s": round(started - stopped, 1),
                    "reconnected_s": round(max(healthy), 1),
                }
            )

        def crasher() -> None:
            crash_at(1 / 3)
            crash_at(1 / 2)

        def paced(k: int) -> bool:  # the burst spread over RUN_S: the scenario's pace
            time.sleep(max(0.0, t0 + k * RUN_S / len(deliveries) - time.monotonic()))
            return True

        crash_thread = threading.Thread(target=crasher)
        crash_thread.start()
        deadline = time.monotonic() + 120
        with httpx.Client(timeout=10) as client, ThreadPoolExecutor(8) as pool:
            results = list(
                pool.map(
                    lambda k, d: paced(k) and deliver_until_acked(client, urls, d, sent, deadline),
                    range(len(deliveries)),
                    deliveries,
                )
            )
        crash_thread.join()
        drain_s = wait_drained(engine, len(sf_ids) + len(hs_ids), timeout=90)
        alive = [p.alive() for p in procs]
        codes = [p.stop() for p in procs]
        inv = check_invariants(engine, sf, hs, acked=sent.acked)
        refused = sum(n for status, n in sent.statuses.items() if not 200 <= status < 300)
        figures = {
            "leads": len(sf_ids) + len(hs_ids),
            "deliveries": len(deliveries),
            "crashes": crashes,
            "refused_deliveries_retried": refused,
            "refusal_statuses": {str(k): v for k, v in sent.statuses.items() if not 200 <= k < 300},
            "drain_s": None if drain_s is None else round(drain_s, 1),
            **inv.figures(),
            "repeated_crm_record_writes": sf.writes.duplicates()[0] + hs.writes.duplicates()[0],
        }
        record_figures("postgres_restart", figures)
        assert len(crashes) == 2
        assert all(c["reconnected_s"] < RECONNECT_LIMIT_S for c in crashes), figures
        assert alive == [True, True] and codes == [0, 0], figures
        assert all(results), sent.gave_up[:5]
        assert refused > 0, figures  # the crashes were felt, and the retries then succeeded
        assert drain_s is not None, figures
        assert inv.missing_acked == [] and inv.double_owners == 0, figures
        assert inv.leads == inv.assigned == len(sf_ids) + len(hs_ids), figures
        assert inv.dead == 0 and inv.crm_mismatches == [], figures
        assert fairness_violations(engine, configs) == []
        assert_clean_logs([log for p in procs for log in p.logs])
    finally:
        for p in procs:
            p.stop()
        engine.dispose()
