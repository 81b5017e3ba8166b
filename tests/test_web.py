"""The webhook receivers under real uvicorn, real HTTP (httpx) and a real PostgreSQL.

Every push is a hint: a request authenticates its sender, checks the body and commits the
record ids to ``intake_events``; nothing is routed in the request. The ``InboxWorker`` reads
each record back from the CRM (here the HubSpot simulator) and routes it only when the CRM
says it is unrouted.
"""

from __future__ import annotations

import base64
import ipaddress
import json
import random
import string
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine, text

from connector.core.config import OrgConfig, SalesforceCrm
from connector.core.config_loading import parse_config
from connector.core.errors import Conflict, DatabaseError, DatabaseUnavailable
from connector.core.metrics import Metrics
from connector.intake.hubspot_events import webhook_event
from connector.intake.receivers import create_app, db_errors
from connector.intake.signatures import signed_headers
from connector.intake.soap import OUTBOUND_MESSAGE_HEADERS, ack_response, build_outbound_message
from connector.routing.assign import RoutingError
from connector.routing.teams import apply_teams
from connector.shell.adapters import adapter_for
from connector.shell.admin import create_admin_app
from connector.shell.service import serve_in_thread
from connector.shell.store import make_engine
from crm_adapters.base import CrmAdapter
from crm_sandboxes import HubSpotSandbox
from testbed.waiting import wait_until

SF_ORG_ID = "00D5g000004ABCD"  # configured in its 15-char form; messages carry 18 chars
SF_ORG_ID_18 = "00D5g000004ABCDEA4"
OTHER_ORG_ID = "00D5g000009WXYZ"
ACME_SECRET = "acme-outbound-secret-0123456789"
INITECH_SECRET = "initech-outbound-secret-abcdefgh"
NOID_SECRET = "noid-outbound-secret-0123456789"
SECRETS = {"acme": ACME_SECRET, "initech": INITECH_SECRET, "noid": NOID_SECRET}
HS_SECRET = "hs-client-secret-value"
PORTAL = 62515
NOW = 1_733_140_000.0  # the app's clock in these tests (seconds)

TEAMS = """
teams:
  - name: na_ae
    members:
      - {crm_user_id: "0055g00000AbCdEAAV", name: Ada Lovelace}
      - {crm_user_id: "0055g00000AbCdFAAV", name: Alan Turing}
  - name: row_ae
    members:
      - {crm_user_id: "0055g00000AbCdGAAV", name: Grace Hopper}
"""
SF_AUTH = '{method: client_credentials, client_id: "${SF_ID}", client_secret: "${SF_SECRET}"}'


def sf_yaml(org: str, extra: str) -> str:
    return f"""
org: {org}
crm:
  kind: salesforce
  instance_url: https://{org}.my.salesforce.com
  auth: {SF_AUTH}
  object: Lead
{extra}
{TEAMS}
rules:
  - {{team: na_ae, when: {{Country: [US, CA]}}}}
  - {{team: row_ae}}
"""


CONFIGS = {
    "acme": sf_yaml(
        "acme", f'  organization_id: {SF_ORG_ID}\n  outbound_secrets: ["${{ACME_OM}}"]'
    ),
    "initech": sf_yaml(
        "initech", f'  organization_id: {OTHER_ORG_ID}\n  outbound_secrets: ["${{INITECH_OM}}"]'
    ),
    "noid": sf_yaml("noid", '  outbound_secrets: ["${NOID_OM}"]'),
    "sfnosecret": sf_yaml("sfnosecret", f"  organization_id: {SF_ORG_ID}"),
    "globex": f"""
org: globex
crm:
  kind: hubspot
  auth: {{access_token: "${{HS_TOKEN}}"}}
  object: contacts
  webhook_secrets: ["${{HS_SECRET}}"]
  portal_id: {PORTAL}
  routed_properties: [country]
  fetch_properties: [country, firstname]
{TEAMS}
rules:
  - {{team: na_ae, when: {{country: [US, CA]}}}}
  - {{team: row_ae}}
""",
    "nosecret": f"""
org: nosecret
crm:
  kind: hubspot
  auth: {{access_token: "${{HS_TOKEN}}"}}
{TEAMS}
rules:
  - {{team: row_ae}}
""",
}
ENV = {
    "SF_ID": "id",
    "SF_SECRET": "sf-secret",
    "HS_TOKEN": "hs-token",
    "HS_SECRET": HS_SECRET,
    "ACME_OM": ACME_SECRET,
    "INITECH_OM": INITECH_SECRET,
    "NOID_OM": NOID_SECRET,
}
TABLES = ("intake_events", "skipped_records", "leads", "assignments", "outbox")
EMPTY = dict.fromkeys(TABLES, 0)


# --- fixtures and helpers ------------------------------------------------------------------


@pytest.fixture
def configs(engine: Engine) -> dict[str, OrgConfig]:
    cfgs = {org: parse_config(y, f"{org}.yaml", ENV) for org, y in CONFIGS.items()}
    for cfg in cfgs.values():
        apply_teams(engine, cfg)
    return cfgs


@contextmanager
def running(engine: Engine, configs: Mapping[str, OrgConfig], **kw: Any) -> Iterator[httpx.Client]:
    app = create_app(engine, configs, clock=lambda: NOW, **kw)
    with serve_in_thread(app) as base, httpx.Client(base_url=base, timeout=10) as client:
        yield client


@pytest.fixture
def client(engine: Engine, configs: dict[str, OrgConfig]) -> Iterator[httpx.Client]:
    with running(engine, configs) as c:
        yield c


