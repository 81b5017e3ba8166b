"""Scenario 8: fuzzing the running receiver over HTTP (Hypothesis).

`connector serve` runs as a subprocess; random bodies and headers are posted to the Salesforce
and HubSpot endpoints: raw bytes, mangled Outbound Messages, XML with DTDs and entities,
random JSON signed with the right secret (so it reaches the event parser), bad signatures and
timestamps, odd content types, unknown orgs. Every answer must be a clean 4xx (a SOAP fault
or a JSON error with a code), never a 5xx, and a refused request stores nothing. (An input
that is still a valid delivery, e.g. a no-op mutation, is accepted and stored, as it must be.)
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, text

from connector.intake.signatures import sign_v3
from connector.intake.soap import build_outbound_message
from connector.shell.demo_world import ENV, SF_ORG_ID
from connector.shell.store import make_engine
from testbed.pg import DatabaseFactory
from testbed.waiting import wait_until
from tests.helpers.faults import (
    Proc,
    assert_clean_logs,
    connector_env,
    open_two_orgs,
    record_figures,
    service,
)

pytestmark = [pytest.mark.fault, pytest.mark.slow]

EXAMPLES = 250
FIGURES: Counter[str] = Counter()

_VALID_SOAP = build_outbound_message(
    SF_ORG_ID,
    [("04l000000000001AAA", "Lead", {"Id": "00Q000000000001AAA", "Country": "US"})],
)
_WRONG_ORG_SOAP = _VALID_SOAP.replace(SF_ORG_ID.encode(), b"00D000000000009ZZZ")
_DTD = (
    b'<?xml version="1.0"?><!DOCTYPE x [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;">]>'
    b"<x>&b;</x>"
)
_XXE = b'<?xml version="1.0"?><!DOCTYPE x [<!ENTITY e SYSTEM "file:///etc/passwd">]><x>&e;</x>'


@pytest.fixture(scope="module")
def running(
    databases: DatabaseFactory, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Proc, Engine, httpx.Client]]:
    """`connector serve` on a fresh database, and one HTTP client for every example (a client
    per request loads the CA bundle each time: 0.04-0.6 s of CPU on the shared machine).
    At the end it records how this process's fuzzed requests were answered: here, not in a
    test of its own, which xdist could hand to another worker, which then started all this
    to record nothing."""
    db_url = databases.new()
    tmp = tmp_path_factory.mktemp("fuzz")
    with open_two_orgs(tmp) as orgs:
        p = service("serve", "serve", orgs.config_dir, connector_env(db_url), tmp).start()
        engine = make_engine(db_url)
        try:
            p.wait_healthy()
            with httpx.Client(timeout=30) as client:
                yield p, engine, client
        finally:
            code = p.stop()
            engine.dispose()
    assert code == 0
    assert_clean_logs(p.logs)
    record_figures(
        "http_fuzz",
        {"requests": sum(FIGURES.values()), "answers": dict(sorted(FIGURES.items()))},
    )
    assert not any(k.endswith(tuple(f"_{s}" for s in range(500, 600))) for k in FIGURES)


def _assert_clean(r: httpx.Response, kind: str) -> None:
    FIGURES[f"{kind}_{r.status_code}"] += 1
    assert r.status_code < 500, (r.status_code, r.content[:300])
    if r.status_code >= 400:
        if kind == "sf":  # a SOAP fault, so Salesforce logs the reason
            assert b"<soapenv:Fault>" in r.content, (r.status_code, r.content[:300])
        else:
            assert "error" in r.json(), (r.status_code, r.content[:300])


def _count(engine: Engine, sql: str) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text(sql)).scalar_one())


def _stored(engine: Engine) -> int:
    return _count(
        engine, "SELECT (SELECT count(*) FROM leads) + (SELECT count(*) FROM intake_events)"
    )


def _in_flight(engine: Engine) -> int:
    return _count(
        engine, "SELECT count(*) FROM intake_events WHERE state IN ('pending', 'claimed')"
    )


def _check_storage(engine: Engine, r: httpx.Response) -> None:
    """A refused request stored nothing. A fuzzed input can stay a valid delivery (a no-op
    mutation, a well-formed event list); then it was stored as it should be, and is cleared
    so the next example starts from an empty database, once the service's inbox has finished
    with it (truncating under a delivery still being routed left its lead behind for the next
    example, or deadlocked with it)."""
    if r.status_code >= 400:
        assert _stored(engine) == 0, r.content[:300]
        return
    FIGURES["accepted_as_valid"] += 1
    wait_until(lambda: _in_flight(engine) == 0, 30, "the accepted delivery to be routed")
    with engine.begin() as conn:
        conn.execute(
            text(
                "TRUNCATE outbox, routing_decisions, assignment_history, assignments, leads, "
                "intake_events, skipped_records"
            )
        )
        conn.execute(text("UPDATE members SET assigned_in_epoch = 0"))


def _mutate(data: bytes, cuts: list[tuple[int, int, bytes]]) -> bytes:
    out = bytearray(data)
    for pos, length, insert in cuts:
        pos %= len(out) + 1
        out[pos : pos + length] = insert
    return bytes(out)


soap_bodies = st.one_of(
    st.binary(max_size=2000),
    st.text(max_size=500).map(str.encode),
    st.builds(
        _mutate,
        st.sampled_from([_VALID_SOAP, _WRONG_ORG_SOAP]),
        st.lists(
            st.tuples(
                st.integers(0, 5000),
                st.integers(0, 50),
                st.sampled_from(
                    [b"", b"<", b">", b"&", b"\x00", b"]]>", b"&amp;", b"\xff", b"<a>"]
                ),
            ),
            min_size=1,
            max_size=4,
        ),
    ),
    st.sampled_from([_DTD, _XXE, _WRONG_ORG_SOAP, b"", b"<?xml version='1.0'?>"]),
)
content_types = st.sampled_from(
    ["text/xml; charset=utf-8", "application/json", "", "text/plain", "multipart/form-data"]
)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4)
    ),
    max_leaves=20,
)
event_like = st.fixed_dictionaries(
    {},
    optional={
        "eventId": json_values,
        "subscriptionId": json_values,
        "portalId": json_values,
        "occurredAt": json_values,
        "subscriptionType": st.sampled_from(["contact.creation", "contact.propertyChange", "x"])
        | json_values,
        "objectId": json_values,
        "propertyName": json_values,
        "propertyValue": json_values,
        "attemptNumber": json_values,
    },
)


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(body=soap_bodies, ctype=content_types, org=st.sampled_from(["demo-sf", "demo-sf", "nope"]))
def test_salesforce_endpoint_answers_clean_4xx(
    running: tuple[Proc, Engine, httpx.Client], body: bytes, ctype: str, org: str
) -> None:
    proc, engine, client = running
    headers = {"Content-Type": ctype} if ctype else {}
    r = client.post(
        f"{proc.url}/webhooks/salesforce/{org}/{ENV['DEMO_SF_OUTBOUND_SECRET']}",
        content=body,
        headers=headers,
    )
    _assert_clean(r, "sf")
    _check_storage(engine, r)


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    body=st.one_of(
        st.binary(max_size=1000),
        st.lists(event_like, max_size=5).map(lambda v: json.dumps(v).encode()),
        json_values.map(lambda v: json.dumps(v).encode()),
    ),
    sign=st.sampled_from(["right", "right", "wrong", "none", "stale"]),
    ctype=content_types,
    org=st.sampled_from(["demo-hs", "demo-hs", "demo-sf", "nope"]),
)
def test_hubspot_endpoint_answers_clean_4xx(
    running: tuple[Proc, Engine, httpx.Client], body: bytes, sign: str, ctype: str, org: str
) -> None:
    proc, engine, client = running
    url = f"{proc.url}/webhooks/hubspot/{org}"
    now_ms = int(time.time() * 1000) - (10 * 60 * 1000 if sign == "stale" else 0)
    secret = ENV["DEMO_HS_WEBHOOK_SECRET"] if sign != "wrong" else "not-the-secret"
    headers = {"Content-Type": ctype} if ctype else {}
    if sign != "none":
        headers["X-HubSpot-Signature-v3"] = sign_v3(secret, "POST", url, body, now_ms)
        headers["X-HubSpot-Request-Timestamp"] = str(now_ms)
    r = client.post(url, content=body, headers=headers)
    _assert_clean(r, "hs")
    _check_storage(engine, r)
