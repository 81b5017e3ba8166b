"""HubSpot deliveries are authenticated before their bodies are buffered: the org and the
signature headers are checked before a byte of the body is read, bodies of senders not yet
authenticated share one budget (503 past it), and refusals are logged once per interval.
Real uvicorn, raw sockets, a real PostgreSQL."""

from __future__ import annotations

import base64
import json
import logging
import socket
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from sqlalchemy import Engine, text

from connector.core.config import OrgConfig
from connector.core.config_loading import parse_config
from connector.intake import receivers
from connector.intake.receivers import create_app
from connector.intake.signatures import sign_v3
from connector.routing.teams import apply_teams
from connector.shell.service import serve_in_thread

SECRET = "hs-client-secret-for-budget-tests"
PORTAL = 62515
NOW = 1_733_140_000.0
BUDGET = 65_536
YAML = f"""
org: globex
crm:
  kind: hubspot
  auth: {{access_token: "${{HS_TOKEN}}"}}
  object: contacts
  webhook_secrets: ["${{HS_SECRET}}"]
  portal_id: {PORTAL}
teams:
  - name: all
    members:
      - {{crm_user_id: "77", name: Ada}}
rules:
  - {{team: all}}
"""
EVENT = {
    "eventId": 1,
    "subscriptionId": 9,
    "portalId": PORTAL,
    "occurredAt": 1_733_139_000_000,
    "subscriptionType": "contact.creation",
    "attemptNumber": 0,
    "objectId": 101,
}


@pytest.fixture
def configs(engine: Engine) -> dict[str, OrgConfig]:
    cfg = parse_config(YAML, "globex.yaml", {"HS_TOKEN": "t", "HS_SECRET": SECRET})
    apply_teams(engine, cfg)
    return {"globex": cfg}


@contextmanager
def receiver(engine: Engine, configs: dict[str, OrgConfig]) -> Iterator[int]:
    app = create_app(engine, configs, clock=lambda: NOW, unauthenticated_bytes=BUDGET)
    with serve_in_thread(app) as base:
        yield int(base.rsplit(":", 1)[1])


def head(port: int, length: int, org: str = "globex", signature: str | None = None) -> bytes:
    sig = signature or base64.b64encode(b"x" * 32).decode()  # well formed, wrong
    return (
        f"POST /webhooks/hubspot/{org} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {length}\r\n"
        f"X-HubSpot-Signature-v3: {sig}\r\nX-HubSpot-Request-Timestamp: {int(NOW * 1000)}\r\n\r\n"
    ).encode()


def answer(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    sock.settimeout(10)
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        assert chunk, f"closed before an answer: {buf!r}"
        buf += chunk
    top, _, body = buf.partition(b"\r\n\r\n")
    lines = top.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])}
    while len(body) < int(headers.get("content-length", "0")):
        chunk = sock.recv(65536)
        assert chunk
        body += chunk
    return int(lines[0].split()[1]), headers, body


def stored(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT count(*) FROM intake_events")).scalar_one())


def test_refused_before_the_body_is_read(engine: Engine, configs: dict[str, OrgConfig]) -> None:
    """A 500,000-byte body is announced and never sent: an unknown org and a stale
    timestamp are answered at once (the server never waits for the body)."""
    stale = head(0, 500_000).replace(
        str(int(NOW * 1000)).encode(), str(int(NOW * 1000) - 400_000).encode()
    )
    with receiver(engine, configs) as port:
        for request in (head(port, 500_000, org="nobody"), stale):
            with socket.create_connection(("127.0.0.1", port)) as sock:
                sock.sendall(request)
                status, headers, body = answer(sock)
                assert (status, body) == (404, b'{"error":"not_found","message":"Not Found"}')
                assert headers["connection"] == "close"
    assert stored(engine) == 0


def test_unauthenticated_bytes_share_one_budget(
    engine: Engine, configs: dict[str, OrgConfig]
) -> None:
    """One sender holds 60,000 of the 65,536 bytes unauthenticated bodies may hold: the next
    stranger's 10,000 bytes get 503, a signed delivery fits once the bytes are given back."""
    with receiver(engine, configs) as port:
        holder = socket.create_connection(("127.0.0.1", port))
        holder.sendall(head(port, 64_000) + b" " * 60_000)
        try:
            # the holder's bytes reach the server on their own time: until they do, a
            # stranger's body still fits (and is a plain bad signature, 404)
            assert refused_for_want_of_room(port)
            holder.sendall(b" " * 4_000)  # the rest: its signature is checked, refused
            assert answer(holder)[0] == 404
        finally:
            holder.close()
        body = json.dumps([EVENT]).encode()
        url = f"http://127.0.0.1:{port}/webhooks/hubspot/globex"
        signed = sign_v3(SECRET, "POST", url, body, int(NOW * 1000))
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(head(port, len(body), signature=signed) + body)
            assert answer(sock)[0] == 200
    assert stored(engine) == 1


def refused_for_want_of_room(port: int) -> bool:
    """A stranger's 10,000-byte body gets 503 ``busy`` (within 20 tries)."""
    for _ in range(20):
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(head(port, 10_000) + b" " * 10_000)
            status, headers, body = answer(sock)
        assert headers["connection"] == "close"
        if status == 503:
            assert json.loads(body)["error"] == "busy"
            assert headers["retry-after"] == "5"
            return True
        assert (status, json.loads(body)["error"]) == (404, "not_found")
    return False


def test_refusals_are_logged_once_per_interval(
    engine: Engine, configs: dict[str, OrgConfig], caplog: pytest.LogCaptureFixture
) -> None:
    receivers._refusals._last.clear()
    with (
        caplog.at_level(logging.WARNING, "connector.intake.receivers"),
        receiver(engine, configs) as port,
    ):
        for _ in range(30):
            with socket.create_connection(("127.0.0.1", port)) as sock:
                sock.sendall(head(port, 2) + b"[]")
                assert answer(sock)[0] == 404
    lines = [r.getMessage() for r in caplog.records if "webhook refused" in r.getMessage()]
    assert lines == ["hubspot webhook refused for org globex: signature does not match"]
    assert stored(engine) == 0