def counts(engine: Engine) -> dict[str, int]:
    with engine.connect() as conn:
        return {t: conn.execute(text(f"SELECT count(*) FROM {t}")).scalar_one() for t in TABLES}


def stored(**n: int) -> dict[str, int]:
    return {**EMPTY, **n}


def intake_rows(engine: Engine) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        return [
            dict(r._mapping)
            for r in conn.execute(
                text(
                    "SELECT org, source, event_key, crm_object, crm_id, state, last_error"
                    " FROM intake_events ORDER BY event_key"
                )
            )
        ]


def wait_for(check: Callable[[], bool], timeout: float = 30.0) -> None:
    """Poll ``check`` until it holds; fail after ``timeout`` seconds."""
    wait_until(check, timeout, getattr(check, "__name__", "a condition"), interval=0.05)


# --- Salesforce ---------------------------------------------------------------------------

# 15-character record ids and their canonical 18-character form.
SF_IDS = {
    "00Q5g00000Lm001": "00Q5g00000Lm001EAB",
    "00Q5g00000Lm002": "00Q5g00000Lm002EAB",
    "00Q5g00000Lm003": "00Q5g00000Lm003EAB",
}


def sf_message(
    org_id: str = SF_ORG_ID_18,
    sobject: str = "Lead",
    ids: Sequence[str] = tuple(SF_IDS),
    first: int = 1,
) -> bytes:
    countries = ["US", "DE", "CA"]
    return build_outbound_message(
        org_id,
        [
            (
                f"04l5g00000AbCd{first + n:0>4}",
                sobject,
                {
                    "Id": rid,
                    "Country": countries[n % 3],
                    "Email": f"lead{n}@example.com",
                    "LeadSource": None,
                },
            )
            for n, rid in enumerate(ids)
        ],
    )


def sf_path(org: str = "acme", secret: str | None = None) -> str:
    secret = SECRETS.get(org) if secret is None else secret
    return f"/webhooks/salesforce/{org}" + (f"/{secret}" if secret else "")


def post_sf(
    client: httpx.Client,
    body: bytes | Any,
    org: str = "acme",
    secret: str | None = None,
    headers: Mapping[str, str] | None = None,
    path: str | None = None,
) -> httpx.Response:
    sent = {**OUTBOUND_MESSAGE_HEADERS, **(headers or {})}
    return client.post(path or sf_path(org, secret), content=body, headers=sent)


def fault_code(resp: httpx.Response) -> str:
    assert resp.headers["content-type"].startswith("text/xml")
    assert b"<Ack>" not in resp.content
    assert b"<soapenv:Fault>" in resp.content
    start = resp.text.index("<faultstring>") + len("<faultstring>")
    return resp.text[start:].split(":", 1)[0]


def test_salesforce_message_is_stored_as_hints_then_acked(
    client: httpx.Client, engine: Engine
) -> None:
    resp = post_sf(client, sf_message())
    assert resp.status_code == 200, resp.text
    assert resp.content == ack_response()
    assert resp.headers["content-type"].startswith("text/xml")
    # Stored by record id only: nothing is routed in the request.
    assert counts(engine) == stored(intake_events=3)
    assert intake_rows(engine) == [
        {
            "org": "acme",
            "source": "salesforce_outbound",
            "event_key": f"04l5g00000AbCd000{n}:{canonical}",
            "crm_object": "Lead",
            "crm_id": canonical,
            "state": "pending",
            "last_error": None,
        }
        for n, canonical in enumerate(SF_IDS.values(), start=1)
    ]

    # Salesforce retries and duplicates: the repeat is acknowledged and adds nothing.
    again = post_sf(client, sf_message())
    assert again.status_code == 200
    assert again.content == ack_response()
    assert counts(engine) == stored(intake_events=3)

    # An 18-character id in another case is stored in the canonical form.
    upper = post_sf(client, sf_message(ids=["00Q5G00000LM001EAB"], first=9))
    assert upper.content == ack_response()
    rows = {r["event_key"]: r["crm_id"] for r in intake_rows(engine)}
    assert rows["04l5g00000AbCd0009:00Q5g00000Lm001EAB"] == "00Q5g00000Lm001EAB"
    assert counts(engine) == stored(intake_events=4)


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
WIDE = b"<a>" + b"<b/>" * 60_000 + b"</a>"  # 240 kB, under the byte cap
DEEP = b"<a>" * 1_000 + b"</a>" * 1_000


# 3,000 characters that do not compress (an index entry holds about 2,700 bytes after
# compression)
_NOISE = "".join(random.Random(54000).choices(string.ascii_letters + string.digits, k=3000))
LONG_NOTIFICATION_ID = build_outbound_message(
    SF_ORG_ID_18, [("04l" + _NOISE, "Lead", {"Id": "00Q5g00000Lm001", "Country": "US"})]
)


