"""The uvicorn server for the public webhook listener, with limits a stranger cannot outlast.

Each limit and what it protects against:

* ``header_timeout`` (our protocol subclasses; uvicorn has no such setting): a connection
  must deliver its request line and headers within this many seconds of being opened, or of
  its previous response finishing. Stops slowloris clients that open connections and trickle
  (or never send) header bytes to hold sockets and connection slots forever; uvicorn's own
  keep-alive timer is reset by every byte received, so it does not stop a trickle.
* ``max_connections`` and ``max_connections_per_peer`` (``connector.intake.admission``): a
  connection opened while ``max_connections`` are open, or from a peer that already holds
  ``max_connections_per_peer``, gets a bare 503 and is closed at once, so one address cannot
  take every slot and the open sockets stay within the file limit the cap was derived from;
  uvicorn's ``limit_concurrency`` (the same cap) also bounds the requests in flight. Behind
  ``trusted_proxies`` the per-peer cap counts each forwarded client's requests in flight.
* ``keep_alive_timeout``: an idle keep-alive connection is closed after this many seconds.
* ``max_header_bytes``: a request head still incomplete after this many bytes is refused with
  400, so a connection's pending headers cannot grow memory without bound (a head that
  arrives complete in one socket read is parsed whole). With h11 this is its
  incomplete-event cap; with httptools our subclass counts the bytes fed to the parser while
  a head is pending (llhttp itself has no limit).
* ``read_body(limit, timeout)``: the body is capped in bytes while it streams in (a declared
  Content-Length over the cap is refused before reading) and must arrive in full within
  ``timeout`` seconds, so neither an oversize nor a stalled body ties up a request.

The protocol is uvicorn's httptools implementation (llhttp, in C; a dependency of this
project) with the limits above added by ``HeaderTimeoutHttpToolsProtocol``; ``http="h11"``
selects the pure-Python h11 one (``HeaderTimeoutH11Protocol``), which enforces the same
limits. The event loop is uvloop when it is installed (uvicorn's ``loop="auto"``; uvloop is a
dependency). BENCHMARKS.md "Webhooks" has what an ACK costs with them (measured together with
the receivers' other changes, not apart).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from contextlib import aclosing, contextmanager
from typing import Any, Literal

import h11
import uvicorn
from starlette.requests import ClientDisconnect, Request
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from connector.intake.admission import (
    DEFAULT_MAX_CONNECTIONS_PER_PEER,
    SERVICE_UNAVAILABLE,
    Admission,
    ForwardedPeerLimit,
    transport_peer,
)
from connector.intake.senders import IPNetwork

DEFAULT_HEADER_TIMEOUT = 10.0
DEFAULT_BODY_TIMEOUT = 30.0
"""A capped 1 MiB body takes about 8 s at 1 Mbit/s; 30 s leaves room for a slow sender."""
DEFAULT_KEEP_ALIVE_TIMEOUT = 5
DEFAULT_MAX_CONNECTIONS = 1000
DEFAULT_MAX_HEADER_BYTES = 16_384

_REQUEST_TIMEOUT_RESPONSE = (
    b"HTTP/1.1 408 Request Timeout\r\n"
    b"Content-Type: text/plain; charset=utf-8\r\n"
    b"Content-Length: 15\r\n"
    b"Connection: close\r\n\r\n"
    b"Request Timeout"
)


class ReceiverConfig(uvicorn.Config):
    """A uvicorn Config that also carries the header limits and the connection admission our
    protocol classes read."""

    def __init__(
        self,
        app: Any,
        *,
        header_timeout: float,
        max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES,
        admission: Admission | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(app, **kwargs)
        self.header_timeout = header_timeout
        self.max_header_bytes = max_header_bytes
        self.admission = admission


class _Admitted:
    """Connection admission (``connector.intake.admission``): a connection over the total cap
    or its peer's gets a bare 503 and is closed before the HTTP protocol sees it."""

    admission: Admission | None
    _admitted: bool
    _peer_key: str | None

    def _init_admission(self, config: uvicorn.Config) -> None:
        self.admission = config.admission if isinstance(config, ReceiverConfig) else None
        self._admitted = True
        self._peer_key = None

    def connection_made(self, transport: asyncio.Transport) -> None:
        if self.admission is not None:
            self._admitted, self._peer_key = self.admission.admit(transport_peer(transport))
            if not self._admitted:
                transport.write(SERVICE_UNAVAILABLE)
                transport.close()
                return
        super().connection_made(transport)  # type: ignore[misc]

    def connection_lost(self, exc: Exception | None) -> None:
        if not self._admitted:
            return
        if self.admission is not None:
            self.admission.release(self._peer_key)
            self.admission = None  # released once
        super().connection_lost(exc)  # type: ignore[misc]

    def data_received(self, data: bytes) -> None:
        if self._admitted:
            super().data_received(data)  # type: ignore[misc]


