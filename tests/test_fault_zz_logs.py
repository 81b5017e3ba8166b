"""Scenario 9: the logs hold no email address and no secret.

Every subprocess of the fault suite logs at INFO to a file, and each scenario scans its own.
This module adds a hostile run whose failure paths log the most: a `connector run` whose
Salesforce credentials the CRM refuses and whose HubSpot token it rejects, fed Outbound
Messages full of email addresses, bad signatures and invalid leads. Then (named zz to run
last) it scans every log the suite wrote in this session.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
from sqlalchemy import Engine

from connector.routing.assign import Lead, Router
from connector.routing.teams import apply_teams
from connector.shell.demo import hubspot_yaml, salesforce_yaml
from tests.fault_helpers import (
    SCANNED_LOGS,
    SF_PATH,
    RecordingHubSpot,
    RecordingSalesforce,
    connector_env,
    hubspot_events,
    lead_email,
    post_hubspot,
    post_soap,
    record_figures,
    scan_logs,
    service,
    soap_body,
)

pytestmark = [pytest.mark.fault, pytest.mark.slow]


def test_failure_paths_log_no_email_and_no_secret(
    engine: Engine, db_url: str, tmp_path: Path
) -> None:
    from connector.core.config import load_configs
    from connector.shell.demo import ENV

    sf = RecordingSalesforce().start()
    hs = RecordingHubSpot().start()
    try:
        reps = [sf.add_user(f"Rep {i}") for i in range(6)]
        intake = sf.add_user("Intake")
        owners = [hs.add_owner(f"Owner{i}") for i in range(4)]
        config_dir = tmp_path / "config"
        config_dir.mkdir()
        (config_dir / "sf.yaml").write_text(salesforce_yaml(sf, reps, intake))
        (config_dir / "hs.yaml").write_text(hubspot_yaml(hs, owners))
        configs = load_configs(config_dir, env=ENV)
        ids = [
            sf.add_record("Lead", owner_id=intake, fields={"Email": lead_email(f"x{i}")})
            for i in range(20)
        ]
        apply_teams(engine, configs["demo-sf"])
        Router(engine, configs["demo-sf"]).assign_many(
            [Lead(i, {"Country": "US", "Email": lead_email(i)}) for i in ids], "api"
        )
        sf.configure(client_secret="rotated-by-the-admin")  # our secret is now refused
        with hs._lock:
            hs._tokens.clear()  # our HubSpot token is revoked
        p = service("hostile", "run", config_dir, connector_env(db_url), tmp_path).start()
        try:
            p.wait_healthy()
            with httpx.Client(timeout=10) as client:
                base = p.url
                for n, rid in enumerate(ids):
                    fields = {"Country": "US", "Email": lead_email(rid), "Phone": "+1 555 0100"}
                    post_soap(client, f"{base}{SF_PATH}", soap_body([(rid, fields)], n))
                bad_id = soap_body([("not-an-id@example.com", {"Email": "jane@example.org"})], 99)
                post_soap(client, f"{base}{SF_PATH}", bad_id)
                post_hubspot(client, f"{base}/webhooks/hubspot/demo-hs", hubspot_events(["101"], 1))
                client.post(
                    f"{base}/webhooks/hubspot/demo-hs",
                    content=b'[{"email": "someone@example.net"}]',
                    headers={"X-HubSpot-Signature-v3": "AAAA", "X-HubSpot-Request-Timestamp": "1"},
                )
            time.sleep(4)  # dispatch and inbox rounds fail against the CRMs and log it
        finally:
            p.stop()
        log = p.logs[-1].read_text()
        assert "INFO" in log and ("ERROR" in log or "WARNING" in log)  # the failures were logged
        found = scan_logs(p.logs)
        record_figures("logs_hostile_run", {"log_bytes": len(log), "findings": len(found)})
        assert found == [], found[:10]
    finally:
        sf.stop()
        hs.stop()


def test_no_log_of_the_whole_suite_has_an_email_or_a_secret() -> None:
    logs = [p for p in SCANNED_LOGS if p.exists()]
    found = scan_logs(logs)
    record_figures(
        "logs_whole_suite",
        {
            "logs_scanned": len(logs),
            "bytes": sum(p.stat().st_size for p in logs),
            "findings": len(found),
        },
    )
    assert found == [], found[:10]
