"""The webhook receivers under real uvicorn, real HTTP (httpx) and a real PostgreSQL."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine, text

from connector.config import OrgConfig, parse_config
from connector.service import serve_in_thread
from connector.signatures import sign_v3
from connector.soap import ack_response, build_outbound_message
from connector.store import make_engine
from connector.teams import apply_teams
from connector.web import create_app

SF_ORG_ID = "00D5g000004ABCD"  # configured in its 15-char form; messages carry 18 chars
SF_ORG_ID_18 = "00D5g000004ABCDEA4"
HS_SECRET = "hs-client-secret-value"
NOW = 1_733_140_000.0  # the app's clock in these tests (seconds)

TEAMS = """
teams:
  - name: na_ae
    members:
      - {crm_user_id: "0055g00000AbCdEAAA", name: Ada Lovelace}
      - {crm_user_id: "0055g00000AbCdFAAA", name: Alan Turing}
  - name: row_ae
    members:
      - {crm_user_id: "0055g00000AbCdGAAA", name: Grace Hopper}
"""
SF_AUTH = '{method: client_credentials, client_id: "${SF_ID}", client_secret: "${SF_SECRET}"}'
CONFIGS = {
    "acme": f"""
org: acme
crm:
  kind: salesforce
  instance_url: https://acme.my.salesforce.com
  auth: {SF_AUTH}
  object: Lead
  organization_id: {SF_ORG_ID}
{TEAMS}
rules:
  - {{team: na_ae, when: {{Country: [US, CA]}}}}
  - {{team: row_ae}}
""",
    "noid": f"""
org: noid
crm:
  kind: salesforce
  instance_url: https://noid.my.salesforce.com
  auth: {SF_AUTH}
{TEAMS}
rules:
  - {{team: row_ae}}
""",
    "globex": """
org: globex
crm:
  kind: hubspot
  auth: {access_token: "${HS_TOKEN}"}
  object: contacts
  webhook_secrets: ["${HS_SECRET}"]
  routed_properties: [country]
  fetch_properties: [country, firstname]
"""
    + TEAMS
    + """
rules:
  - {team: na_ae, when: {country: [US, CA]}}
  - {team: row_ae}
""",
    "nosecret": """
org: nosecret
crm:
  kind: hubspot
  auth: {access_token: "${HS_TOKEN}"}
"""
    + TEAMS
    + """
rules:
  - {team: row_ae}