@pytest.mark.parametrize(
    ("org", "body", "status", "code"),
    [
        ("acme", b"<soapenv:Envelope", 400, "malformed_xml"),
        ("acme", b"", 400, "malformed_xml"),
        ("acme", b"\xff\xfe\x00garbage", 400, "malformed_xml"),
        ("acme", XXE, 400, "forbidden_xml"),
        ("acme", LAUGHS, 400, "forbidden_xml"),
        ("acme", DTD_ONLY, 400, "forbidden_xml"),
        ("acme", WIDE, 413, "too_many_elements"),
        ("acme", DEEP, 400, "too_deep"),
        ("acme", b"<a/>", 400, "not_outbound_message"),
        ("acme", sf_message(org_id="00D5g000009ZZZZ"), 403, "wrong_organization"),
        ("acme", sf_message(org_id="00d5g000004abcd"), 403, "wrong_organization"),
        ("acme", sf_message(org_id=OTHER_ORG_ID), 403, "wrong_organization"),
        ("acme", sf_message(sobject="Contact"), 400, "wrong_sobject_type"),
        ("acme", sf_message(ids=("00Q5g00000Lm001", "x" * 70)), 400, "invalid_lead"),
        ("acme", sf_message(ids=("00Q5g00000Lm0012",)), 400, "invalid_lead"),
        ("acme", sf_message(ids=("00Q5g00000Lm-01",)), 400, "invalid_lead"),
        # a notification id too long for the event key's index (SQLSTATE 54000 when stored)
        ("acme", LONG_NOTIFICATION_ID, 400, "invalid_notification_id"),
        ("noid", sf_message(), 403, "organization_id_not_configured"),
    ],
)
def test_salesforce_rejects_bad_input_and_stores_nothing(
    client: httpx.Client, engine: Engine, org: str, body: bytes, status: int, code: str
) -> None:
    resp = post_sf(client, body, org=org)
    assert resp.status_code == status
    assert fault_code(resp) == code
    assert b"soapenv:Client" in resp.content
    assert counts(engine) == EMPTY


def test_salesforce_refuses_every_unauthenticated_sender_with_one_404(
    client: httpx.Client, engine: Engine
) -> None:
    """An unknown org and a known one with a wrong secret look the same: no enumeration."""
    body = sf_message()
    paths = {
        "unknown org": f"/webhooks/salesforce/nobody/{ACME_SECRET}",
        "hubspot org": f"/webhooks/salesforce/globex/{ACME_SECRET}",
        "no secret configured": f"/webhooks/salesforce/sfnosecret/{ACME_SECRET}",
        "no secret in the url": "/webhooks/salesforce/acme",
        "wrong secret": "/webhooks/salesforce/acme/wrong-secret-wrong-secret-wrong",
        "another org's secret": f"/webhooks/salesforce/acme/{INITECH_SECRET}",
        "one char differs": f"/webhooks/salesforce/acme/{ACME_SECRET[:-1]}X",
        "a prefix": f"/webhooks/salesforce/acme/{ACME_SECRET[:-1]}",
        "an extension": f"/webhooks/salesforce/acme/{ACME_SECRET}0",
        "other case": f"/webhooks/salesforce/acme/{ACME_SECRET.upper()}",
    }
    answers = {why: post_sf(client, body, path=p) for why, p in paths.items()}
    reference = answers["unknown org"]
    assert reference.status_code == 404
    assert fault_code(reference) == "not_found"
    assert "<faultstring>not_found:" in reference.text
    for why, resp in answers.items():
        assert resp.status_code == 404, why
        assert resp.headers["content-type"] == reference.headers["content-type"], why
        assert resp.content == reference.content, why
    assert counts(engine) == EMPTY

    # The same message with the right secret is accepted (the refusals were the sender).
    assert post_sf(client, body).content == ack_response()
    assert counts(engine) == stored(intake_events=3)


def test_salesforce_malformed_organization_ids_never_match(
    engine: Engine, configs: dict[str, OrgConfig]
) -> None:
    # model_copy skips validation: config loading refuses this typo (tests/test_config.py),
    # and even past it two malformed ids never count as equal.
    acme = configs["acme"]
    crm = acme.crm.model_copy(update={"organization_id": "00D5g000004ABC"})  # 14 chars: a typo
    typo = {**configs, "acme": acme.model_copy(update={"crm": crm})}
    with running(engine, typo) as c:
        resp = post_sf(c, sf_message(org_id="x"))
    assert (resp.status_code, fault_code(resp)) == (403, "wrong_organization")
    assert counts(engine) == EMPTY


def with_allowlist(configs: Mapping[str, OrgConfig], cidrs: list[str]) -> dict[str, OrgConfig]:
    acme = configs["acme"]
    assert isinstance(acme.crm, SalesforceCrm)
    crm = acme.crm.model_copy(update={"outbound_allow_cidrs": cidrs})
    return {**configs, "acme": acme.model_copy(update={"crm": crm})}


@pytest.mark.parametrize(
    ("cidr", "trusted", "forwarded_for", "accepted"),
    [
        ("10.9.0.0/16", None, None, False),
        ("127.0.0.0/8", None, None, True),
        # Without a trusted proxy X-Forwarded-For is the client's own claim: ignored.
        ("10.9.0.0/16", None, "10.9.1.2", False),
        ("127.0.0.0/8", None, "6.6.6.6", True),
        ("10.9.0.0/16", "127.0.0.1/32", "10.9.1.2", True),
        # The right-most hop that is not a trusted proxy counts, not a forged left part.
        ("10.9.0.0/16", "127.0.0.1/32", "10.9.1.2, 6.6.6.6", False),
        ("10.9.0.0/16", "127.0.0.1/32", "6.6.6.6, 10.9.1.2", True),
        ("10.9.0.0/16", "127.0.0.1/32", "not-an-address", False),
    ],
)
def test_salesforce_address_allowlist(
    engine: Engine,
    configs: dict[str, OrgConfig],
    cidr: str,
    trusted: str | None,
    forwarded_for: str | None,
    accepted: bool,
) -> None:
    proxies = [ipaddress.ip_network(trusted)] if trusted else []
    headers = {"X-Forwarded-For": forwarded_for} if forwarded_for else {}
    with running(engine, with_allowlist(configs, [cidr]), trusted_proxies=proxies) as c:
        unknown = post_sf(c, sf_message(), path=f"/webhooks/salesforce/nobody/{ACME_SECRET}")
        resp = post_sf(c, sf_message(), headers=headers)
    if accepted:
        assert resp.status_code == 200, resp.text
        assert resp.content == ack_response()
        assert counts(engine) == stored(intake_events=3)
    else:
        assert resp.status_code == 404
        assert fault_code(resp) == "not_found"
        assert (resp.headers["content-type"], resp.content) == (
            unknown.headers["content-type"],
            unknown.content,
        )
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
    assert post_sf(client, ok).content == ack_response()
    assert counts(engine) == stored(intake_events=3)


