"""The admin listener as `connector run` serves it: the public listener's hardened server
(header deadline, header cap, connection cap), bodies read in full under a cap, the Host
allowlist, the Origin check, the sign-in backoff and expiring sessions. Real sockets, real
HTTP, a real database; each refusal checks its exact answer and that nothing changed."""

from __future__ import annotations

import logging
import re
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest
from sqlalchemy import Engine

from connector.core.config import ConfigError
from connector.core.metrics import Metrics
from connector.intake.http_server import DEFAULT_HEADER_TIMEOUT
from connector.shell import listeners, service
from connector.shell.admin_guard import (
    FREE_FAILURES,
    backoff_delay,
    host_name,
    origin_allowed,
)
from connector.shell.dashboard import security
from crm_sandboxes import SalesforceSandbox
from tests.helpers.dashboard_world import ORG, World, build_world, dead_row, outbox_states

TOKEN = "admin-token-for-the-listener-0123456789"
CLOSE_BOUND = 5.0


@pytest.fixture
def world(engine: Engine, sf: SalesforceSandbox) -> World:
    return build_world(engine, sf)


@contextmanager
def admin_listener(
    engine: Engine, world: World | None = None, token: str | None = None
) -> Iterator[tuple[str, int]]:
    """The admin listener exactly as `connector run` starts it; yields (base URL, port)."""
    configs = {ORG: world.cfg} if world is not None else {}
    with service._admin_listener(engine, configs, Metrics(), "127.0.0.1", 0, token) as base:
        yield base, int(base.rsplit(":", 1)[1])


def csrf_of(page: str) -> str:
    m = re.search(r'name="csrf" value="([0-9a-f]{64})"', page)
    assert m, "no CSRF value in the page"
    return m.group(1)


def rss_bytes() -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def read_until_closed(sock: socket.socket, bound: float) -> bytes:
    sock.settimeout(bound)
    data = b""
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return data
        if not chunk:
            return data
        data += chunk
    raise AssertionError(f"still open after {bound} s: {data[:80]!r}")


# --- the hardened server ---------------------------------------------------------------------


@pytest.mark.slow
def test_slow_headers_are_closed_and_cannot_hold_more_than_the_cap(engine: Engine) -> None:
    """200 connections that never finish their headers: those past the admin cap get a 503 at
    once, the rest are closed at the header deadline (a plain uvicorn kept them all)."""
    with admin_listener(engine) as (_, port):
        socks = []
        opened = time.monotonic()
        for _ in range(200):
            sock = socket.create_connection(("127.0.0.1", port), timeout=CLOSE_BOUND)
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
            socks.append(sock)
        answers = [read_until_closed(s, DEFAULT_HEADER_TIMEOUT + 2 * CLOSE_BOUND) for s in socks]
        elapsed = time.monotonic() - opened
        for s in socks:
            s.close()
    refused = [a for a in answers if a.startswith(b"HTTP/1.1 503 ")]
    timed_out = [a for a in answers if a.startswith(b"HTTP/1.1 408 ")]
    assert len(refused) == 200 - listeners.ADMIN_MAX_CONNECTIONS
    assert len(timed_out) == listeners.ADMIN_MAX_CONNECTIONS
    assert elapsed >= DEFAULT_HEADER_TIMEOUT * 0.9


def test_a_200_mib_header_is_refused_early(engine: Engine) -> None:
    """The head is capped at 16 KiB: the server answers 400 and closes long before 200 MiB
    arrive, and the process does not grow by anything like the header's size."""
    with admin_listener(engine) as (_, port):
        before = rss_bytes()
        sent = 0
        pad = b"a" * 1_048_576
        with socket.create_connection(("127.0.0.1", port), timeout=CLOSE_BOUND) as sock:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: ")
            try:
                while sent < 200 * 1_048_576:
                    sock.sendall(pad)
                    sent += len(pad)
            except (BrokenPipeError, ConnectionResetError, TimeoutError):
                pass
            answer = read_until_closed(sock, CLOSE_BOUND)
        grown = rss_bytes() - before
    assert sent < 32 * 1_048_576, f"{sent} bytes were taken in"
    assert answer == b"" or answer.startswith(b"HTTP/1.1 400 "), answer[:80]
    assert grown < 48 * 1_048_576, f"the process grew by {grown} bytes"


