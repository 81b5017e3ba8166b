"""Who may hold a connection to a listener: a cap on all open connections, and one per peer.

Without a per-peer cap one address can take every connection slot with connections that never
finish their headers (each lives until the header deadline, and the client opens the next at
once), and every other sender is turned away. So each listener counts its open connections by
the TCP peer's address (IPv6 by /64, the block one host usually holds) and refuses a new one
from a peer that already holds ``per_peer`` of them; and it refuses any new connection while
``max_connections`` are open, so the open sockets never outgrow the file limit the cap was
derived from (``connector.shell.fd_limits``). A refused connection gets a bare 503 and is
closed at once: it holds no slot and no file for longer than that write.

A trusted proxy (``CONNECTOR_TRUSTED_PROXIES``) carries many clients on its connections, so
its connections count only toward the total; behind it ``ForwardedPeerLimit`` caps the
requests in flight per forwarded client address instead (the proxy has read their headers,
so a slow client holds the proxy's sockets, not ours).
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from collections.abc import Sequence
from typing import Any

from connector.core.throttled_log import ThrottledLog
from connector.intake.senders import IPNetwork, client_address, in_networks

log = logging.getLogger(__name__)

DEFAULT_MAX_CONNECTIONS_PER_PEER = 64
"""HubSpot sends at most 10 requests at once per app by default (its concurrency setting goes
to 100 at most per portal); Salesforce spreads Outbound Messages over many addresses."""

SERVICE_UNAVAILABLE = (
    b"HTTP/1.1 503 Service Unavailable\r\n"
    b"Content-Type: text/plain; charset=utf-8\r\n"
    b"Content-Length: 19\r\n"
    b"Retry-After: 5\r\n"
    b"Connection: close\r\n\r\n"
    b"Service Unavailable"
)

_refusals = ThrottledLog(log)


def peer_key(host: str | None) -> str | None:
    """The address a peer is counted under: IPv4 as is (IPv4-mapped IPv6 too), IPv6 by its
    /64; None when there is none (a Unix socket) or it is not an address."""
    if not host:
        return None
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        return None
    if isinstance(addr, ipaddress.IPv6Address):
        if addr.ipv4_mapped is not None:
            return str(addr.ipv4_mapped)
        return str(ipaddress.IPv6Network((addr, 64), strict=False))
    return str(addr)


def _is_trusted(host: str | None, trusted_proxies: Sequence[IPNetwork]) -> bool:
    try:
        return host is not None and in_networks(ipaddress.ip_address(host), trusted_proxies)
    except ValueError:
        return False


def transport_peer(transport: asyncio.BaseTransport) -> str | None:
    """The TCP peer's host as the transport reports it (None for a Unix socket)."""
    peer = transport.get_extra_info("peername")
    if isinstance(peer, tuple | list) and peer:
        return str(peer[0])
    return None


class Admission:
    """The open connections of one listener, in total and per peer (event loop thread only).

    ``per_peer`` None means no per-peer cap. Connections from ``trusted_proxies`` count only
    toward the total.
    """

    def __init__(
        self,
        max_connections: int,
        per_peer: int | None = DEFAULT_MAX_CONNECTIONS_PER_PEER,
        trusted_proxies: Sequence[IPNetwork] = (),
    ) -> None:
        if max_connections < 1:
            raise ValueError("max_connections must be at least 1")
        if per_peer is not None and per_peer < 1:
            raise ValueError("the per-peer connection limit must be at least 1")
        self.max_connections = max_connections
        self.per_peer = per_peer
        self.trusted_proxies = list(trusted_proxies)
        self.total = 0
        self.by_peer: dict[str, int] = {}

    def _counted_as(self, host: str | None) -> str | None:
        key = peer_key(host) if self.per_peer is not None else None
        if key is None or not self.trusted_proxies:
            return key
        return None if _is_trusted(host, self.trusted_proxies) else key

    def admit(self, host: str | None) -> tuple[bool, str | None]:
        """(admitted, the key it is counted under); a refusal is logged (throttled)."""
        key = self._counted_as(host)
        if self.total >= self.max_connections:
            _refusals(
                "connections",
                "connection refused: %d connections open, the limit",
                self.total,
            )
            return False, None
        if (
            key is not None
            and self.per_peer is not None
            and self.by_peer.get(key, 0) >= self.per_peer
        ):
            _refusals(
                "peer",
                "connection from %s refused: it holds %d connections, the per-peer limit",
                key,
                self.per_peer,
            )
            return False, None
        self.total += 1
        if key is not None:
            self.by_peer[key] = self.by_peer.get(key, 0) + 1
        return True, key

    def release(self, key: str | None) -> None:
        """An admitted connection closed."""
        self.total -= 1
        if key is not None:
            left = self.by_peer.get(key, 0) - 1
            if left > 0:
                self.by_peer[key] = left
            else:
                self.by_peer.pop(key, None)


class ForwardedPeerLimit:
    """ASGI middleware: behind a trusted proxy, at most ``per_peer`` requests in flight per
    forwarded client address (the right-most X-Forwarded-For entry that is not a trusted
    proxy); more get 503. Requests straight from other peers pass untouched (their
    connections are capped by ``Admission``)."""

    def __init__(self, app: Any, per_peer: int, trusted_proxies: Sequence[IPNetwork]) -> None:
        self.app = app
        self.per_peer = per_peer
        self.trusted_proxies = list(trusted_proxies)
        self.in_flight: dict[str, int] = {}

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not self.trusted_proxies:
            await self.app(scope, receive, send)
            return
        client = scope.get("client")
        peer = str(client[0]) if client else None
        if not _is_trusted(peer, self.trusted_proxies):
            await self.app(scope, receive, send)
            return
        forwarded = b",".join(v for k, v in scope.get("headers", ()) if k == b"x-forwarded-for")
        sender = client_address(peer, forwarded.decode("latin-1"), self.trusted_proxies)
        key = peer_key(str(sender)) if sender is not None else None
        if key is None:
            await self.app(scope, receive, send)
            return
        if self.in_flight.get(key, 0) >= self.per_peer:
            _refusals(
                "forwarded",
                "request forwarded for %s refused: %d of its requests in flight, the limit",
                key,
                self.per_peer,
            )
            await send(
                {
                    "type": "http.response.start",
                    "status": 503,
                    "headers": [
                        (b"content-type", b"text/plain; charset=utf-8"),
                        (b"retry-after", b"5"),
                        (b"connection", b"close"),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": b"Service Unavailable"})
            return
        self.in_flight[key] = self.in_flight.get(key, 0) + 1
        try:
            await self.app(scope, receive, send)
        finally:
            left = self.in_flight[key] - 1
            if left:
                self.in_flight[key] = left
            else:
                del self.in_flight[key]