@contextmanager
def failing_commit(engine: Engine) -> Iterator[None]:
    """Every COMMIT that inserted into intake_events fails (a deferred trigger)."""
    with engine.begin() as conn:
        conn.execute(
            text(
                "CREATE FUNCTION fail_commit() RETURNS trigger LANGUAGE plpgsql AS $$"
                " BEGIN RAISE EXCEPTION 'injected' USING ERRCODE = '40001'; END $$"
            )
        )
        conn.execute(
            text(
                "CREATE CONSTRAINT TRIGGER fail_commit AFTER INSERT ON intake_events"
                " DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION fail_commit()"
            )
        )
    try:
        yield
    finally:
        with engine.begin() as conn:
            conn.execute(text("DROP TRIGGER fail_commit ON intake_events"))
            conn.execute(text("DROP FUNCTION fail_commit()"))


def test_no_ack_unless_committed(client: httpx.Client, engine: Engine) -> None:
    """A failure at COMMIT must give no Ack (and no 200) and leave nothing stored."""
    with failing_commit(engine):
        resp = post_sf(client, sf_message())
        assert resp.status_code == 503
        assert resp.headers["retry-after"] == "5"
        assert fault_code(resp) == "database_unavailable"
        assert b"soapenv:Server" in resp.content
        hs = post_hs(client, BATCH)
        assert (hs.status_code, hs.json()["error"]) == (503, "database_unavailable")
        assert hs.headers["retry-after"] == "5"
        assert counts(engine) == EMPTY

    resp = post_sf(client, sf_message())  # Salesforce's retry
    assert resp.content == ack_response()
    assert post_hs(client, BATCH).json()["queued"] == 3  # HubSpot's retry
    assert counts(engine) == stored(intake_events=6)


@pytest.mark.parametrize(
    ("exc", "answer"),
    [
        (DatabaseUnavailable("database unavailable: x"), (503, "database_unavailable", 5)),
        (DatabaseUnavailable("x", connection_invalidated=True), (503, "database_unavailable", 5)),
        (Conflict("database conflict: x", sqlstate="40001"), (503, "database_unavailable", 5)),
        (Conflict("database conflict: x", sqlstate="23505"), (503, "database_unavailable", 5)),
        (DatabaseError("database error: x", sqlstate="42P01"), (500, "database_error", None)),
        (RoutingError("team t is not applied"), (503, "routing_not_ready", 5)),
        (ValueError("a bug"), None),
    ],
)
def test_db_errors_answers(exc: Exception, answer: tuple[int, str, int | None] | None) -> None:
    """A retry can succeed (outage, lost race): 503 + Retry-After; a refusal: 500."""
    mapped = db_errors(exc)
    got = None if mapped is None else (mapped.status, mapped.code, mapped.retry_after)
    assert got == answer
    assert mapped is None or "x" not in mapped.message  # the database's words stay in the log


def test_database_down_gives_503_not_ack(configs: dict[str, OrgConfig]) -> None:
    dead = make_engine("postgresql://postgres@127.0.0.1:1/nowhere")
    try:
        app = create_app(dead, configs, clock=lambda: NOW)
        admin = create_admin_app(dead, app.state.metrics)
        with (
            serve_in_thread(app) as base,
            serve_in_thread(admin) as admin_base,
            httpx.Client(base_url=base, timeout=10) as c,
        ):
            resp = post_sf(c, sf_message())
            assert resp.status_code == 503
            assert resp.headers["retry-after"] == "5"
            assert fault_code(resp) == "database_unavailable"
            # A refusal needs no database: still the same 404.
            wrong = post_sf(c, sf_message(), secret="wrong-secret-wrong-secret-wrong")
            assert (wrong.status_code, fault_code(wrong)) == (404, "not_found")
            resp = post_hs(c, [event(1, 101, "contact.creation")])
            assert (resp.status_code, resp.json()["error"]) == (503, "database_unavailable")
            assert resp.headers["retry-after"] == "5"

            health = httpx.get(f"{admin_base}/healthz", timeout=10)
            assert health.status_code == 503
            assert health.headers["retry-after"] == "5"
            assert health.json()["status"] == "unavailable"
            scrape = httpx.get(f"{admin_base}/metrics", timeout=10)
            assert scrape.status_code == 200
            assert "connector_database_up 0.0" in scrape.text
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
    portal: int = PORTAL,
) -> dict[str, Any]:
    return webhook_event(
        event_id,
        object_id,
        portal,
        occurred,
        subscription_type=kind,
        property_name=prop,
        property_value=value,
    )


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
    sent = signed_headers(secret, signed_url or url, body, ts)
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
BATCH_KEYS = {f"{PORTAL}:2:101": "101", f"{PORTAL}:4:102": "102", f"{PORTAL}:5:103": "103"}


