"""Scenario 3: 1,000 events, each delivered 5 times over 50 concurrent connections, then late
redeliveries after everything was routed: exactly 1,000 leads, every delivery answered 2xx.

Two `connector serve` replicas (the receiver, with the inbox worker that reads every pushed
record back from the sandbox before routing it) share one database; half the events are
Salesforce Outbound Messages, half signed HubSpot webhooks, and each copy goes to a random
replica.
"""

from __future__ import annotations

import random
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from sqlalchemy import Engine, text

from tests.helpers.faults import (
    SF_PATH,
    TwoOrgs,
    assert_clean_logs,
    connector_env,
    hubspot_events,
    lead_email,
    post_hubspot,
    post_soap,
    record_figures,
    service,
    soap_body,
    wait_drained,
)

pytestmark = [pytest.mark.fault, pytest.mark.slow]

EVENTS, COPIES, CONNECTIONS, LATE = 1_000, 5, 50, 200


# poll=False: only the pushes may create leads here
@pytest.mark.two_orgs(sf={"record_work_ms": 0.0}, hs={"limit_per_10s": 1000}, poll=False)
def test_every_event_five_times_gives_exactly_one_lead_each(
    engine: Engine, db_url: str, tmp_path: Path, two_orgs: TwoOrgs
) -> None:
    rng = random.Random(3)
    sf, hs, intake, config_dir = two_orgs.sf, two_orgs.hs, two_orgs.intake, two_orgs.config_dir
    sf_ids = [
        sf.add_record("Lead", owner_id=intake, fields={"Country": rng.choice(["US", "DE"])})
        for _ in range(EVENTS // 2)
    ]
    hs_ids = [
        hs.add_record("contacts", properties={"country": rng.choice(["Canada", "Japan"])})
        for _ in range(EVENTS - len(sf_ids))
    ]
    events: list[tuple[str, str, bytes]] = []
    for n, rid in enumerate(sf_ids):
        fields = {"Country": str(sf.get_record(rid)["Country"]), "Email": lead_email(rid)}  # type: ignore[index]
        events.append(("sf", SF_PATH, soap_body([(rid, fields)], n)))
    for n, rid in enumerate(hs_ids):
        events.append(("hs", "/webhooks/hubspot/demo-hs", hubspot_events([rid], 50_000 + n)))

    env = connector_env(db_url)
    replicas = [service(f"serve{i}", "serve", config_dir, env, tmp_path) for i in range(2)]
    for p in replicas:
        p.start()
    for p in replicas:
        p.wait_healthy()
    urls = [p.url for p in replicas]
    statuses: Counter[int] = Counter()

    def send(item: tuple[str, str, bytes]) -> int:
        kind, path, body = item
        url = rng.choice(urls) + path
        return post_soap(client, url, body) if kind == "sf" else post_hubspot(client, url, body)

    jobs = events * COPIES
    rng.shuffle(jobs)
    # Idle connections expire on our side before the receiver's 5-s keep-alive closes them,
    # so a request never races the server's close on a reused connection.
    limits = httpx.Limits(
        max_connections=CONNECTIONS, max_keepalive_connections=CONNECTIONS, keepalive_expiry=2.0
    )
    try:
        with (
            httpx.Client(timeout=30, limits=limits) as client,
            ThreadPoolExecutor(CONNECTIONS) as pool,
        ):
            statuses.update(pool.map(send, jobs))
            drain_s = wait_drained(engine, EVENTS, timeout=60, outbox=False)
            late = rng.sample(events, LATE)  # Salesforce retries for 24 h; HubSpot too
            statuses.update(pool.map(send, late))
            wait_drained(engine, EVENTS, timeout=30, outbox=False)
    finally:
        codes = [p.stop() for p in replicas]
    with engine.connect() as conn:
        leads, assignments, outbox, inbox = conn.execute(
            text(
                "SELECT (SELECT count(*) FROM leads), (SELECT count(*) FROM assignments), "
                "(SELECT count(*) FROM outbox), (SELECT count(*) FROM intake_events)"
            )
        ).one()
    figures = {
        "events": EVENTS,
        "deliveries": len(jobs) + LATE,
        "connections": CONNECTIONS,
        "statuses": dict(statuses),
        "leads": leads,
        "assignments": assignments,
        "outbox_rows": outbox,
        "inbox_rows": inbox,
        "drain_s": None if drain_s is None else round(drain_s, 1),
    }
    record_figures("redelivery", figures)
    assert set(statuses) == {200}, figures
    assert drain_s is not None, figures
    assert leads == assignments == outbox == EVENTS, figures
    # One row per distinct event: (portal, event, object) or (notification, record).
    assert inbox == EVENTS, figures
    assert codes == [0, 0]
    assert_clean_logs([log for p in replicas for log in p.logs])