class _HeaderDeadline:
    """The header deadline both protocols share: armed by ``_arm_header_timer``, cancelled
    when a request's headers are complete, and when it fires, a client that had started a
    request gets a bare 408 and the connection is closed (``_head_started`` says whether it
    had)."""

    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport
    cycle: Any
    header_timeout: float
    _header_timer: asyncio.TimerHandle | None

    def _head_started(self) -> bool:
        raise NotImplementedError

    def connection_made(self, transport: asyncio.Transport) -> None:
        """Start the clock as soon as the socket is accepted, before any byte arrives."""
        super().connection_made(transport)  # type: ignore[misc]
        self._arm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        """A closed connection needs no deadline."""
        self._cancel_header_timer()
        super().connection_lost(exc)  # type: ignore[misc]

    def _arm_header_timer(self) -> None:
        self._cancel_header_timer()
        self._header_timer = self.loop.call_later(self.header_timeout, self._header_timeout)

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _header_timeout(self) -> None:
        """Close a connection whose request line and headers did not arrive in time."""
        self._header_timer = None
        if self.transport.is_closing():
            return
        if self.cycle is not None and not self.cycle.response_complete:
            return  # a request is with the app; the body has its own timeout
        if self._head_started() and self.transport.get_write_buffer_size() == 0:
            self.transport.write(_REQUEST_TIMEOUT_RESPONSE)
        if self.transport.get_write_buffer_size():
            # The client is not reading either: do not wait for it to drain the buffer.
            self.transport.abort()
        else:
            self.transport.close()


# (uvicorn's protocols narrow connection_made to asyncio.Transport, as the mixin does)
class HeaderTimeoutH11Protocol(_Admitted, _HeaderDeadline, H11Protocol):  # type: ignore[misc]
    """uvicorn's h11 protocol plus a deadline for each request's line and headers.

    The timer is armed when the connection opens and when a response completes, and is
    cancelled when a new request cycle starts (its headers are complete). When it fires, a
    client that had sent part of a request gets a bare 408; the connection is then closed.
    """

    def __init__(self, config: uvicorn.Config, *args: Any, **kwargs: Any) -> None:
        super().__init__(config, *args, **kwargs)
        self.header_timeout = (
            config.header_timeout if isinstance(config, ReceiverConfig) else DEFAULT_HEADER_TIMEOUT
        )
        self._header_timer: asyncio.TimerHandle | None = None
        self._init_admission(config)

    def handle_events(self) -> None:
        """A new request cycle means its headers are complete: the deadline was met."""
        before = self.cycle
        super().handle_events()
        if self.cycle is not before:
            self._cancel_header_timer()

    def on_response_complete(self) -> None:
        """The next request on a keep-alive connection gets a fresh header deadline.

        Armed before uvicorn's own handling, which may at once start a pipelined request
        (and so cancel it again through ``handle_events``).
        """
        self._arm_header_timer()
        super().on_response_complete()

    def _head_started(self) -> bool:
        return self.conn.their_state is h11.IDLE and bool(self.conn.trailing_data[0])


