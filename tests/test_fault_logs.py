"""Scenario 9: the logs hold no email address and no secret.

Every subprocess of the fault suite logs at INFO to a file, and each scenario scans its own.
This module makes its own hostile run, the one whose failure paths log the most: a
`connector run` whose Salesforce credentials the CRM refuses and whose HubSpot token it
rejects, fed Outbound Messages full of email addresses, bad signatures and invalid leads,
then `connector ingest` of a file full of addresses and `connector dispatch --once` against
the refused credentials. It scans every log that run wrote, and fails when there is nothing
to scan: the logs must be non-empty and mention the ids of the leads they are about (ids are
what the connector logs instead of addresses). It does not depend on other modules or on the
order in which modules run.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from connector.routing.assign import Lead, Router
from connector.routing.teams import apply_teams
from connector.shell.store import make_engine
from testbed.pg import DatabaseFactory
from testbed.processes import Forked, wait_or_kill
from tests.helpers.faults import (
    ROOT,
    SECRETS,
    SF_PATH,
    assert_clean_logs,
    connector_env,
    hubspot_events,
    lead_email,
    open_two_orgs,
    post_hubspot,
    post_soap,
    record_figures,
    scan_logs,
    service,
    soap_body,
)

pytestmark = [pytest.mark.fault, pytest.mark.slow]

LEADS = 20


@dataclass
class HostileRun:
    service_log: Path  # the `connector run` that took the pushes
    logs: list[Path]  # every log the run wrote: the service's and the one-shot commands'
    notification_ids: list[str]  # of the Outbound Messages pushed: the receiver logs them


def _one_shot(args: list[str], env: dict[str, str], log: Path) -> int:
    """``connector ARGS`` forked from the fork server (testbed/processes.py), its output in
    ``log``; its exit status."""
    return wait_or_kill(Forked(["--log-level", "INFO", *args], env, log, ROOT), 120)


@pytest.fixture(scope="module")
def hostile_run(
    databases: DatabaseFactory, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[HostileRun]:
    db_url = databases.new()
    tmp = tmp_path_factory.mktemp("logs")
    engine = make_engine(db_url)
    try:
        with open_two_orgs(tmp) as orgs:
            sf, hs = orgs.sf, orgs.hs
            configs = orgs.configs
            ids = [
                sf.add_record("Lead", owner_id=orgs.intake, fields={"Email": lead_email(f"x{i}")})
                for i in range(LEADS)
            ]
            apply_teams(engine, configs["demo-sf"])
            Router(engine, configs["demo-sf"]).assign_many(
                [Lead(i, {"Country": "US", "Email": lead_email(i)}) for i in ids], "api"
            )
            sf.configure(client_secret="rotated-by-the-admin")  # our secret is now refused
            with hs._lock:
                hs._tokens.clear()  # our HubSpot token is revoked
            env = connector_env(db_url)
            p = service("hostile", "run", orgs.config_dir, env, tmp).start()
            try:
                p.wait_healthy()
                with httpx.Client(timeout=10) as client:
                    base = p.url
                    for n, rid in enumerate(ids):
                        fields = {"Country": "US", "Email": lead_email(rid), "Phone": "+1 555 0100"}
                        post_soap(client, f"{base}{SF_PATH}", soap_body([(rid, fields)], n))
                    bad_id = soap_body(
                        [("not-an-id@example.com", {"Email": "jane@example.org"})], 99
                    )
                    post_soap(client, f"{base}{SF_PATH}", bad_id)
                    post_hubspot(
                        client, f"{base}/webhooks/hubspot/demo-hs", hubspot_events(["101"], 1)
                    )
                    client.post(
                        f"{base}/webhooks/hubspot/demo-hs",
                        content=b'[{"email": "someone@example.net"}]',
                        headers={
                            "X-HubSpot-Signature-v3": "AAAA",
                            "X-HubSpot-Request-Timestamp": "1",
                        },
                    )
                # the dispatcher, the poll and the inbox fail against the CRMs and log it
                for failure in (
                    b"CRM refused our credentials",
                    b"poll failed",
                    b"CRM read for org demo-hs failed",
                ):
                    p.wait_logged(failure, timeout=60)
            finally:
                p.stop()

            # one-shot commands on the same failure paths, with addresses in their input
            ingested = [sf.add_record("Lead", owner_id=orgs.intake) for _ in range(5)]
            feed = tmp / "leads.jsonl"
            feed.write_text(
                "".join(
                    json.dumps({"Id": i, "Country": "US", "Email": lead_email(i)}) + "\n"
                    for i in ingested
                )
                + json.dumps({"Id": "bad@example.com", "Email": "bad@example.com"})
                + "\n"
            )
            cfg = ["--config", str(orgs.config_dir)]
            ingest_log, dispatch_log = tmp / "ingest.log", tmp / "dispatch.log"
            _one_shot(
                [*cfg, "ingest", "--no-verify", "--org", "demo-sf", str(feed)], env, ingest_log
            )
            _one_shot([*cfg, "dispatch", "--once", "--timeout", "5"], env, dispatch_log)
        notifications = [f"04l{n:010d}00AAA" for n in range(len(ids))]  # as soap_body numbers
        yield HostileRun(p.logs[-1], [*p.logs, ingest_log, dispatch_log], notifications)
    finally:
        engine.dispose()


def test_failure_paths_log_no_email_and_no_secret(hostile_run: HostileRun) -> None:
    log = hostile_run.service_log.read_text()
    # the failures were logged (not counting the start-up warning that autovacuum is off,
    # which the test server's settings give every service)
    failures = [
        line
        for line in log.splitlines()
        if (" ERROR " in line or " WARNING " in line) and "autovacuum" not in line
    ]
    assert "INFO" in log and failures
    missing = [i for i in hostile_run.notification_ids if i not in log]
    assert missing == [], missing  # it logged every delivery, by id
    found = scan_logs([hostile_run.service_log])
    record_figures("logs_hostile_run", {"log_bytes": len(log), "findings": len(found)})
    assert found == [], found[:10]
    # Each log written, non-empty, about the leads it handled (by id), and clean. (One test
    # with the one above: as two, xdist could give them to two workers, and each made the
    # whole hostile run.)
    logs = hostile_run.logs
    assert all(p.exists() and p.stat().st_size > 0 for p in logs), [
        (p.name, p.exists() and p.stat().st_size) for p in logs
    ]
    scanned = assert_clean_logs(logs, expect=hostile_run.notification_ids)
    record_figures("logs_whole_run", {"logs_scanned": len(logs), "bytes": scanned, "findings": 0})


def test_the_scan_finds_an_address_and_every_secret(tmp_path: Path) -> None:
    """The scan is not vacuous: a planted address and each secret are found."""
    planted = tmp_path / "planted.log"
    planted.write_text(
        "INFO routed lead 00Q000000000001AAA for jane.doe@prospect-mail.example\n"
        + "".join(f"DEBUG token={s}\n" for s in SECRETS)
    )
    found = scan_logs([planted])
    assert found[0] == "planted.log: email jane.doe@prospect-mail.example"
    assert len(found) == 1 + len(SECRETS), found
    with pytest.raises(AssertionError):
        assert_clean_logs([planted])
    empty = tmp_path / "empty.log"
    empty.write_text("")
    with pytest.raises(AssertionError, match="every log is empty"):
        assert_clean_logs([empty])
    with pytest.raises(AssertionError, match="no log to scan"):
        assert_clean_logs([])
    clean = tmp_path / "clean.log"
    clean.write_text("INFO routed lead 00Q000000000001AAA\n")
    assert assert_clean_logs([clean], expect=["00Q000000000001AAA"]) > 0
    with pytest.raises(AssertionError, match="ids the logs should mention"):
        assert_clean_logs([clean], expect=["00Q000000000002AAA"])