""",
}
ENV = {"SF_ID": "id", "SF_SECRET": "sf-secret", "HS_TOKEN": "hs-token", "HS_SECRET": HS_SECRET}


# --- fixtures ---------------------------------------------------------------------------


@pytest.fixture
def configs(engine: Engine) -> dict[str, OrgConfig]:
    cfgs = {org: parse_config(y, f"{org}.yaml", ENV) for org, y in CONFIGS.items()}
    for cfg in cfgs.values():
        apply_teams(engine, cfg)
    return cfgs


serve = serve_in_thread


Client = Callable[..., httpx.Response]


@contextmanager
def running(engine: Engine, configs: Mapping[str, OrgConfig], **kw: Any) -> Iterator[httpx.Client]:
    app = create_app(engine, configs, clock=lambda: NOW, **kw)
    with serve(app) as base, httpx.Client(base_url=base, timeout=10) as client:
        yield client


@pytest.fixture
def client(engine: Engine, configs: dict[str, OrgConfig]) -> Iterator[httpx.Client]:
    with running(engine, configs) as c:
        yield c


def counts(engine: Engine) -> dict[str, int]:
    with engine.connect() as conn:
        return {
            t: conn.execute(text(f"SELECT count(*) FROM {t}")).scalar_one()
            for t in ("leads", "assignments", "outbox", "webhook_inbox")
        }


EMPTY = {"leads": 0, "assignments": 0, "outbox": 0, "webhook_inbox": 0}


# --- Salesforce ---------------------------------------------------------------------------


def sf_message(
    org_id: str = SF_ORG_ID_18, sobject: str = "Lead", ids: Sequence[str] = ("1", "2", "3")
) -> bytes:
    countries = ["US", "DE", "CA"]
    return build_outbound_message(
        org_id,
        [
            (
                f"04l5g00000AbCd{i:0>4}",
                sobject,
                {
                    "Id": f"00Q5g00000Lm{i:0>6}",
                    "Country": countries[n % 3],
                    "Email": f"lead{i}@example.com",
                    "LeadSource": None,
                },
            )
            for n, i in enumerate(ids)
        ],
    )


def post_sf(
    client: httpx.Client, body: bytes | Any, org: str = "acme", **kw: Any
) -> httpx.Response:
    headers = {"Content-Type": "text/xml; charset=utf-8", "SOAPAction": '""'}
    return client.post(f"/webhooks/salesforce/{org}", content=body, headers=headers, **kw)


def fault_code(resp: httpx.Response) -> str:
    assert resp.headers["content-type"].startswith("text/xml")
    assert b"<Ack>" not in resp.content
    assert b"<soapenv:Fault>" in resp.content
    start = resp.text.index("<faultstring>") + len("<faultstring>")
    return resp.text[start:].split(":", 1)[0]


def test_salesforce_message_is_stored_then_acked(client: httpx.Client, engine: Engine) -> None:
    resp = post_sf(client, sf_message())
    assert resp.status_code == 200
    assert resp.content == ack_response()
    assert resp.headers["content-type"].startswith("text/xml")
    assert counts(engine) == {"leads": 3, "assignments": 3, "outbox": 3, "webhook_inbox": 0}
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT l.crm_id, t.name, l.source FROM leads l JOIN assignments a"
                " ON a.lead_id = l.id JOIN teams t ON t.id = a.team_id ORDER BY l.crm_id"
            )
        ).all()
    assert [(r[1], r[2]) for r in rows] == [
        ("na_ae", "salesforce_outbound"),
        ("row_ae", "salesforce_outbound"),
        ("na_ae", "salesforce_outbound"),
    ]

    # Salesforce retries and duplicates: the repeat is acknowledged and changes nothing.
    again = post_sf(client, sf_message())
    assert again.status_code == 200
    assert again.content == ack_response()
    assert counts(engine)["outbox"] == 3 and counts(engine)["leads"] == 3


XXE = b"""<?xml version="1.0"?>
<!DOCTYPE foo [<!ENTITY xxe SYSTEM "file:///etc/passwd">]>
<soapenv:Envelope xmlns:soapenv="http://schemas.xmlsoap.org/soap/envelope/">
<soapenv:Body>&xxe;</soapenv:Body></soapenv:Envelope>"""
LAUGHS = (
    b'<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol">'
    + b"".join(
        f'<!ENTITY lol{i} "{("&lol" + (str(i - 1) if i > 1 else "") + ";") * 10}">'.encode()
        for i in range(1, 10)
    )
    + b"]><lolz>&lol9;</lolz>"
)
DTD_ONLY = b'<?xml version="1.0"?><!DOCTYPE x SYSTEM "http://evil.example/x.dtd"><x/>'


@pytest.mark.parametrize(
    ("org", "body", "status", "code"),
    [
        ("acme", b"<soapenv:Envelope", 400, "malformed_xml"),
        ("acme", b"", 400, "malformed_xml"),
        ("acme", b"\xff\xfe\x00garbage", 400, "malformed_xml"),
        ("acme", XXE, 400, "forbidden_xml"),
        ("acme", LAUGHS, 400, "forbidden_xml"),
        ("acme", DTD_ONLY, 400, "forbidden_xml"),
        ("acme", b"<a/>", 400, "not_outbound_message"),
        ("acme", sf_message(org_id="00D5g000009ZZZZ"), 403, "wrong_organization"),
        ("acme", sf_message(org_id="00d5g000004abcd"), 403, "wrong_organization"),
        ("acme", sf_message(sobject="Contact"), 400, "wrong_sobject_type"),
        ("acme", sf_message(ids=("1", "2", "x" * 70)), 400, "invalid_lead"),
        ("nobody", sf_message(), 404, "unknown_org"),
        ("globex", sf_message(), 404, "unknown_org"),
        ("noid", sf_message(), 403, "organization_id_not_configured"),
    ],
)
def test_salesforce_rejects_bad_input_and_stores_nothing(
    client: httpx.Client, engine: Engine, org: str, body: bytes, status: int, code: str
) -> None:
    resp = post_sf(client, body, org=org)
    assert resp.status_code == status
    assert fault_code(resp) == code
    assert counts(engine) == EMPTY


def test_salesforce_body_cap(client: httpx.Client, engine: Engine) -> None:
    head, _, tail = sf_message().partition(b"</notifications>")
    tail = b"</notifications>" + tail
    big = head + b" " * (1_048_576 + 10) + tail
    resp = post_sf(client, big)
    assert (resp.status_code, fault_code(resp)) == (413, "body_too_large")

    def chunks() -> Iterator[bytes]:  # no Content-Length: the cap counts received bytes
        yield head
        for _ in range(17):
            yield b" " * 65_536
        yield tail

    resp = post_sf(client, chunks())
    assert resp.request.headers.get("transfer-encoding") == "chunked"
    assert "content-length" not in resp.request.headers
    assert (resp.status_code, fault_code(resp)) == (413, "body_too_large")
    assert counts(engine) == EMPTY
    # A body just under the cap is fine.
    ok = head + b" " * 1_000_000 + tail
    assert post_sf(client, ok).status_code == 200


def test_no_ack_unless_committed(client: httpx.Client, engine: Engine) -> None:
    """A failure at COMMIT (a deferred trigger) must give no Ack and leave nothing stored."""
    with engine.begin() as conn:
        conn.execute(
            text(
                "CREATE FUNCTION fail_commit() RETURNS trigger LANGUAGE plpgsql AS $$"
                " BEGIN RAISE EXCEPTION 'injected' USING ERRCODE = '40001'; END $$"
            )
        )
        conn.execute(
            text(
                "CREATE CONSTRAINT TRIGGER fail_commit AFTER INSERT ON outbox"
                " DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION fail_commit()"
            )
        )
    resp = post_sf(client, sf_message())
    assert resp.status_code == 503
    assert resp.headers["retry-after"] == "5"
    assert fault_code(resp) == "database_unavailable"
    assert b"soapenv:Server" in resp.content
    assert counts(engine) == EMPTY

    with engine.begin() as conn:
        conn.execute(text("DROP TRIGGER fail_commit ON outbox"))
    resp = post_sf(client, sf_message())  # Salesforce's retry
    assert resp.content == ack_response()
    assert counts(engine)["outbox"] == 3


def test_database_down_gives_503_not_ack(configs: dict[str, OrgConfig]) -> None:
    dead = make_engine("postgresql://postgres@127.0.0.1:1/nowhere")
    try:
        with running(dead, configs) as c:
            resp = post_sf(c, sf_message())
            assert resp.status_code == 503
            assert resp.headers["retry-after"] == "5"
            assert fault_code(resp) == "database_unavailable"
            health = c.get("/healthz")
            assert health.status_code == 503
            assert health.json()["status"] == "unavailable"
            scrape = c.get("/metrics")
            assert scrape.status_code == 200
            assert "connector_database_up 0.0" in scrape.text
            resp = post_hs(c, [event(1, 101, "contact.creation")])
            assert (resp.status_code, resp.json()["error"]) == (503, "database_unavailable")
    finally:
        dead.dispose()


# --- HubSpot --------------------------------------------------------------------------------


def event(
    event_id: int,
    object_id: int,
    kind: str = "contact.creation",
    prop: str | None = None,
    value: str | None = None,
    occurred: int = 1_733_139_000_000,
) -> dict[str, Any]:
    e: dict[str, Any] = {
        "eventId": event_id,
        "subscriptionId": 9001,
        "portalId": 62515,
        "appId": 1160452,
        "occurredAt": occurred,
        "subscriptionType": kind,
        "attemptNumber": 0,
        "objectId": object_id,
        "changeSource": "CRM",
    }
    if prop is not None:
        e["propertyName"], e["propertyValue"] = prop, value
    return e


def post_hs(
    client: httpx.Client,
    payload: Any,
    org: str = "globex",
    *,
    secret: str = HS_SECRET,
    timestamp_ms: int | None = None,
    signed_url: str | None = None,
    headers: dict[str, str] | None = None,
) -> httpx.Response:
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    url = f"{client.base_url}".rstrip("/") + f"/webhooks/hubspot/{org}?src=hs"
    ts = int(NOW * 1000) if timestamp_ms is None else timestamp_ms
    sent = {
        "Content-Type": "application/json",
        "X-HubSpot-Signature-v3": sign_v3(secret, "POST", signed_url or url, body, ts),
        "X-HubSpot-Request-Timestamp": str(ts),
    }
    sent.update(headers or {})
    return client.post(url, content=body, headers={k: v for k, v in sent.items() if v})


BATCH = [
    event(1, 101, "contact.creation", occurred=1_733_139_000_000),
    event(2, 101, "contact.propertyChange", "country", "US", occurred=1_733_139_000_100),
    event(3, 102, "contact.creation"),
    event(4, 102, "contact.propertyChange", "country", "DE", occurred=1_733_139_000_200),
    event(5, 103, "contact.propertyChange", "country", "CA"),
    event(6, 101, "contact.propertyChange", "hubspot_owner_id", "77"),  # our own echo
    event(7, 104, "contact.propertyChange", "firstname", "Ada"),  # not a routed property
    event(8, 105, "company.creation"),  # another object type
]


def lead_teams(engine: Engine) -> dict[str, str | None]:
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT l.crm_id, t.name FROM leads l LEFT JOIN assignments a ON a.lead_id = l.id"
                " LEFT JOIN teams t ON t.id = a.team_id WHERE l.org = 'globex'"
            )
        ).all()
    return {r[0]: r[1] for r in rows}


def test_hubspot_signed_batch_routes_with_event_fields(
    client: httpx.Client, engine: Engine
) -> None:
    resp = post_hs(client, BATCH)
    assert resp.status_code == 200, resp.text
    assert resp.json() == {"events": 8, "routed": 3, "queued": 0, "assigned": 3, "duplicates": 0}
    assert lead_teams(engine) == {"101": "na_ae", "102": "row_ae", "103": "na_ae"}
    assert counts(engine) == {"leads": 3, "assignments": 3, "outbox": 3, "webhook_inbox": 3}

    # Repeats and reordered deliveries are harmless.
    again = post_hs(client, list(reversed(BATCH)))
    assert again.status_code == 200
    assert again.json()["duplicates"] == 3
    assert counts(engine) == {"leads": 3, "assignments": 3, "outbox": 3, "webhook_inbox": 3}


def test_hubspot_events_that_route_nothing(client: httpx.Client, engine: Engine) -> None:
    resp = post_hs(client, [BATCH[5], BATCH[6], BATCH[7]])
    assert resp.json() == {"events": 3, "routed": 0, "queued": 0}
    assert post_hs(client, []).json() == {"events": 0, "routed": 0, "queued": 0}
    assert counts(engine) == EMPTY


def test_hubspot_behind_proxy_uses_public_base_url(
    engine: Engine, configs: dict[str, OrgConfig]
) -> None:
    public = "https://hooks.example.com"
    with running(engine, configs, public_base_url=public + "/") as c:
        signed = f"{public}/webhooks/hubspot/globex?src=hs"
        # A forged X-Forwarded-Host changes nothing: only the configured base is trusted.
        resp = post_hs(c, BATCH[:2], signed_url=signed, headers={"X-Forwarded-Host": "evil"})
        assert resp.status_code == 200, resp.text
        # Signed over the URL this process sees, not the public one: refused.
        resp = post_hs(c, BATCH[2:4])
        assert (resp.status_code, resp.json()["error"]) == (401, "bad_signature")
    assert counts(engine)["leads"] == 1


def wait_for(check: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.05)


def test_an_org_without_fetch_properties_is_routed_in_the_request(
    engine: Engine, configs: dict[str, OrgConfig]
) -> None:
    """A fetcher is available, but this org's rules need no fields: no inbox, no CRM call."""
    globex = configs["globex"]
    crm = globex.crm.model_copy(update={"fetch_properties": []})
    plain = {**configs, "globex": globex.model_copy(update={"crm": crm})}
    calls: list[Sequence[str]] = []

    def fetcher(cfg: OrgConfig, ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        calls.append(ids)
        return {}

    with running(engine, plain, fetcher=fetcher) as c:
        resp = post_hs(c, BATCH)
    assert resp.status_code == 200, resp.text
    assert resp.json()["routed"] == 3 and resp.json()["queued"] == 0
    assert calls == []
    assert counts(engine)["assignments"] == 3


def test_hubspot_with_fetcher_queues_then_routes(
    engine: Engine, configs: dict[str, OrgConfig], db_url: str
) -> None:
    crm = {"101": {"country": "CA", "firstname": "Ada"}, "102": {"country": "FR"}}  # 103 deleted
    calls: list[list[str]] = []
    open_transactions: list[int] = []
    probe = make_engine(db_url, pool_size=1)

    def fetcher(cfg: OrgConfig, ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        assert cfg.org == "globex"
        calls.append(list(ids))
        with probe.connect() as conn:  # the CRM is never called with a transaction open
            open_transactions.append(
                conn.execute(
                    text(
                        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                        " AND state LIKE 'idle in transaction%' AND pid <> pg_backend_pid()"
                    )
                ).scalar_one()
            )
        if len(calls) == 1:
            raise TimeoutError("CRM timed out")  # the first attempt fails: retried later
        return {i: crm[i] for i in ids if i in crm}

    try:
        with running(engine, configs, fetcher=fetcher) as c:
            resp = post_hs(c, BATCH)
            assert resp.status_code == 200, resp.text
            assert resp.json() == {"events": 8, "routed": 0, "queued": 3}
            assert post_hs(c, BATCH).json()["queued"] == 0  # a repeat delivery

            def settled() -> bool:
                with engine.connect() as conn:
                    return not conn.execute(
                        text(
                            "SELECT count(*) FROM webhook_inbox WHERE state <> 'done'"
                            " AND state <> 'skipped'"
                        )
                    ).scalar_one()

            wait_for(settled)
            scrape = c.get("/metrics").text
    finally:
        probe.dispose()
    assert len(calls) == 2 and sorted(calls[1]) == ["101", "102", "103"]
    assert open_transactions == [0, 0]
    # The fetched fields win over the event's (101 changed country since the event).
    assert lead_teams(engine) == {"101": "na_ae", "102": "row_ae"}
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT crm_id, state, attempts FROM webhook_inbox")).all()
    states = {r.crm_id: f"{r.state}:{r.attempts}" for r in rows}
    assert states == {"101": "done:2", "102": "done:2", "103": "skipped:2"}
    assert 'connector_crm_errors_total{code="TimeoutError",org="globex"} 1.0' in scrape
    assert 'connector_webhook_inbox_depth{org="globex"} 0.0' in scrape


@pytest.mark.parametrize(
    ("kw", "status", "code"),
    [
        ({"secret": "wrong-secret"}, 401, "bad_signature"),
        ({"headers": {"X-HubSpot-Signature-v3": ""}}, 401, "missing_signature"),
        ({"headers": {"X-HubSpot-Signature-v3": "not base64!"}}, 401, "bad_signature"),
        ({"headers": {"X-HubSpot-Request-Timestamp": ""}}, 401, "missing_timestamp"),
        ({"timestamp_ms": int(NOW * 1000) - 301_000}, 401, "stale_timestamp"),
        ({"timestamp_ms": int(NOW * 1000) + 301_000}, 401, "stale_timestamp"),
        ({"signed_url": "https://127.0.0.1/webhooks/hubspot/globex?src=hs"}, 401, "bad_signature"),
        ({"org": "nosecret"}, 401, "webhook_secret_not_configured"),
        ({"org": "nobody"}, 404, "unknown_org"),
        ({"org": "acme"}, 404, "unknown_org"),
    ],
)
def test_hubspot_rejects_unsigned_and_stores_nothing(
    client: httpx.Client, engine: Engine, kw: dict[str, Any], status: int, code: str
) -> None:
    resp = post_hs(client, BATCH, **kw)
    assert resp.status_code == status
    assert resp.json()["error"] == code
    assert resp.json()["message"]
    assert counts(engine) == EMPTY


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b"[{", "malformed_json"),
        (b"[NaN]", "malformed_json"),
        (b"\xff\xfe", "malformed_json"),
        (b"{}", "not_an_array"),
        (b'"events"', "not_an_array"),
        (json.dumps([{"eventId": 1}]).encode(), "bad_event"),
        (json.dumps([{**BATCH[0], "objectId": True}]).encode(), "bad_event"),
        (
            json.dumps([BATCH[0], BATCH[1], {**BATCH[4], "propertyValue": "U\u0000S"}]).encode(),
            "invalid_lead",
        ),
    ],
)
def test_hubspot_rejects_bad_bodies_and_stores_nothing(
    client: httpx.Client, engine: Engine, body: bytes, code: str
) -> None:
    resp = post_hs(client, body)
    assert (resp.status_code, resp.json()["error"]) == (400, code)
    assert counts(engine) == EMPTY