class HeaderTimeoutHttpToolsProtocol(_Admitted, _HeaderDeadline, HttpToolsProtocol):  # type: ignore[misc]
    """uvicorn's httptools protocol plus the header deadline and a cap on a pending head.

    The deadline works as in ``HeaderTimeoutH11Protocol``: armed when the connection opens
    and when a response completes with no pipelined request waiting, cancelled when a
    request's headers are complete. The head cap counts the bytes fed to the parser from the
    end of the previous request (or the connection's start) until the headers are complete;
    bytes of a new head that share a socket read with the end of a body are not counted.
    """

    def __init__(self, config: uvicorn.Config, *args: Any, **kwargs: Any) -> None:
        super().__init__(config, *args, **kwargs)
        receiver = config if isinstance(config, ReceiverConfig) else None
        self.header_timeout = receiver.header_timeout if receiver else DEFAULT_HEADER_TIMEOUT
        self.max_header_bytes = receiver.max_header_bytes if receiver else DEFAULT_MAX_HEADER_BYTES
        self._header_timer: asyncio.TimerHandle | None = None
        self._head_bytes: int | None = 0  # None while no head is pending (a body is)
        self._init_admission(config)

    def data_received(self, data: bytes) -> None:
        """Feed the parser; refuse a head that is still incomplete past the cap."""
        if not self._admitted:
            return
        if self._head_bytes is not None:
            self._head_bytes += len(data)
        super().data_received(data)
        if (
            self._head_bytes is not None
            and self._head_bytes > self.max_header_bytes
            and self.parser is not None
            and not self.transport.is_closing()
        ):
            self._cancel_header_timer()
            self.send_400_response("Request headers are too large.")

    def on_headers_complete(self) -> None:
        """The deadline was met: a request cycle starts (or is queued behind one)."""
        self._head_bytes = None
        self._cancel_header_timer()
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._head_bytes = 0
        super().on_message_complete()

    def on_response_complete(self) -> None:
        """The next request on a keep-alive connection gets a fresh header deadline, unless
        a pipelined request (headers already complete) starts at once."""
        pipelined = bool(self.pipeline)
        super().on_response_complete()
        if not pipelined and not self.transport.is_closing():
            self._arm_header_timer()

    def _head_started(self) -> bool:
        return bool(self._head_bytes)


PROTOCOLS: dict[str, type[asyncio.Protocol]] = {
    "httptools": HeaderTimeoutHttpToolsProtocol,
    "h11": HeaderTimeoutH11Protocol,
}


def receiver_config(
    app: Any,
    host: str,
    port: int,
    *,
    header_timeout: float = DEFAULT_HEADER_TIMEOUT,
    keep_alive_timeout: int = DEFAULT_KEEP_ALIVE_TIMEOUT,
    max_connections: int = DEFAULT_MAX_CONNECTIONS,
    max_connections_per_peer: int | None = DEFAULT_MAX_CONNECTIONS_PER_PEER,
    trusted_proxies: Sequence[IPNetwork] = (),
    max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES,
    log_level: str = "warning",
    lifespan: Literal["auto", "on", "off"] = "auto",
    http: Literal["httptools", "h11"] = "httptools",
) -> ReceiverConfig:
    """The public listener's uvicorn Config: every limit in the module docstring is set here.

    ``max_connections`` is the number of open connections that are served (a connection
    opened past it is refused); uvicorn counts the connection asking among the open ones and
    answers 503 when that count reaches ``limit_concurrency``, so that is set one higher.
    ``max_connections_per_peer`` (None: no such cap) is the most one address may hold; behind
    ``trusted_proxies`` it caps each forwarded client's requests in flight.
    """
    if header_timeout <= 0 or keep_alive_timeout <= 0:
        raise ValueError("timeouts must be positive")
    admission = Admission(max_connections, max_connections_per_peer, trusted_proxies)
    if trusted_proxies and max_connections_per_peer is not None:
        app = ForwardedPeerLimit(app, max_connections_per_peer, trusted_proxies)
    return ReceiverConfig(
        app,
        header_timeout=header_timeout,
        max_header_bytes=max_header_bytes,
        admission=admission,
        host=host,
        port=port,
        http=PROTOCOLS[http],
        ws="none",
        lifespan=lifespan,
        log_level=log_level,
        log_config=None,  # its records go to the process's handler (connector.shell.logs)
        access_log=False,
        proxy_headers=False,
        server_header=False,
        date_header=True,
        limit_concurrency=max_connections + 1,
        timeout_keep_alive=keep_alive_timeout,
        h11_max_incomplete_event_size=max_header_bytes,
    )


def build_server(
    app: Any,
    host: str,
    port: int,
    *,
    server_class: type[uvicorn.Server] = uvicorn.Server,
    **limits: Any,
) -> uvicorn.Server:
    """A server for ``receiver_config(app, host, port, **limits)``; ``server_class`` lets the
    service keep its subclass."""
    return server_class(receiver_config(app, host, port, **limits))


# --- request bodies ----------------------------------------------------------------------------


BUSY_RETRY_AFTER_SECONDS = 5


