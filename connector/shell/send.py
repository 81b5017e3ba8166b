"""`connector send`: push records to a running connector the way the CRM would, for trying
it out: a Salesforce Outbound Message to the org's secret URL, or a HubSpot v3-signed webhook.

The bodies come from the product's own builders (``intake/soap.py``,
``intake/hubspot_events.py``, ``intake/signatures.py``), which its parsers read back. Building
a request is pure (``build_requests``); ``cmd_send`` posts them and prints each answer.
"""

from __future__ import annotations

import argparse
import os
import secrets
import string
import sys
import time
from dataclasses import dataclass

import httpx

from connector.core.config import HubSpotCrm, OrgConfig, SalesforceCrm
from connector.core.config_loading import config_path_from, load_configs, pick_org
from connector.core.errors import UsageError
from connector.intake.hubspot_events import HUBSPOT_OBJECT_TYPE_IDS, creation_events, events_body
from connector.intake.signatures import signed_headers
from connector.intake.soap import (
    MAX_NOTIFICATIONS,
    OUTBOUND_MESSAGE_HEADERS,
    build_outbound_message,
)
from crm_adapters.salesforce_ids import is_id

PER_REQUEST = 100  # records per message: Salesforce's own most; a HubSpot body takes more
SALESFORCE_OBJECTS = ("Lead", "Contact")
_HUBSPOT_MAX_ID = 2**63 - 1
_ID_CHARS = string.ascii_letters + string.digits
SEND_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Delivery:
    """One POST: where, what, and the URL as it may be printed (the URL secret hidden)."""

    url: str
    shown_url: str
    body: bytes
    headers: dict[str, str]
    records: int


def default_base_url(env: dict[str, str] | None = None) -> str:
    """The connector on this machine: its port is $CONNECTOR_PORT, as `connector run` takes it."""
    port = (os.environ if env is None else env).get("CONNECTOR_PORT") or "8080"
    return f"http://127.0.0.1:{port}"


def check_base_url(value: str) -> str:
    """``http(s)://host[:port]`` without a path; raises UsageError."""
    try:
        url = httpx.URL(value)
    except httpx.InvalidURL:
        url = httpx.URL("")
    if url.scheme not in ("http", "https") or not url.host or url.path not in ("", "/"):
        raise UsageError(
            f"send: --url {value!r}: give the connector's base URL, e.g. http://127.0.0.1:8080"
        )
    return value.rstrip("/")


def record_kind(cfg: OrgConfig, given: str | None) -> str:
    """The record kind the message names: ``--object``, else the org's ``crm.object``."""
    if given is None:
        return cfg.crm.object
    salesforce = isinstance(cfg.crm, SalesforceCrm)
    known = SALESFORCE_OBJECTS if salesforce else tuple(HUBSPOT_OBJECT_TYPE_IDS)
    if given not in known:
        raise UsageError(
            f"send: unknown record kind {given!r} for {cfg.crm.kind} org {cfg.org!r} "
            f"(known: {', '.join(known)})"
        )
    return given


def check_record_ids(cfg: OrgConfig, ids: list[str]) -> list[str]:
    """The ids, each checked to be an id of the org's CRM; raises UsageError for the first
    that is not (it is not echoed: it may be anything a person pasted)."""
    for n, value in enumerate(ids, 1):
        if isinstance(cfg.crm, SalesforceCrm):
            if not is_id(value):
                raise UsageError(
                    f"send: record {n} is not a Salesforce record id (15 or 18 letters and digits)"
                )
        elif not (value.isascii() and value.isdigit() and 0 < int(value) <= _HUBSPOT_MAX_ID):
            raise UsageError(f"send: record {n} is not a HubSpot record id (a whole number)")
    return ids


def _notification_id() -> str:
    """An id shaped like Salesforce's notification ids (04l...): new for every message."""
    return "04l" + "".join(secrets.choice(_ID_CHARS) for _ in range(12)) + "AAA"


def _chunks(ids: list[str]) -> list[list[str]]:
    return [ids[i : i + PER_REQUEST] for i in range(0, len(ids), PER_REQUEST)]