def test_hubspot_body_cap(client: httpx.Client, engine: Engine) -> None:
    big = json.dumps(BATCH).encode() + b" " * 1_048_576
    resp = post_hs(client, big)
    assert (resp.status_code, resp.json()["error"]) == (413, "body_too_large")

    def chunks() -> Iterator[bytes]:
        for _ in range(20):
            yield b" " * 65_536

    resp = client.post(
        "/webhooks/hubspot/globex",
        content=chunks(),
        headers={"X-HubSpot-Signature-v3": "x", "X-HubSpot-Request-Timestamp": "1"},
    )
    assert "content-length" not in resp.request.headers
    assert (resp.status_code, resp.json()["error"]) == (413, "body_too_large")
    assert counts(engine) == EMPTY


# --- health, metrics, routing errors ----------------------------------------------------------


def test_healthz_and_metrics(client: httpx.Client) -> None:
    health = client.get("/healthz")
    assert (health.status_code, health.json()) == (200, {"status": "ok"})

    post_sf(client, sf_message())
    post_sf(client, b"<nope")
    post_hs(client, BATCH)
    scrape = client.get("/metrics")
    assert scrape.status_code == 200
    assert scrape.headers["content-type"].startswith("text/plain; version=0.0.4")
    body = scrape.text
    for line in (
        'connector_webhook_requests_total{code="200",endpoint="salesforce"} 1.0',
        'connector_webhook_requests_total{code="400",endpoint="salesforce"} 1.0',
        'connector_webhook_requests_total{code="200",endpoint="hubspot"} 1.0',
        'connector_leads_ingested_total{source="salesforce_outbound",status="assigned"} 3.0',
        'connector_leads_ingested_total{source="hubspot_webhook",status="assigned"} 3.0',
        'connector_assignments_total{org="acme",team="na_ae"} 2.0',
        'connector_assignments_total{org="acme",team="row_ae"} 1.0',
        'connector_webhook_latency_seconds_bucket{endpoint="salesforce",le="0.005"}',
        'connector_webhook_latency_seconds_bucket{endpoint="salesforce",le="1.0"}',
        'connector_outbox_depth{org="acme",state="pending"} 3.0',
        'connector_outbox_depth{org="globex",state="pending"} 3.0',
        'connector_outbox_depth{org="noid",state="pending"} 0.0',
        'connector_webhook_inbox_depth{org="globex"} 0.0',
        "connector_database_up 1.0",
        "# TYPE connector_crm_calls_total counter",
        "# TYPE connector_lock_retries_total counter",
    ):
        assert line in body, line
    age = next(
        line
        for line in body.splitlines()
        if line.startswith('connector_outbox_oldest_pending_age_seconds{org="acme"}')
    )
    assert 0 <= float(age.split()[-1]) < 60