def test_hubspot_signed_batch_is_stored_as_hints(client: httpx.Client, engine: Engine) -> None:
    resp = post_hs(client, BATCH)
    assert resp.status_code == 200, resp.text
    assert resp.json() == {"events": 8, "queued": 3, "duplicates": 0, "foreign": 0}
    # The newest kept event per object; nothing routed in the request.
    assert counts(engine) == stored(intake_events=3)
    rows = intake_rows(engine)
    assert {r["event_key"]: r["crm_id"] for r in rows} == BATCH_KEYS
    assert {(r["org"], r["source"], r["crm_object"], r["state"]) for r in rows} == {
        ("globex", "hubspot_webhook", "contacts", "pending")
    }

    # Repeats and reordered deliveries are harmless.
    again = post_hs(client, list(reversed(BATCH)))
    assert again.status_code == 200
    assert again.json() == {"events": 8, "queued": 0, "duplicates": 3, "foreign": 0}
    assert counts(engine) == stored(intake_events=3)


def test_hubspot_events_that_route_nothing(client: httpx.Client, engine: Engine) -> None:
    resp = post_hs(client, [BATCH[5], BATCH[6], BATCH[7]])
    assert resp.status_code == 200
    assert resp.json() == {"events": 3, "queued": 0, "duplicates": 0, "foreign": 0}
    empty = post_hs(client, [])
    assert empty.json() == {"events": 0, "queued": 0, "duplicates": 0, "foreign": 0}
    assert counts(engine) == EMPTY


def test_hubspot_events_of_other_portals_are_refused(client: httpx.Client, engine: Engine) -> None:
    foreign = [event(1, 101, portal=999), event(2, 102, "contact.creation", portal=1)]
    resp = post_hs(client, foreign)
    assert (resp.status_code, resp.json()["error"]) == (403, "wrong_portal")
    assert resp.json()["message"]
    assert counts(engine) == EMPTY

    # Mixed: only this portal's events are kept (same event and object ids elsewhere too).
    mixed = [event(1, 101), *foreign, event(9, 106, portal=999)]
    resp = post_hs(client, mixed)
    assert resp.status_code == 200, resp.text
    assert resp.json() == {"events": 4, "queued": 1, "duplicates": 0, "foreign": 3}
    assert [(r["event_key"], r["crm_id"]) for r in intake_rows(engine)] == [
        (f"{PORTAL}:1:101", "101")
    ]
    assert counts(engine) == stored(intake_events=1)


def test_hubspot_behind_proxy_uses_public_base_url(
    engine: Engine, configs: dict[str, OrgConfig]
) -> None:
    public = "https://hooks.example.com"
    with running(engine, configs, public_base_url=public + "/") as c:
        signed = f"{public}/webhooks/hubspot/globex?src=hs"
        # A forged X-Forwarded-Host changes nothing: only the configured base is trusted.
        resp = post_hs(c, BATCH[:2], signed_url=signed, headers={"X-Forwarded-Host": "evil"})
        assert resp.status_code == 200, resp.text
        assert resp.json()["queued"] == 1
        # Signed over the URL this process sees, not the public one: refused.
        resp = post_hs(c, BATCH[2:4])
        assert (resp.status_code, resp.json()["error"]) == (404, "not_found")
    assert counts(engine) == stored(intake_events=1)


@pytest.mark.parametrize(
    ("kw", "status", "code"),
    [
        ({"secret": "wrong-secret"}, 404, "not_found"),
        ({"headers": {"X-HubSpot-Signature-v3": ""}}, 404, "not_found"),
        ({"headers": {"X-HubSpot-Signature-v3": "not base64!"}}, 404, "not_found"),
        ({"headers": {"X-HubSpot-Request-Timestamp": ""}}, 404, "not_found"),
        ({"timestamp_ms": int(NOW * 1000) - 301_000}, 404, "not_found"),
        ({"timestamp_ms": int(NOW * 1000) + 301_000}, 404, "not_found"),
        ({"signed_url": "https://127.0.0.1/webhooks/hubspot/globex?src=hs"}, 404, "not_found"),
        ({"org": "nosecret"}, 404, "not_found"),
        ({"org": "nobody"}, 404, "not_found"),
        ({"org": "acme"}, 404, "not_found"),
    ],
)
def test_hubspot_rejects_unsigned_and_stores_nothing(
    client: httpx.Client, engine: Engine, kw: dict[str, Any], status: int, code: str
) -> None:
    resp = post_hs(client, BATCH, **kw)
    assert resp.status_code == status
    assert resp.headers["content-type"] == "application/json"
    assert resp.json()["error"] == code
    assert resp.json()["message"]
    assert counts(engine) == EMPTY