def salesforce_deliveries(
    cfg: OrgConfig, crm: SalesforceCrm, base_url: str, kind: str, ids: list[str]
) -> list[Delivery]:
    """Outbound Messages to ``/webhooks/salesforce/{org}/{secret}``, at most 100 records each."""
    assert PER_REQUEST <= MAX_NOTIFICATIONS
    if not crm.organization_id:
        raise UsageError(
            f"send: org {cfg.org!r} has no crm.organization_id: the connector refuses "
            "Outbound Messages without one"
        )
    if not crm.outbound_secrets:
        raise UsageError(
            f"send: org {cfg.org!r} has no crm.outbound_secrets: the connector refuses "
            "Outbound Messages without one"
        )
    secret = crm.outbound_secrets[0].get_secret_value()
    path = f"/webhooks/salesforce/{cfg.org}/"
    out = []
    for chunk in _chunks(ids):
        body = build_outbound_message(
            crm.organization_id,
            [(_notification_id(), kind, {"Id": rid}) for rid in chunk],
            enterprise_url=f"{crm.instance_url.rstrip('/')}/services/Soap/c/{crm.api_version}",
            partner_url=f"{crm.instance_url.rstrip('/')}/services/Soap/u/{crm.api_version}",
        )
        out.append(
            Delivery(
                f"{base_url}{path}{secret}",
                f"{base_url}{path}<crm.outbound_secrets[0]>",
                body,
                dict(OUTBOUND_MESSAGE_HEADERS),
                len(chunk),
            )
        )
    return out


def hubspot_deliveries(
    cfg: OrgConfig, crm: HubSpotCrm, base_url: str, kind: str, ids: list[str], now_ms: int
) -> list[Delivery]:
    """Webhooks to ``/webhooks/hubspot/{org}``, signed (v3) with the first of the org's
    ``webhook_secrets`` (the app's client secret), one creation event per record."""
    if not crm.webhook_secrets or crm.portal_id is None:
        raise UsageError(
            f"send: org {cfg.org!r} has no crm.webhook_secrets: the connector refuses "
            "HubSpot webhooks without one"
        )
    secret = crm.webhook_secrets[0].get_secret_value()
    url = f"{base_url}/webhooks/hubspot/{cfg.org}"
    out = []
    first_event = now_ms * 1000  # new for every run, like HubSpot's event ids
    for n, chunk in enumerate(_chunks(ids)):
        events = creation_events(
            crm.portal_id, kind, [int(i) for i in chunk], first_event + n * PER_REQUEST, now_ms
        )
        body = events_body(events)
        out.append(Delivery(url, url, body, signed_headers(secret, url, body, now_ms), len(chunk)))
    return out


def build_requests(
    cfg: OrgConfig, base_url: str, ids: list[str], kind: str | None, now_ms: int
) -> list[Delivery]:
    """What `connector send` posts for these records of this org; raises UsageError."""
    base_url = check_base_url(base_url)
    which = record_kind(cfg, kind)
    ids = check_record_ids(cfg, ids)
    if isinstance(cfg.crm, SalesforceCrm):
        return salesforce_deliveries(cfg, cfg.crm, base_url, which, ids)
    return hubspot_deliveries(cfg, cfg.crm, base_url, which, ids, now_ms)


def acknowledged(cfg: OrgConfig, response: httpx.Response) -> bool:
    """Did the connector take the delivery (Salesforce: 200 with ``<Ack>true</Ack>``)?"""
    if isinstance(cfg.crm, SalesforceCrm):
        return response.status_code == 200 and b"<Ack>true</Ack>" in response.content
    return response.status_code == 200


def _unreachable(base_url: str, exc: httpx.HTTPError) -> UsageError:
    why = {
        httpx.ConnectError: "nothing answers there (is `connector run` running?)",
        httpx.TimeoutException: f"no answer within {SEND_TIMEOUT_S:g} s",
    }
    reason = next((v for k, v in why.items() if isinstance(exc, k)), type(exc).__name__)
    return UsageError(f"send: cannot reach the connector at {base_url}: {reason}")


def cmd_send(args: argparse.Namespace) -> int:
    cfg = pick_org(load_configs(config_path_from(args.config)), args.org)
    base_url = args.url or default_base_url()
    now_ms = int(time.time() * 1000)
    deliveries = build_requests(cfg, base_url, args.record_ids, args.object, now_ms)
    taken = True
    with httpx.Client(timeout=SEND_TIMEOUT_S) as client:
        for d in deliveries:
            try:
                response = client.post(d.url, content=d.body, headers=d.headers)
            except httpx.HTTPError as exc:
                raise _unreachable(check_base_url(base_url), exc) from None
            what = "Outbound Message" if isinstance(cfg.crm, SalesforceCrm) else "webhook"
            plural = "" if d.records == 1 else "s"
            print(f"POST {d.shown_url} ({what}, {d.records} record{plural})")
            # flushed: on a pipe, the refusal on stderr below must not come before it
            print(f"HTTP {response.status_code} {response.text.strip()}", flush=True)
            ok = acknowledged(cfg, response)
            taken = taken and ok
            if not ok:
                print(f"connector: send: the connector did not take the {what}", file=sys.stderr)
    return 0 if taken else 1