class BodyError(Exception):
    """A body refused while reading it: HTTP ``status``, a stable ``code``, a safe message.

    The rest of the body is unread, so answer with ``headers`` (``Connection: close``): the
    connection cannot be reused and must not be kept open to drain it.
    """

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message

    @property
    def headers(self) -> dict[str, str]:
        """Response headers that close the connection instead of draining the unread body
        (and, for a 503, say when to retry)."""
        retry = {"Retry-After": str(BUSY_RETRY_AFTER_SECONDS)} if self.status == 503 else {}
        return {"Connection": "close", **retry}

    def __repr__(self) -> str:
        return f"BodyError({self.status}, {self.code!r}, {self.message!r})"


def _declared_length(request: Request) -> int | None:
    """Content-Length as a number; None when absent or not plain ASCII digits."""
    declared = (request.headers.get("content-length") or "").strip()
    if not (declared.isascii() and declared.isdigit()):
        return None
    # int() of a very long digit string is slow (and refused past 4300 digits): cap it first.
    return int(declared) if len(declared) <= 18 else 10**18


class ByteBudget:
    """Bytes the process lets requests hold at once before they are authenticated (event loop
    thread only): a body read under ``hold()`` takes its bytes as they arrive and gives them
    back when the block ends (the sender is authenticated or refused by then), so strangers
    sending large bodies at once cannot grow memory past ``limit`` together."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError("the byte budget must be at least 1")
        self.limit = limit
        self.held = 0

    @contextmanager
    def hold(self) -> Iterator[Holding]:
        holding = Holding(self)
        try:
            yield holding
        finally:
            holding.release()


class Holding:
    """The bytes one request holds of a ``ByteBudget``."""

    def __init__(self, budget: ByteBudget) -> None:
        self.budget = budget
        self.bytes = 0

    def take(self, n: int) -> bool:
        """Hold ``n`` more bytes; False (nothing taken) when the budget has no room."""
        if self.budget.held + n > self.budget.limit:
            return False
        self.budget.held += n
        self.bytes += n
        return True

    def release(self) -> None:
        self.budget.held -= self.bytes
        self.bytes = 0


async def read_body(
    request: Request,
    limit: int,
    timeout: float = DEFAULT_BODY_TIMEOUT,
    holding: Holding | None = None,
) -> bytes:
    """The body, at most ``limit`` bytes, in full within ``timeout`` seconds of this call.

    A Content-Length over the cap is refused (413 ``body_too_large``) before reading, which
    also keeps uvicorn from sending ``100 Continue``; a smaller or absent one is not trusted:
    the count is of the bytes received. A body not complete in time is 408 ``body_timeout``;
    a client gone mid-body is 400 ``client_disconnected``. With ``holding`` each chunk is
    taken from its budget as it arrives; past the budget the request is 503 ``busy``.
    """
    declared = _declared_length(request)
    if declared is not None and declared > limit:
        raise BodyError(413, "body_too_large", f"body exceeds {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(timeout), aclosing(request.stream()) as stream:
            async for chunk in stream:
                size += len(chunk)
                if size > limit:
                    raise BodyError(413, "body_too_large", f"body exceeds {limit} bytes")
                if holding is not None and not holding.take(len(chunk)):
                    raise BodyError(
                        503, "busy", "too many request bytes are waiting to be authenticated"
                    )
                chunks.append(chunk)
    except TimeoutError:
        raise BodyError(
            408, "body_timeout", f"the body did not arrive within {timeout:g} seconds"
        ) from None
    except ClientDisconnect:
        raise BodyError(400, "client_disconnected", "the client closed the request") from None
    return b"".join(chunks)


class BufferedBodies:
    """ASGI middleware for a listener whose requests carry small bodies (the admin one): each
    request's body is read in full, under ``limit`` bytes and within ``timeout`` seconds,
    before the app sees the request (over the cap 413, late 408, as ``read_body``), so no
    handler can be held by a slow or endless body."""

    def __init__(self, app: Any, limit: int, timeout: float = DEFAULT_BODY_TIMEOUT) -> None:
        self.app = app
        self.limit = limit
        self.timeout = timeout

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            body = await read_body(Request(scope, receive), self.limit, self.timeout)
        except BodyError as exc:
            headers = [(k.lower().encode(), v.encode()) for k, v in exc.headers.items()]
            message = exc.message.encode()
            await send(
                {
                    "type": "http.response.start",
                    "status": exc.status,
                    "headers": [(b"content-type", b"text/plain; charset=utf-8"), *headers],
                }
            )
            await send({"type": "http.response.body", "body": message})
            return
        replayed = False

        async def replay() -> Any:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)