def test_hubspot_unknown_and_unconfigured_orgs_get_one_404(
    client: httpx.Client, engine: Engine
) -> None:
    """An unknown org, one with no secret, a bad signature (checked after the body is read)
    and a bad header (checked before): the same status, headers and bytes, so neither org
    names nor where a check failed can be told apart."""
    answers = [post_hs(client, BATCH, org=org) for org in ("nobody", "acme", "nosecret")]
    answers.append(post_hs(client, BATCH, secret="wrong-secret"))
    answers.append(post_hs(client, BATCH, timestamp_ms=int(NOW * 1000) - 301_000))
    answers.append(post_hs(client, BATCH, headers={"X-HubSpot-Signature-v3": "x"}))

    def head(resp: httpx.Response) -> list[tuple[str, str]]:
        return [(k, v) for k, v in resp.headers.multi_items() if k != "date"]

    for resp in answers:
        assert resp.status_code == 404
        assert resp.json() == {"error": "not_found", "message": "Not Found"}
        assert resp.content == answers[0].content
        assert head(resp) == head(answers[0])
        assert resp.headers["connection"] == "close"
    assert counts(engine) == EMPTY


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b"[{", "malformed_json"),
        (b"[NaN]", "malformed_json"),
        (b"\xff\xfe", "malformed_json"),
        (b"[" * 100_000 + b"]" * 100_000, "malformed_json"),
        (b"{}", "not_an_array"),
        (b'"events"', "not_an_array"),
        (json.dumps([{"eventId": 1}]).encode(), "bad_event"),
        (json.dumps([{**BATCH[0], "objectId": True}]).encode(), "bad_event"),
        (json.dumps([{**BATCH[0], "portalId": "62515"}]).encode(), "bad_event"),
        (json.dumps([BATCH[0]] * 1001).encode(), "too_many_events"),
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
        # headers that pass the checks made before the body is read
        headers={
            "X-HubSpot-Signature-v3": base64.b64encode(b"x" * 32).decode(),
            "X-HubSpot-Request-Timestamp": str(int(NOW * 1000)),
        },
    )
    assert "content-length" not in resp.request.headers
    assert (resp.status_code, resp.json()["error"]) == (413, "body_too_large")
    assert counts(engine) == EMPTY


# --- admin app, routes ------------------------------------------------------------------


@contextmanager
def admin(engine: Engine, app_metrics: Any, token: str | None = None) -> Iterator[httpx.Client]:
    app = create_admin_app(engine, app_metrics, token=token)
    with serve_in_thread(app) as base, httpx.Client(base_url=base, timeout=10) as client:
        yield client


def test_admin_healthz_and_metrics(engine: Engine, configs: dict[str, OrgConfig]) -> None:
    app = create_app(engine, configs, clock=lambda: NOW)
    with (
        serve_in_thread(app) as base,
        httpx.Client(base_url=base, timeout=10) as c,
        admin(engine, app.state.metrics) as a,
    ):
        health = a.get("/healthz")
        assert (health.status_code, health.json()) == (200, {"status": "ok"})

        assert post_sf(c, sf_message()).status_code == 200
        assert post_sf(c, b"<nope").status_code == 400
        assert post_sf(c, sf_message(), secret="wrong-secret-wrong-secret-wrong").status_code == 404
        assert post_hs(c, BATCH).status_code == 200
        assert post_hs(c, [event(1, 101, portal=7)]).status_code == 403
        scrape = a.get("/metrics")
    assert scrape.status_code == 200
    assert scrape.headers["content-type"].startswith("text/plain; version=0.0.4")
    body = scrape.text
    for line in (
        'connector_webhook_requests_total{code="200",endpoint="salesforce"} 1.0',
        'connector_webhook_requests_total{code="400",endpoint="salesforce"} 1.0',
        'connector_webhook_requests_total{code="404",endpoint="salesforce"} 1.0',
        'connector_webhook_requests_total{code="200",endpoint="hubspot"} 1.0',
        'connector_webhook_requests_total{code="403",endpoint="hubspot"} 1.0',
        'connector_webhook_events_total{org="acme",outcome="queued"} 3.0',
        'connector_webhook_events_total{org="globex",outcome="queued"} 3.0',
        'connector_webhook_events_total{org="globex",outcome="foreign_portal"} 1.0',
        'connector_webhook_latency_seconds_bucket{endpoint="salesforce",le="0.005"}',
        'connector_webhook_latency_seconds_bucket{endpoint="salesforce",le="1.0"}',
        'connector_outbox_depth{org="acme",state="pending"} 0.0',
        'connector_outbox_depth{org="noid",state="pending"} 0.0',
        'connector_webhook_inbox_depth{org="acme"} 3.0',
        'connector_webhook_inbox_depth{org="globex"} 3.0',
        "connector_database_up 1.0",
        "# TYPE connector_crm_calls_total counter",
        "# TYPE connector_lock_retries_total counter",
    ):
        assert line in body, line
    # Nothing was routed in the requests.
    assert "connector_leads_ingested_total{" not in body
    assert counts(engine) == stored(intake_events=6)


def test_admin_healthz_waits_for_what_the_process_waits_for(
    engine: Engine, configs: dict[str, OrgConfig]
) -> None:
    """A process that names what it still waits for (`connector dispatch`: its outbox
    listener, its dispatcher threads) is not healthy until the list is empty."""
    pending = ["outbox listener", "dispatch-acme-1 (stopped)"]
    app = create_admin_app(
        engine, create_app(engine, configs).state.metrics, waiting_for=lambda: list(pending)
    )
    with serve_in_thread(app) as base, httpx.Client(base_url=base, timeout=10) as a:
        waiting = a.get("/healthz")
        assert waiting.status_code == 503
        assert waiting.headers["retry-after"] == "5"
        assert waiting.json() == {
            "status": "unavailable",
            "error": "not_ready",
            "waiting_for": ["outbox listener", "dispatch-acme-1 (stopped)"],
        }
        pending.clear()
        ready = a.get("/healthz")
        assert (ready.status_code, ready.json()) == (200, {"status": "ok"})


