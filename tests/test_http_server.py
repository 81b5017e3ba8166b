"""The public listener's limits, against a real uvicorn on 127.0.0.1 and raw sockets.

Timing assertions are one-sided and loose (the machine is shared): a connection must close
within a generous bound, and not before the deadline that should close it.
"""

from __future__ import annotations

import asyncio
import resource
import select
import socket
import threading
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from connector.intake.admission import DEFAULT_MAX_CONNECTIONS_PER_PEER
from connector.intake.http_server import (
    DEFAULT_MAX_CONNECTIONS,
    BodyError,
    HeaderTimeoutH11Protocol,
    HeaderTimeoutHttpToolsProtocol,
    build_server,
    read_body,
    receiver_config,
)
from testbed.waiting import wait_until

HEADER_TIMEOUT = 0.4
BODY_TIMEOUT = 0.6
BODY_LIMIT = 1_000
CLOSE_BOUND = 5.0  # seconds: "closed eventually", never a tight figure
PROTOCOL = {"http": "httptools"}


@pytest.fixture(autouse=True, params=["httptools", "h11"])
def protocol(request: pytest.FixtureRequest) -> Iterator[str]:
    """Every server test runs against both protocol classes: each must enforce every limit."""
    PROTOCOL["http"] = request.param
    yield request.param
    PROTOCOL["http"] = "httptools"


def make_app(
    seen: list[str], body_timeout: float, reading: threading.Event | None = None
) -> Starlette:
    """Echo the body's length through read_body; ``seen`` collects the BodyError codes and
    ``reading`` is set when the handler starts reading a body."""

    async def echo(request: Request) -> Response:
        if reading is not None:
            reading.set()
        try:
            body = await read_body(request, BODY_LIMIT, body_timeout)
        except BodyError as exc:
            seen.append(exc.code)
            return JSONResponse({"error": exc.code}, exc.status, headers=exc.headers)
        return JSONResponse({"length": len(body)})

    async def ok(request: Request) -> Response:
        return PlainTextResponse("ok")

    async def slow(request: Request) -> Response:
        await asyncio.sleep(HEADER_TIMEOUT * 2)
        return PlainTextResponse("slow")

    return Starlette(
        routes=[
            Route("/echo", echo, methods=["POST"]),
            Route("/ok", ok),
            Route("/slow", slow),
        ]
    )


@contextmanager
def running(
    seen: list[str] | None = None,
    body_timeout: float = BODY_TIMEOUT,
    reading: threading.Event | None = None,
    **limits: Any,
) -> Iterator[int]:
    """A real server in a thread on an ephemeral port; yields the port."""
    limits.setdefault("header_timeout", HEADER_TIMEOUT)
    limits.setdefault("http", PROTOCOL["http"])
    app = make_app([] if seen is None else seen, body_timeout, reading)
    server = build_server(app, "127.0.0.1", 0, **limits)
    thread = threading.Thread(target=server.run, name="test-http-server", daemon=True)
    thread.start()

    def started() -> bool:
        assert thread.is_alive(), "server thread died"
        return bool(server.started)

    wait_until(started, 20, "the server to start", interval=0.01)
    try:
        yield server.servers[0].sockets[0].getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(15)


def connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=CLOSE_BOUND)
    sock.settimeout(CLOSE_BOUND)
    return sock


# Bytes read past the end of one response (pipelined answers can arrive in one recv).
_LEFTOVER: weakref.WeakKeyDictionary[socket.socket, bytes] = weakref.WeakKeyDictionary()


