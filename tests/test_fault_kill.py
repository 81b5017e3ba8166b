"""Scenario 1: kill -9 of a random connector process every ~200 ms during a mixed burst.

Three `connector run` replicas (receiver + poll + dispatch) and one `connector dispatch`
share one database and both CRM sandboxes. SOAP Outbound Messages and signed HubSpot webhooks
(with repeats) go to random replicas and are retried until acknowledged, as the CRMs do; some
Salesforce leads are never pushed and only the poll finds them. Meanwhile a random process is
SIGKILLed every ~200 ms and restarted at once. After the kills stop and the backlog drains:
no acknowledged lead lost, no lead with two owners, every CRM owner equals the database
owner, fairness held, and the CRM saw few repeated writes (only what a killed dispatcher had
in flight: one request per dispatcher thread of the killed process).
"""

from __future__ import annotations

import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from sqlalchemy import Engine

from tests.helpers.faults import (
    SF_PATH,
    Delivery,
    Proc,
    SendLog,
    TwoOrgs,
    assert_clean_logs,
    check_invariants,
    connector_env,
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
    pytest.mark.two_orgs(
        sf={"lock_wait_s": 10.0, "record_work_ms": 0.2}, hs={"limit_per_10s": 1000}
    ),
]

SF_PUSHED, SF_POLL_ONLY, HS_LEADS = 5_000, 1_000, 4_000  # the 10,000 leads
BURST_S = 30.0  # the deliveries are spread over this, so the kills land throughout
KILL_EVERY_S = 0.2
MIN_KILL_PHASE_S = 6.0
MAX_KILL_PHASE_S = 15.0
MIN_KILLS = 20
LEASE_S = 2
SOAP_BATCH, HS_BATCH = 10, 16