def test_admin_bodies_are_capped(engine: Engine, world: World) -> None:
    row = dead_row(engine)
    before = outbox_states(engine)
    with admin_listener(engine, world) as (base, _), httpx.Client(base_url=base) as c:
        csrf = csrf_of(c.get(f"/dashboard/org/{ORG}").text)
        resp = c.post(
            f"/dashboard/org/{ORG}/outbox/{row}/retry",
            data={"csrf": csrf, "pad": "x" * 20_000},
        )
        assert (resp.status_code, resp.text) == (413, "body exceeds 16384 bytes")
        assert resp.headers["connection"] == "close"
    assert outbox_states(engine) == before


# --- Host and Origin --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("header", "name"),
    [
        ("localhost:9100", "localhost"),
        ("LOCALHOST", "localhost"),
        ("[::1]:9100", "::1"),
        ("127.0.0.1", "127.0.0.1"),
        ("evil.example:9100", "evil.example"),
        ("", None),
        ("a b", None),
        ("evil.example:x", None),
        ("[::1", None),
        ("user@host", None),
    ],
)
def test_host_name(header: str, name: str | None) -> None:
    assert host_name(header) == name


def test_origin_allowed() -> None:
    host = "127.0.0.1:9100"
    assert origin_allowed("http://127.0.0.1:9100", host, "same-origin")
    assert origin_allowed(None, host, None)  # curl: no browser, no CSRF risk from a page
    assert not origin_allowed("http://evil.example", host, None)
    assert not origin_allowed("http://127.0.0.1:9101", host, None)
    assert origin_allowed("null", host, "same-origin")  # the dashboard's own form
    assert not origin_allowed("null", host, "cross-site")
    assert not origin_allowed(None, host, "cross-site")
    assert not origin_allowed("http://127.0.0.1:9100", host, "same-site")


def test_a_foreign_host_name_gets_400_and_no_session(engine: Engine, world: World) -> None:
    """DNS rebinding: a page on evil.example whose name now resolves to 127.0.0.1."""
    row = dead_row(engine)
    before = outbox_states(engine)
    with admin_listener(engine, world) as (base, port), httpx.Client(base_url=base) as c:
        good = c.get(f"/dashboard/org/{ORG}")
        csrf = csrf_of(good.text)
        evil = {"Host": f"evil.example:{port}"}
        for method, path, kw in (
            ("GET", "/dashboard/", {}),
            ("GET", f"/dashboard/org/{ORG}", {}),
            ("GET", "/healthz", {}),
            ("GET", "/metrics", {}),
            ("POST", f"/dashboard/org/{ORG}/outbox/{row}/retry", {"data": {"csrf": csrf}}),
        ):
            resp = c.request(method, path, headers=evil, **kw)
            assert (resp.status_code, resp.text) == (
                400,
                "Unknown Host: add it to CONNECTOR_ADMIN_HOSTS to use it.",
            ), path
            assert "set-cookie" not in resp.headers
        assert c.get("/healthz", headers={"Host": f"localhost:{port}"}).status_code == 200
    assert outbox_states(engine) == before