def test_unknown_routes_and_methods_get_json(client: httpx.Client) -> None:
    resp = client.get("/webhooks/salesforce/acme")
    assert (resp.status_code, resp.json()["error"]) == (405, "method_not_allowed")
    resp = client.get("/nope")
    assert (resp.status_code, resp.json()["error"]) == (404, "not_found")


def test_teams_not_applied_is_503(engine: Engine) -> None:
    cfg = parse_config(CONFIGS["acme"], "acme.yaml", ENV)  # teams never applied
    with running(engine, {"acme": cfg}) as c:
        resp = post_sf(c, sf_message())
    assert (resp.status_code, fault_code(resp)) == (503, "routing_not_ready")
    assert counts(engine) == EMPTY


def test_two_apps_in_one_process(engine: Engine, configs: dict[str, OrgConfig]) -> None:
    a, b = create_app(engine, configs), create_app(engine, configs)
    assert a.state.metrics.registry is not b.state.metrics.registry


def test_inbox_routing_failure_is_retried_later(engine: Engine) -> None:
    cfg = parse_config(CONFIGS["globex"], "globex.yaml", ENV)  # teams never applied

    def fetcher(cfg: OrgConfig, ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        return {i: {"country": "US"} for i in ids}

    with running(engine, {"globex": cfg}, fetcher=fetcher) as c:
        assert post_hs(c, BATCH[:2]).json()["queued"] == 1

        def rescheduled() -> bool:
            with engine.connect() as conn:
                row = conn.execute(text("SELECT state, last_error FROM webhook_inbox")).one()
            return tuple(row) == ("pending", "routing failed: RoutingError")

        wait_for(rescheduled)
    assert counts(engine) == {"leads": 0, "assignments": 0, "outbox": 0, "webhook_inbox": 1}