def test_admin_token(engine: Engine, configs: dict[str, OrgConfig]) -> None:
    app = create_app(engine, configs)
    token = "admin-token-0123456789-abcdefghijklmn"
    with admin(engine, app.state.metrics, token=token) as a:
        # each wrong one is followed by the right one, which clears the sign-in backoff
        for path in ("/healthz", "/metrics"):
            for given in (
                None,
                "Bearer wrong-token",
                token,
                f"Basic {token}",
                f"Bearer {token}x",
                f"Bearer {token[:-1]}",
            ):
                resp = a.get(path, headers={"Authorization": given} if given else {})
                assert resp.status_code == 401, (path, given)
                assert resp.json()["error"] == "unauthorized"
                assert a.get(path, headers={"Authorization": f"Bearer {token}"}).status_code == 200
            ok = a.get(path, headers={"Authorization": f"Bearer {token}"})
            assert ok.status_code == 200, path
        assert a.get("/healthz", headers={"Authorization": f"Bearer {token}"}).json() == {
            "status": "ok"
        }
        scrape = a.get("/metrics", headers={"Authorization": f"Bearer {token}"}).text
        assert "connector_webhook_requests" in scrape
        assert "connector_outbox_depth" in scrape


def test_public_app_serves_only_the_webhooks(client: httpx.Client) -> None:
    for path in ("/healthz", "/metrics", "/nope", "/webhooks", "/webhooks/salesforce"):
        resp = client.get(path)
        assert resp.status_code == 404, path
        assert resp.json() == {"error": "not_found", "message": "Not Found"}, path
    for path in (
        "/webhooks/salesforce/acme",
        sf_path("acme"),
        "/webhooks/hubspot/globex",
    ):
        resp = client.get(path)
        assert (resp.status_code, resp.json()["error"]) == (405, "method_not_allowed"), path
        assert "POST" in resp.headers["allow"]


def test_two_apps_in_one_process(engine: Engine, configs: dict[str, OrgConfig]) -> None:
    a, b = create_app(engine, configs), create_app(engine, configs)
    assert a.state.metrics.registry is not b.state.metrics.registry
    shared = Metrics(engine, configs)
    assert create_app(engine, configs, metrics=shared).state.metrics is shared
    with serve_in_thread(a) as base_a, serve_in_thread(b) as base_b:
        with httpx.Client(base_url=base_a, timeout=10) as ca:
            assert post_sf(ca, sf_message()).status_code == 200
        with httpx.Client(base_url=base_b, timeout=10) as cb:
            assert post_sf(cb, sf_message()).status_code == 200  # a redelivery: acked
            assert post_sf(cb, b"<bad").status_code == 400
    ok = 'connector_webhook_requests_total{code="200",endpoint="salesforce"} 1.0'
    bad = 'connector_webhook_requests_total{code="400",endpoint="salesforce"}'
    text_a, text_b = a.state.metrics.render().decode(), b.state.metrics.render().decode()
    assert ok in text_a and bad not in text_a
    assert ok in text_b and bad + " 1.0" in text_b
    assert counts(engine) == stored(intake_events=3)


# --- the inbox worker against the HubSpot simulator -----------------------------------------

HS_HOOK_SECRET = "hs-app-client-secret"
LATER = 1_733_139_000_500


@pytest.fixture(scope="module")
def hs_sandbox() -> Iterator[HubSpotSandbox]:
    sb = HubSpotSandbox(limit_per_10s=10_000, search_per_s=None).start()
    yield sb
    sb.stop()


def hubspot_routing_org(
    hs: HubSpotSandbox, token: str, americas: str, international: str, intake: str
) -> OrgConfig:
    yaml = f"""
org: hsroute
crm:
  kind: hubspot
  base_url: {hs.url}
  auth: {{access_token: "${{HS_TOKEN}}"}}
  object: contacts
  webhook_secrets: ["${{HS_HOOK}}"]
  portal_id: {PORTAL}
  routed_properties: [country]
intake_owner_ids: ["{intake}"]
teams:
  - name: americas
    members: [{{crm_user_id: "{americas}", name: Hedy Lamarr}}]
  - name: international
    members: [{{crm_user_id: "{international}", name: Radia Perlman}}]
rules:
  - {{team: americas, when: {{country: [United States, Canada]}}}}
  - {{team: international}}
"""
    return parse_config(yaml, "hsroute.yaml", {"HS_TOKEN": token, "HS_HOOK": HS_HOOK_SECRET})


def open_events(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                text("SELECT count(*) FROM intake_events WHERE state IN ('pending', 'claimed')")
            ).scalar_one()
        )