def read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One response: status, lower-cased headers, body (by Content-Length); bytes of the
    next response that came in the same read are kept for the next call."""
    buf = _LEFTOVER.pop(sock, b"")
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        assert chunk, f"closed before a complete response: {buf!r}"
        buf += chunk
    head, _, body = buf.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])}
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, "closed mid-body"
        body += chunk
    if len(body) > length:
        _LEFTOVER[sock] = body[length:]
    return int(lines[0].split()[1]), headers, body[:length]


def wait_closed(sock: socket.socket, since: float) -> tuple[float, bytes]:
    """Read until the server closes; returns seconds since ``since`` and what was read."""
    data = b""
    while True:
        remaining = since + CLOSE_BOUND - time.monotonic()
        assert remaining > 0, f"still open after {CLOSE_BOUND} s (read {data!r})"
        sock.settimeout(remaining)
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            chunk = b""
        except TimeoutError:
            continue
        if not chunk:
            return time.monotonic() - since, data
        data += chunk


def get(path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: test\r\n\r\n".encode()


def post_head(length: int | None = None, *extra: str) -> bytes:
    lines = ["POST /echo HTTP/1.1", "Host: test", *extra]
    if length is not None:
        lines.append(f"Content-Length: {length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


# --- configuration ------------------------------------------------------------------------


def test_config_flags(protocol: str) -> None:
    config = receiver_config(PlainTextResponse("x"), "127.0.0.1", 0)
    assert config.http is HeaderTimeoutHttpToolsProtocol  # the default
    assert config.max_header_bytes == 16_384
    chosen = receiver_config(PlainTextResponse("x"), "127.0.0.1", 0, http=protocol)  # type: ignore[arg-type]
    assert chosen.http is {"h11": HeaderTimeoutH11Protocol}.get(
        protocol, HeaderTimeoutHttpToolsProtocol
    )
    assert config.header_timeout == 10.0
    assert config.proxy_headers is False
    assert config.access_log is False
    assert config.server_header is False
    assert config.timeout_keep_alive == 5
    # uvicorn counts the asking connection among the open ones: served = limit - 1.
    assert config.limit_concurrency == DEFAULT_MAX_CONNECTIONS + 1
    with pytest.raises(ValueError):
        receiver_config(PlainTextResponse("x"), "127.0.0.1", 0, header_timeout=0)
    with pytest.raises(ValueError):
        receiver_config(PlainTextResponse("x"), "127.0.0.1", 0, max_connections=0)


# --- header timeout -----------------------------------------------------------------------


def test_slowloris_half_request_line_is_closed() -> None:
    with running() as port, connect(port) as sock:
        opened = time.monotonic()
        sock.sendall(b"POST /ec")
        elapsed, data = wait_closed(sock, opened)
    assert elapsed >= HEADER_TIMEOUT * 0.9, f"closed after {elapsed:.2f} s, before the deadline"
    assert data.startswith(b"HTTP/1.1 408 ")


def test_silent_connection_is_closed_without_a_response() -> None:
    with running() as port, connect(port) as sock:
        opened = time.monotonic()
        elapsed, data = wait_closed(sock, opened)
    assert elapsed >= HEADER_TIMEOUT * 0.9
    assert data == b""


def test_trickled_headers_are_closed() -> None:
    closed_after: float | None = None
    with running() as port, connect(port) as sock:
        opened = time.monotonic()
        sock.sendall(b"GET /ok HTTP/1.1\r\nHost: test\r\nX-Pad: ")
        for _ in range(100):  # one byte per 50 ms: at most 5 s
            try:
                sock.sendall(b"a")
            except OSError:
                break  # the server is gone
            readable, _, _ = select.select([sock], [], [], 0.05)
            if readable:
                break
        closed_after, _ = wait_closed(sock, opened)
    assert closed_after >= HEADER_TIMEOUT * 0.9


def test_keep_alive_works_and_rearms_the_header_deadline() -> None:
    with running(keep_alive_timeout=30) as port, connect(port) as sock:
        for _ in range(3):
            sock.sendall(get("/ok"))
            status, headers, body = read_response(sock)
            assert (status, body) == (200, b"ok")
            assert "server" not in headers
        sock.sendall(post_head(5) + b"hello")
        assert read_response(sock)[:3:2] == (200, b'{"length":5}')
        responded = time.monotonic()
        sock.sendall(b"GET /ok HT")  # the next request stalls: the deadline runs again
        elapsed, data = wait_closed(sock, responded)
    assert elapsed >= HEADER_TIMEOUT * 0.9
    assert data.startswith(b"HTTP/1.1 408 ")


def test_pipelined_requests_are_served() -> None:
    with running() as port, connect(port) as sock:
        sock.sendall(get("/ok") + get("/slow") + get("/ok"))
        assert [read_response(sock)[2] for _ in range(3)] == [b"ok", b"slow", b"ok"]


def test_a_slow_handler_is_not_cut_off() -> None:
    # Headers in time: the app may take longer than the header deadline.
    with running() as port, connect(port) as sock:
        sock.sendall(get("/slow"))
        assert read_response(sock)[::2] == (200, b"slow")


def test_a_body_slower_than_the_header_deadline_is_read() -> None:
    # The body has its own (here generous) deadline; the header one must not cut it.
    with running(body_timeout=CLOSE_BOUND) as port, connect(port) as sock:
        sock.sendall(post_head(8))
        for _ in range(4):  # spans about twice the header deadline
            time.sleep(HEADER_TIMEOUT / 2)  # not synchronisation: the slow sender IS the test
            sock.sendall(b"ab")
        assert read_response(sock)[::2] == (200, b'{"length":8}')


def test_oversize_pending_headers_are_refused() -> None:
    # A head not complete yet is capped (16 KiB by default).
    with running() as port, connect(port) as sock:
        sock.sendall(b"GET /ok HTTP/1.1\r\nHost: test\r\nX-Pad: " + b"a" * 20_000)
        assert read_response(sock)[0] == 400
        wait_closed(sock, time.monotonic())


def test_a_head_trickled_past_the_cap_is_refused() -> None:
    # Counted across socket reads, and again for each request on a keep-alive connection.
    with running(max_header_bytes=4_000, keep_alive_timeout=30) as port, connect(port) as sock:
        sock.sendall(post_head(5) + b"hello")
        assert read_response(sock)[::2] == (200, b'{"length":5}')
        sock.sendall(b"GET /ok HTTP/1.1\r\nHost: test\r\nX-Pad: ")
        status = None
        for _ in range(20):  # 20 x 500 bytes: past the cap after 8
            try:
                sock.sendall(b"a" * 500)
            except OSError:
                break  # the server is gone
            readable, _, _ = select.select([sock], [], [], 0.02)
            if readable:
                status = read_response(sock)[0]
                break
        assert status == 400
        wait_closed(sock, time.monotonic())


def test_a_head_under_the_cap_is_served() -> None:
    with running(max_header_bytes=4_000) as port, connect(port) as sock:
        sock.sendall(b"GET /ok HTTP/1.1\r\nHost: test\r\nX-Pad: " + b"a" * 3_000 + b"\r\n\r\n")
        assert read_response(sock)[::2] == (200, b"ok")


# --- bodies -------------------------------------------------------------------------------


def test_stalled_body_gets_408() -> None:
    seen: list[str] = []
    with running(seen) as port, connect(port) as sock:
        sock.sendall(post_head(100) + b"x" * 10)
        sent = time.monotonic()
        status, headers, body = read_response(sock)
        waited = time.monotonic() - sent
        assert (status, body) == (408, b'{"error":"body_timeout"}')
        assert headers["connection"] == "close"
        wait_closed(sock, time.monotonic())
    assert waited >= BODY_TIMEOUT * 0.9
    assert seen == ["body_timeout"]


def test_oversize_content_length_is_refused_before_reading() -> None:
    with running() as port, connect(port) as sock:
        # Expect: 100-continue: refusing before reading means no "100 Continue" is sent.
        sock.sendall(post_head(10_000_000, "Expect: 100-continue"))
        status, headers, body = read_response(sock)
        assert (status, body) == (413, b'{"error":"body_too_large"}')
        assert headers["connection"] == "close"
        wait_closed(sock, time.monotonic())


def test_chunked_body_over_the_limit_is_counted() -> None:
    chunk = b"y" * (BODY_LIMIT + 1)
    with running() as port, connect(port) as sock:
        sock.sendall(
            post_head(None, "Transfer-Encoding: chunked")
            + f"{len(chunk):x}\r\n".encode()
            + chunk
            + b"\r\n0\r\n\r\n"
        )
        assert read_response(sock)[::2] == (413, b'{"error":"body_too_large"}')


def test_body_at_the_limit_is_read() -> None:
    with running() as port, connect(port) as sock:
        sock.sendall(post_head(BODY_LIMIT) + b"z" * BODY_LIMIT)
        assert read_response(sock)[::2] == (200, b'{"length":%d}' % BODY_LIMIT)


def test_client_gone_mid_body_is_client_disconnected() -> None:
    seen: list[str] = []
    reading = threading.Event()
    with running(seen, reading=reading) as port:
        with connect(port) as sock:
            sock.sendall(post_head(100) + b"x" * 10)
            assert reading.wait(CLOSE_BOUND), "the handler never started reading the body"
        wait_until(lambda: seen, CLOSE_BOUND, "the handler to see the client go")
    assert seen == ["client_disconnected"]


# --- connection limit ---------------------------------------------------------------------


def test_connections_beyond_max_get_503() -> None:
    limits: dict[str, Any] = {"max_connections": 2, "header_timeout": 30, "keep_alive_timeout": 30}
    with running(**limits) as port:
        held = [connect(port), connect(port)]
        try:
            for sock in held:
                sock.sendall(get("/ok"))
                assert read_response(sock)[0] == 200  # both served and kept open
            with connect(port) as extra:
                # refused when it is accepted, before it sent anything
                status, headers, body = read_response(extra)
                assert (status, body) == (503, b"Service Unavailable")
                assert headers["connection"] == "close"
                wait_closed(extra, time.monotonic())
            held.pop().close()
            # A slot is free once the server has seen the close: a bounded retry.
            statuses: list[int] = []

            def served() -> bool:
                with connect(port) as again:
                    again.sendall(get("/ok"))
                    statuses.append(read_response(again)[0])
                return statuses[-1] == 200

            wait_until(served, CLOSE_BOUND, "a freed connection slot", interval=0.05)
            assert statuses[-1] == 200, statuses
        finally:
            for sock in held:
                sock.close()


SLOW_SENDERS = 1_050
DELIVERIES = 20


def connect_from(source: str, port: int) -> socket.socket:
    """A connection to the server from ``source``, another loopback address (127.0.0.0/8
    is all loopback on Linux)."""
    sock = socket.create_connection(
        ("127.0.0.1", port), timeout=CLOSE_BOUND, source_address=(source, 0)
    )
    sock.settimeout(CLOSE_BOUND)
    return sock


def raise_soft_file_limit(needed: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, needed), hard))
    if resource.getrlimit(resource.RLIMIT_NOFILE)[0] < needed:
        pytest.skip(f"this test needs {needed} open files; the hard limit is {hard}")


@pytest.mark.parametrize("per_peer", [DEFAULT_MAX_CONNECTIONS_PER_PEER, None])
def test_one_address_cannot_take_every_slot(per_peer: int | None) -> None:
    """1,050 connections from 127.0.0.1 that never finish their headers; deliveries from
    127.0.0.2 are served. Without the per-peer cap (None) the same flood takes every one of
    the 1,000 slots and the deliveries are refused: the test catches the naive server."""
    raise_soft_file_limit(3 * SLOW_SENDERS + 200)  # client and server ends, plus slack
    limits: dict[str, Any] = {
        "header_timeout": 60,
        "keep_alive_timeout": 30,
        "max_connections_per_peer": per_peer,
    }
    slow: list[socket.socket] = []
    with running(**limits) as port:
        try:
            for _ in range(SLOW_SENDERS):
                sock = connect_from("127.0.0.1", port)
                sock.sendall(b"POST /echo HTTP/1.1\r\nHost: test\r\nX-Slow: ")
                slow.append(sock)
            # the server has accepted every one and answered those over a cap (503, closed)
            admitted = per_peer or DEFAULT_MAX_CONNECTIONS
            wait_until(
                lambda: answered(slow) >= SLOW_SENDERS - admitted,
                CLOSE_BOUND * 4,
                "the connections over the cap to be refused",
            )
            statuses = []
            for _ in range(DELIVERIES):
                with connect_from("127.0.0.2", port) as sock:
                    sock.sendall(post_head(5) + b"hello")
                    try:
                        statuses.append(read_response(sock)[0])
                    except (AssertionError, ConnectionResetError):
                        statuses.append(0)  # closed without an answer
            refused = answered(slow)
        finally:
            for sock in slow:
                sock.close()
    assert refused == SLOW_SENDERS - admitted
    assert statuses == [503 if per_peer is None else 200] * DELIVERIES, statuses


def answered(socks: list[socket.socket]) -> int:
    """How many of ``socks`` have something to read (poll: their descriptors pass 1,024)."""
    poller = select.poll()
    for sock in socks:
        poller.register(sock, select.POLLIN)
    return len(poller.poll(0))
