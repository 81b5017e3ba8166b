"""Scenario 10: a 10-second database outage under a running service writes a few dozen log
lines: one warning when the database goes away, a summary while it stays down, one line when
it is back (connector/core/outage.py), not one line (or traceback) per failed operation.

A `connector run` on a dedicated embedded server takes a trickle of signed HubSpot webhooks
(every 50 ms, before, during and after the outage) while its poll, inbox worker and
dispatchers run; the server is stopped (`pg_ctl stop -m immediate`) for 10 s and started
again. The lines the process logged from the stop until it had stored a delivery again are
counted, and the warnings and tracebacks until 10 more deliveries were stored.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from testbed.waiting import wait_until
from tests.helpers.faults import (
    DedicatedPostgres,
    TwoOrgs,
    assert_clean_logs,
    connector_env,
    dedicated_database,
    hubspot_events,
    post_hubspot,
    record_figures,
    service,
)

pytestmark = [
    pytest.mark.fault,
    pytest.mark.slow,
    pytest.mark.two_orgs(hs={"limit_per_10s": 1000}),
]

DOWN_S = 10.0
MAX_LINES = 40  # "a few dozen"
WENT_AWAY = "database unavailable"
CAME_BACK = "database is back"


def test_a_10_second_outage_writes_a_few_dozen_lines(
    dedicated_pg: DedicatedPostgres, tmp_path: Path, two_orgs: TwoOrgs
) -> None:
    db_url = dedicated_database(dedicated_pg, "outage")
    proc = service(
        "run", "run", two_orgs.config_dir, connector_env(db_url), tmp_path, "--dispatchers", "1"
    )
    statuses: Counter[int] = Counter()
    stop = threading.Event()

    def sender() -> None:  # a trickle of deliveries, one every 50 ms: the scenario's load
        with httpx.Client(timeout=5) as client:
            n = 0
            while not stop.is_set():
                rid = two_orgs.hs.add_record("contacts", properties={"country": "Canada"})
                url = f"{proc.url}/webhooks/hubspot/demo-hs"
                statuses[post_hubspot(client, url, hubspot_events([rid], 50_000 + n))] += 1
                n += 1
                stop.wait(0.05)

    thread = threading.Thread(target=sender)
    try:
        proc.start()
        proc.wait_healthy()
        thread.start()
        wait_until(lambda: statuses[200] >= 10, 30, "deliveries before the outage")
        log = proc.logs[-1]
        start = len(log.read_bytes())
        dedicated_pg.stop_immediate()
        stopped = time.monotonic()
        time.sleep(DOWN_S)  # not synchronisation: the outage's length is the scenario
        dedicated_pg.start()
        down_s = time.monotonic() - stopped
        acked = statuses[200]
        wait_until(lambda: statuses[200] > acked + 10, 60, "deliveries after the outage")
        proc.wait_logged(CAME_BACK.encode(), timeout=60)
        after = log.read_bytes()[start:].decode(errors="replace").splitlines()
        back = next(i for i, line in enumerate(after) if CAME_BACK in line)
        lines = after[: back + 1]  # the outage: from the stop to the line saying it is over
    finally:
        stop.set()
        if thread.is_alive():
            thread.join()
        code = proc.stop()
    figures = {
        "down_s": round(down_s, 1),
        "lines": len(lines),
        "tracebacks": sum(1 for line in after if line.startswith("Traceback")),
        "warnings_and_errors": sum(1 for line in after if " WARNING " in line or " ERROR " in line),
        "refused_deliveries": sum(n for s, n in statuses.items() if s != 200),
        "acked_deliveries": statuses[200],
    }
    record_figures("outage_logs", figures)
    assert code == 0
    assert figures["refused_deliveries"] > 0, figures  # the outage was felt
    assert len(lines) <= MAX_LINES, "\n".join(lines[:200])
    # ...and until 10 deliveries after it were stored: no traceback, no second outage
    assert figures["tracebacks"] == 0, "\n".join(after[:200])
    assert sum(WENT_AWAY in line for line in after) == 1, "\n".join(after[:200])
    assert sum(CAME_BACK in line for line in after) == 1, "\n".join(after[:200])
    assert_clean_logs(proc.logs)