def test_kill9_every_200ms_loses_nothing(
    engine: Engine, db_url: str, tmp_path: Path, two_orgs: TwoOrgs
) -> None:
    sf, hs, intake, config_dir = two_orgs.sf, two_orgs.hs, two_orgs.intake, two_orgs.config_dir
    configs = two_orgs.configs
    rng = random.Random(1)

    countries = ["US", "DE", "CA", "FR", "GB"]
    sf_ids = []
    for _ in range(SF_PUSHED + SF_POLL_ONLY):
        rid = sf.add_record("Lead", owner_id=intake, fields={"Country": rng.choice(countries)})
        sf_ids.append(rid)
    hs_ids = [
        hs.add_record(
            "contacts",
            properties={"country": rng.choice(["Canada", "Japan", "United States"])},
        )
        for _ in range(HS_LEADS)
    ]
    deliveries: list[Delivery] = []
    pushed = sf_ids[:SF_PUSHED]
    for n, i in enumerate(range(0, len(pushed), SOAP_BATCH)):
        ids = pushed[i : i + SOAP_BATCH]
        batch = [
            (rid, {"Country": str(sf.get_record(rid)["Country"]), "Email": lead_email(rid)})  # type: ignore[index]
            for rid in ids
        ]
        deliveries.append(Delivery("sf", SF_PATH, soap_body(batch, n), ids))
    for n, i in enumerate(range(0, len(hs_ids), HS_BATCH)):
        ids = hs_ids[i : i + HS_BATCH]
        body = hubspot_events(ids, 10_000 + n * HS_BATCH)
        deliveries.append(Delivery("hs", "/webhooks/hubspot/demo-hs", body, ids))
    deliveries += rng.sample(deliveries, len(deliveries) // 10)  # redeliveries
    rng.shuffle(deliveries)

    env = connector_env(db_url)
    lease = ["--lease-seconds", str(LEASE_S)]
    replicas = [
        service(f"run{i}", "run", config_dir, env, tmp_path, "--dispatchers", "1", *lease)
        for i in range(3)
    ]
    dispatcher = Proc(
        "dispatch",
        ["--config", str(config_dir), "dispatch", "--concurrency", "1", *lease],
        env,
        tmp_path,
    )
    procs: list[Proc] = [*replicas, dispatcher]
    for p in procs:
        p.start()
    for p in replicas:
        p.wait_healthy()

    urls = [p.url for p in replicas]
    sent = SendLog()
    kills = 0
    senders_done = threading.Event()
    stop_kills = threading.Event()

    def killer() -> None:
        nonlocal kills
        krng = random.Random(2)
        started = time.monotonic()
        while not stop_kills.is_set():
            elapsed = time.monotonic() - started
            # at least MIN_KILLS, however slowly a busy machine restarts the processes
            if kills >= MIN_KILLS and (
                elapsed >= MAX_KILL_PHASE_S
                or (senders_done.is_set() and elapsed >= MIN_KILL_PHASE_S)
            ):
                return
            # not synchronisation: the kill rhythm is the scenario
            time.sleep(KILL_EVERY_S * (0.75 + krng.random() / 2))
            victim = krng.choice(procs)
            if victim.alive():
                victim.kill9()
                kills += 1
            victim.start()

    t0 = time.monotonic()

    def paced(k: int) -> bool:  # the deliveries spread over BURST_S: the scenario's pace
        time.sleep(max(0.0, t0 + k * BURST_S / len(deliveries) - time.monotonic()))
        return True

    kill_thread = threading.Thread(target=killer, name="killer")
    kill_thread.start()
    try:
        deadline = time.monotonic() + 120
        with httpx.Client(timeout=10) as client, ThreadPoolExecutor(8) as pool:
            results = list(
                pool.map(
                    lambda k, d: paced(k) and deliver_until_acked(client, urls, d, sent, deadline),
                    range(len(deliveries)),
                    deliveries,
                )
            )
        send_s = time.monotonic() - t0
        senders_done.set()
        kill_thread.join(timeout=120)
    finally:
        stop_kills.set()
        kill_thread.join(timeout=30)
    kill_phase_s = time.monotonic() - t0
    for p in procs:
        if not p.alive():
            p.start()
    try:
        drain_s = wait_drained(engine, len(sf_ids) + len(hs_ids), timeout=120)
        for r in replicas:  # a SIGTERM before startup finished would be an unhandled one
            r.wait_healthy()
        dispatcher.wait_handles()
    finally:
        codes = {p.name: p.stop() for p in procs}

    inv = check_invariants(engine, sf, hs, acked=sent.acked)
    dup_records, repeat_requests = sf.writes.duplicates()
    hs_dup_records, hs_repeat_requests = hs.writes.duplicates()
    # in-flight CRM requests a killed process can leave unrecorded: one per dispatcher thread
    in_flight_per_process = 2
    figures = {
        "leads": len(sf_ids) + len(hs_ids),
        "deliveries": len(deliveries),
        "kills": kills,
        "restarts": sum(p.starts for p in procs) - len(procs),
        "send_s": round(send_s, 1),
        "kill_phase_s": round(kill_phase_s, 1),
        "drain_after_kills_s": None if drain_s is None else round(drain_s, 1),
        "sender_retries": sent.retries,
        **inv.figures(),
        "repeated_crm_write_requests": repeat_requests + hs_repeat_requests,
        "repeated_crm_record_writes": dup_records + hs_dup_records,
        "exit_codes": codes,
    }
    record_figures("kill9", figures)
    assert all(results), sent.gave_up[:5]
    assert drain_s is not None, figures
    assert inv.missing_acked == [], inv.missing_acked[:10]
    assert inv.leads == inv.assigned == len(sf_ids) + len(hs_ids), figures
    assert inv.double_owners == 0
    assert inv.dead == 0 and inv.open_outbox == 0
    assert inv.crm_mismatches == [], inv.crm_mismatches[:10]
    assert fairness_violations(engine, configs) == []
    assert kills >= MIN_KILLS, figures
    assert repeat_requests + hs_repeat_requests <= kills * in_flight_per_process, figures
    assert set(codes.values()) == {0}, codes
    assert_clean_logs([log for p in procs for log in p.logs])