def test_hubspot_push_is_read_back_from_the_crm_and_routed(
    engine: Engine, hs_sandbox: HubSpotSandbox
) -> None:
    hs = hs_sandbox
    token = f"web-test-token-{time.monotonic_ns()}"
    hs.add_token(token)
    americas, international, person = hs.add_owner("A"), hs.add_owner("I"), hs.add_owner("P")
    intake = hs.add_owner("Intake")
    cfg = hubspot_routing_org(hs, token, americas, international, intake)
    apply_teams(engine, cfg)
    configs = {cfg.org: cfg}

    german = hs.add_record("contacts", properties={"country": "Germany"})
    canadian = hs.add_record("contacts", properties={"country": "Canada"})
    queued = hs.add_record("contacts", owner_id=intake, properties={"country": "United States"})
    owned = hs.add_record("contacts", owner_id=person, properties={"country": "Canada"})
    gone = hs.add_record("contacts", properties={"country": "Canada"})
    hs.delete_record(gone)
    unknown = "99999999"

    # The events carry countries that contradict the CRM: the CRM's values must win.
    events = [
        event(1, int(german), "contact.creation"),
        event(2, int(german), "contact.propertyChange", "country", "United States", LATER),
        event(3, int(canadian), "contact.propertyChange", "country", "Germany"),
        event(4, int(queued), "contact.creation"),
        event(5, int(owned), "contact.propertyChange", "country", "Canada"),
        event(6, int(gone), "contact.creation"),
        event(7, int(unknown), "contact.creation"),
    ]
    adapters: dict[str, CrmAdapter] = {cfg.org: adapter_for(cfg)}
    app = create_app(engine, configs, adapters=adapters.__getitem__)
    worker = app.state.inbox_worker
    assert worker is not None
    with serve_in_thread(app) as base, httpx.Client(base_url=base, timeout=10) as c:
        url = f"{base}/webhooks/hubspot/hsroute"
        body = json.dumps(events).encode()
        ts = int(time.time() * 1000)
        headers = signed_headers(HS_HOOK_SECRET, url, body, ts)
        resp = c.post(url, content=body, headers=headers)
        assert resp.status_code == 200, resp.text
        assert resp.json() == {"events": 7, "queued": 6, "duplicates": 0, "foreign": 0}
        wait_for(lambda: open_events(engine) == 0)  # the lifespan's worker drains the inbox
        assert worker.drain() == 0
        reads = hs.counters()["calls"].get("POST contacts/batch/read", 0)

        # A later event for a routed record: stored, not read again, not routed again.
        later = json.dumps([event(8, int(german), "contact.creation")]).encode()
        headers = signed_headers(HS_HOOK_SECRET, url, later, ts)
        resp = c.post(url, content=later, headers=headers)
        assert resp.json()["queued"] == 1
        wait_for(lambda: open_events(engine) == 0)
        assert hs.counters()["calls"].get("POST contacts/batch/read", 0) == reads

    with engine.connect() as conn:
        leads = {
            r.crm_id: (r.team, r.crm_user_id, r.country, r.source)
            for r in conn.execute(
                text(
                    "SELECT l.crm_id, t.name AS team, a.crm_user_id, l.fields->>'country'"
                    " AS country, l.source FROM leads l JOIN assignments a ON a.lead_id = l.id"
                    " JOIN teams t ON t.id = a.team_id WHERE l.org = 'hsroute'"
                )
            )
        }
        outbox = sorted(
            conn.execute(
                text("SELECT l.crm_id FROM outbox o JOIN leads l ON l.id = o.lead_id")
            ).scalars()
        )
        skipped = {
            r.crm_id: (r.reason, r.owner_found, r.source)
            for r in conn.execute(text("SELECT * FROM skipped_records"))
        }
        states = {
            r.crm_id: (r.state, r.last_error)
            for r in conn.execute(text("SELECT crm_id, state, last_error FROM intake_events"))
            if r.crm_id != german
        }
        german_events = [
            tuple(r)
            for r in conn.execute(
                text("SELECT state, last_error FROM intake_events WHERE crm_id = :id ORDER BY id"),
                {"id": german},
            )
        ]
    assert leads == {
        german: ("international", international, "Germany", "hubspot_webhook"),
        canadian: ("americas", americas, "Canada", "hubspot_webhook"),
        queued: ("americas", americas, "United States", "hubspot_webhook"),
    }
    assert outbox == sorted([german, canadian, queued])
    assert skipped == {
        owned: ("owned", person, "hubspot_webhook"),
        gone: ("not_found", None, "hubspot_webhook"),
        unknown: ("not_found", None, "hubspot_webhook"),
    }
    assert states == {
        canadian: ("done", None),
        queued: ("done", None),
        owned: ("skipped", "owned"),
        gone: ("skipped", "not_found"),
        unknown: ("skipped", "not_found"),
    }
    assert german_events == [("done", None), ("done", "already routed")]
    # The person's record is untouched in the CRM.
    record = hs.get_record(owned)
    assert record is not None and record["properties"]["hubspot_owner_id"] == person
    assert counts(engine) == stored(
        intake_events=7, skipped_records=3, leads=3, assignments=3, outbox=3
    )


def test_routing_not_ready_is_retried_later_not_refused(
    engine: Engine, hs_sandbox: HubSpotSandbox
) -> None:
    """Teams not applied no longer matters to the request: it is acked and stored; the
    worker's routing fails, rolls back and reschedules the event."""
    hs = hs_sandbox
    token = f"web-test-token-{time.monotonic_ns()}"
    hs.add_token(token)
    owner = hs.add_owner("A")
    cfg = hubspot_routing_org(hs, token, owner, owner, "intake-owner")  # teams never applied
    contact = hs.add_record("contacts", properties={"country": "Canada"})
    adapters: dict[str, CrmAdapter] = {cfg.org: adapter_for(cfg)}
    app = create_app(engine, {cfg.org: cfg}, adapters=adapters.__getitem__)
    with serve_in_thread(app) as base, httpx.Client(base_url=base, timeout=10) as c:
        url = f"{base}/webhooks/hubspot/hsroute"
        body = json.dumps([event(1, int(contact))]).encode()
        ts = int(time.time() * 1000)
        resp = c.post(
            url,
            content=body,
            headers=signed_headers(HS_HOOK_SECRET, url, body, ts),
        )
        assert resp.status_code == 200, resp.text
        assert resp.json()["queued"] == 1

        def rescheduled() -> bool:
            with engine.connect() as conn:
                row = conn.execute(
                    text("SELECT state, attempts, last_error FROM intake_events")
                ).one()
            return bool(row.state == "pending" and row.last_error == "routing failed: RoutingError")

        wait_for(rescheduled)
    assert counts(engine) == stored(intake_events=1)