def test_configured_admin_hosts_are_answered(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CONNECTOR_ADMIN_HOSTS", "ops.example.com, tunnel.internal")
    with admin_listener(engine) as (base, port), httpx.Client(base_url=base) as c:
        for host in ("ops.example.com", f"tunnel.internal:{port}", "OPS.example.com."):
            assert c.get("/healthz", headers={"Host": host}).status_code == 200, host
        assert c.get("/healthz", headers={"Host": "example.com"}).status_code == 400


def test_a_cross_site_post_is_refused_before_the_csrf_check(engine: Engine, world: World) -> None:
    row = dead_row(engine)
    before = outbox_states(engine)
    url = f"/dashboard/org/{ORG}/outbox/{row}/retry"
    with admin_listener(engine, world) as (base, _), httpx.Client(base_url=base) as c:
        csrf = csrf_of(c.get(f"/dashboard/org/{ORG}").text)
        for headers in (
            {"Origin": "http://evil.example"},
            {"Origin": "null", "Sec-Fetch-Site": "cross-site"},
            {"Origin": "http://evil.example", "Sec-Fetch-Site": "same-origin"},
            {"Sec-Fetch-Site": "cross-site"},
        ):
            resp = c.post(url, data={"csrf": csrf}, headers=headers)
            assert (resp.status_code, resp.text) == (403, "Cross-site request refused."), headers
        assert outbox_states(engine) == before
        resp = c.post(url, data={"csrf": csrf}, headers={"Origin": base})
        assert resp.status_code == 303
    assert outbox_states(engine)[row] == ("pending", 0)


# --- sign-in ----------------------------------------------------------------------------------


def test_backoff_delay() -> None:
    assert [backoff_delay(n) for n in range(1, FREE_FAILURES + 1)] == [0.0] * FREE_FAILURES
    assert [backoff_delay(FREE_FAILURES + n) for n in (1, 2, 3, 4)] == [1.0, 2.0, 4.0, 8.0]
    assert backoff_delay(10_000) == 300.0


def test_failed_sign_ins_are_logged_and_slowed(
    engine: Engine, world: World, caplog: pytest.LogCaptureFixture
) -> None:
    wrong = [f"wrong-guess-{i}" for i in range(FREE_FAILURES + 1)]
    with (
        caplog.at_level(logging.WARNING, "connector.shell.admin_guard"),
        admin_listener(engine, world, TOKEN) as (base, _),
        httpx.Client(base_url=base) as c,
    ):
        for guess in wrong:
            assert c.post("/dashboard/login", data={"token": guess}).status_code == 401
        # past the free failures: even the right token waits, and is not checked meanwhile
        refused = c.post("/dashboard/login", data={"token": TOKEN})
        assert refused.status_code == 429
        assert refused.headers["retry-after"] == "1"
        assert "set-cookie" not in refused.headers
        # so does a bearer header from the same address
        assert c.get("/healthz", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 429
        assert c.get("/dashboard/login").status_code == 200  # no credential: not slowed

        def signed_in() -> bool:
            resp = c.post("/dashboard/login", data={"token": TOKEN})
            return resp.status_code == 303

        deadline = time.monotonic() + CLOSE_BOUND
        while not signed_in():
            assert time.monotonic() < deadline, "the backoff never ended"
            time.sleep(0.2)  # the wait IS the behaviour under test (a 1 s backoff)
        # a success clears the count: the next wrong guess is free again
        c.cookies.clear()
        assert c.post("/dashboard/login", data={"token": "again-wrong"}).status_code == 401
    text = caplog.text
    assert "admin sign-in failed from 127.0.0.1 (1 in a row; next accepted in 0 s)" in text
    assert "admin sign-in from 127.0.0.1 refused: retry in 1 s" in text
    for secret in (*wrong, TOKEN, "again-wrong"):
        assert secret not in text


def test_sessions_expire() -> None:
    now = [1_800_000_000.0]
    key = security.session_key("t" * 32, max_age=3600, clock=lambda: now[0])
    cookie = security.new_session(key)
    nonce = security.session_nonce(key, cookie)
    assert nonce is not None
    assert security.csrf_ok(key, cookie, security.csrf_token(key, nonce))
    now[0] += 3600
    assert security.session_nonce(key, cookie) == nonce
    now[0] += 1
    assert security.session_nonce(key, cookie) is None
    assert not security.csrf_ok(key, cookie, security.csrf_token(key, nonce))
    # a cookie whose issue time was changed is a forgery
    n, issued, sig = cookie.split(".")
    assert security.session_nonce(key, f"{n}.{int(issued) + 3600}.{sig}") is None


@pytest.mark.parametrize("raw", ["59", "31622401", "1h", "-5", "3600.5"])
def test_session_seconds_must_be_sane(raw: str) -> None:
    with pytest.raises(ConfigError, match="CONNECTOR_ADMIN_SESSION_SECONDS must be"):
        security.session_seconds_from_env({"CONNECTOR_ADMIN_SESSION_SECONDS": raw})
    assert security.session_seconds_from_env({"CONNECTOR_ADMIN_SESSION_SECONDS": "60"}) == 60
    assert security.session_seconds_from_env({}) == security.DEFAULT_SESSION_SECONDS


def test_a_short_admin_token_is_refused() -> None:
    with pytest.raises(ConfigError) as refused:
        listeners.check_admin_binding("127.0.0.1", "x" * 31)
    assert str(refused.value) == (
        "CONNECTOR_ADMIN_TOKEN is 31 characters; use at least 32 (e.g. python3 -c "
        '"import secrets; print(secrets.token_urlsafe(32))")'
    )
    listeners.check_admin_binding("0.0.0.0", "x" * 32)
