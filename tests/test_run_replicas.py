"""Three `connector run` processes against one database: the same guarantees as one.

Real processes, real HTTP, the embedded (or CI) PostgreSQL and both CRM sandboxes. Pushes are
spread over the three replicas, some Salesforce leads are only found by polling (which one
replica at a time may do), and every replica dispatches. Then SIGTERM: each exits 0.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from sqlalchemy import Engine, text

from connector.core.config_loading import load_configs
from connector.shell.demo import (
    Sent,
    crm_mismatches,
    send_hubspot,
    send_soap,
    wait_until_done,
)
from connector.shell.demo_world import ENV, hubspot_yaml, salesforce_yaml
from connector.shell.status import org_status
from crm_sandboxes import HubSpotSandbox, SalesforceSandbox
from testbed.waiting import wait_until
from tests.helpers.faults import fairness_violations
from tests.helpers.ports import free_port

pytestmark = pytest.mark.slow


@pytest.fixture
def sandboxes() -> Iterator[tuple[SalesforceSandbox, HubSpotSandbox]]:
    sf = SalesforceSandbox(lock_wait_s=10.0, record_work_ms=0.5).start()
    hs = HubSpotSandbox(limit_per_10s=100).start()
    yield sf, hs
    sf.stop()
    hs.stop()


def _wait_healthy(url: str, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    def healthy() -> bool:  # a readiness probe
        if proc.poll() is not None:
            raise AssertionError(f"replica exited early with {proc.returncode}")
        try:
            return probe.get(f"{url}/healthz").status_code == 200
        except httpx.HTTPError:
            return False

    with httpx.Client(timeout=2) as probe:  # one client: building one costs more than a probe
        wait_until(healthy, timeout, f"{url} to be healthy", interval=0.1)


def test_three_replicas_share_the_work_and_keep_the_guarantees(
    engine: Engine, db_url: str, tmp_path: Path, sandboxes: tuple[SalesforceSandbox, HubSpotSandbox]
) -> None:
    sf, hs = sandboxes
    reps = [sf.add_user(f"Rep {i}") for i in range(6)]
    intake = sf.add_user("Intake")
    owners = [hs.add_owner(f"Owner{i}") for i in range(4)]
    config_dir = tmp_path / "config"
    config_dir.mkdir()
    (config_dir / "sf.yaml").write_text(salesforce_yaml(sf, reps, intake))
    (config_dir / "hs.yaml").write_text(hubspot_yaml(hs, owners))
    configs = load_configs(config_dir, env=ENV)

    sf_ids = [
        sf.add_record("Lead", owner_id=intake, fields={"Country": c})
        for c in ["US", "DE", "CA", "FR"] * 75
    ]
    hs_ids = [
        hs.add_record("contacts", properties={"country": c}) for c in ["Canada", "Japan"] * 100
    ]
    env = {**os.environ, **ENV, "DATABASE_URL": db_url, "CONNECTOR_LOG_LEVEL": "WARNING"}
    ports = [free_port() for _ in range(3)]
    admin_ports = [free_port() for _ in range(3)]
    logs = [open(tmp_path / f"replica{i}.log", "wb") for i in range(3)]  # noqa: SIM115
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "connector.shell.cli",
                "--config",
                str(config_dir),
                "run",
                "--port",
                str(p),
                "--admin-port",
                str(admin_ports[i]),
            ],
            env=env,
            stdout=logs[i],
            stderr=subprocess.STDOUT,
        )
        for i, p in enumerate(ports)
    ]
    try:
        urls = [f"http://127.0.0.1:{p}" for p in ports]
        for admin, proc in zip(admin_ports, procs, strict=True):
            _wait_healthy(f"http://127.0.0.1:{admin}", proc)
        pushed = sf_ids[:240]
        sf_batches = [
            [
                (rid, {"Country": str(sf.get_record(rid)["Country"])})  # type: ignore[index]
                for rid in pushed[i : i + 4]
            ]
            for i in range(0, len(pushed), 4)
        ]
        hs_batches = [hs_ids[i : i + 8] for i in range(0, len(hs_ids), 8)]
        sent = Sent()
        lock = threading.Lock()
        counter = iter(range(10**6))
        with httpx.Client(timeout=30) as client, ThreadPoolExecutor(12) as pool:
            for rep in range(2):  # every delivery twice, to different replicas
                for n, batch in enumerate(sf_batches):
                    url = urls[(n + rep) % 3]
                    pool.submit(
                        send_soap,
                        client,
                        f"{url}/webhooks/salesforce/demo-sf/{ENV['DEMO_SF_OUTBOUND_SECRET']}",
                        batch,
                        sent,
                        n,
                    )
                for n, ids in enumerate(hs_batches):
                    url = urls[(n + rep) % 3]
                    with lock:
                        first = next(counter) * 100
                    pool.submit(
                        send_hubspot, client, f"{url}/webhooks/hubspot/demo-hs", ids, sent, first
                    )
        assert sent.errors == []
        assert wait_until_done(engine, len(sf_ids) + len(hs_ids), timeout=120)
        with engine.connect() as conn:
            sources = dict(
                conn.execute(text("SELECT source, count(*) FROM leads GROUP BY source")).all()
            )
            double = conn.execute(
                text(
                    "SELECT count(*) FROM (SELECT lead_id FROM assignments GROUP BY lead_id "
                    "HAVING count(*) > 1) x"
                )
            ).scalar_one()
        # pushes and the poll race for the Salesforce leads; whichever stores a lead first
        # wins and the other is a repeat. The 60 leads never pushed can only come by poll.
        assert sources.get("salesforce_outbound", 0) + sources["poll"] == 300
        assert sources["poll"] >= 60
        assert sources["hubspot_webhook"] == 200
        assert double == 0
        for org in ("demo-sf", "demo-hs"):
            status = org_status(engine, configs[org])
            assert status["outbox"] == {
                "pending": 0,
                "sent": status["leads"]["total"],
                "dead": 0,
                "superseded": 0,
            }
        # every active rep's turns (leads + credited passed-over turns) within one of its share
        assert fairness_violations(engine, configs) == []
        assert crm_mismatches(engine, sf, hs) == 0
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        codes = [proc.wait(timeout=60) for proc in procs]
        for f in logs:
            f.close()
    assert codes == [0, 0, 0], [(tmp_path / f"replica{i}.log").read_text() for i in range(3)]
