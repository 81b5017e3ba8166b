"""What the admin listener answers at all: the Host names it serves, the POSTs it accepts, and
how fast one address may try credentials.

* **Host allowlist** (DNS rebinding): a page on a host name the attacker controls can make
  that name resolve to 127.0.0.1; the browser then treats the admin listener as that page's
  own origin and lets it read the dashboard and post its forms. The request still carries
  the attacker's name in ``Host``, so only loopback names and addresses, the address the
  listener is bound to, and the names in ``CONNECTOR_ADMIN_HOSTS`` are answered; anything
  else gets 400.
* **Origin check**: a POST whose ``Origin`` names another host than the listener's own, or
  that the browser marks ``Sec-Fetch-Site: cross-site``/``same-site``, gets 403, before the
  CSRF value is even looked at.
* **Sign-in backoff**: a request that presents a credential (a bearer header, or the sign-in
  form) and is answered 401 counts a failure for its address (IPv6 by /64); after
  ``FREE_FAILURES`` of them the next attempt from that address is accepted only after a delay
  that doubles with each further failure (``backoff_delay``), and attempts made before that
  get 429 with ``Retry-After`` without the credential being checked. A success clears the
  count. Failures are logged with the address and count, never the credential given.
"""

from __future__ import annotations

import ipaddress
import logging
import math
import os
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit

from connector.core.throttled_log import ThrottledLog
from connector.intake.admission import peer_key

log = logging.getLogger(__name__)

ADMIN_HOSTS_ENV = "CONNECTOR_ADMIN_HOSTS"
LOOPBACK_NAMES = frozenset({"localhost", "localhost.", "ip6-localhost"})
SIGN_IN_PATH = "/dashboard/login"
FREE_FAILURES = 3
"""Typos: the first failures from an address are not delayed."""
FIRST_DELAY_SECONDS = 1.0
MAX_DELAY_SECONDS = 300.0
MAX_TRACKED_PEERS = 10_000

_refusals = ThrottledLog(log)
_sign_ins = ThrottledLog(log, interval=1.0)


def backoff_delay(failures: int) -> float:
    """Seconds an address waits before its next attempt after ``failures`` in a row: none
    for the first ``FREE_FAILURES``, then 1, 2, 4, ... up to ``MAX_DELAY_SECONDS``."""
    extra = failures - FREE_FAILURES
    if extra <= 0:
        return 0.0
    return min(FIRST_DELAY_SECONDS * 2.0 ** min(extra - 1, 32), MAX_DELAY_SECONDS)


def host_name(header: str) -> str | None:
    """The name of a ``Host`` header (lower case, port and IPv6 brackets removed), or None
    for one that is malformed."""
    value = header.strip().lower()
    if not value or any(c.isspace() or c in "/@\\" for c in value):
        return None
    if value.startswith("["):
        end = value.find("]")
        rest = value[end + 1 :]
        if end < 0 or (rest and not (rest.startswith(":") and rest[1:].isdigit())):
            return None
        return value[1:end]
    name, colon, port = value.partition(":")
    if colon and not port.isdigit():
        return None
    return name or None


def _loopback_address(name: str) -> bool:
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def allowed_hosts(bound_host: str | None, configured: Iterable[str]) -> frozenset[str]:
    """The names the admin listener answers besides loopback ones: its bound address (unless
    it binds every address) and the configured names."""
    names = {n.strip().lower().rstrip(".") for n in configured if n.strip()}
    if bound_host and bound_host not in ("0.0.0.0", "::", ""):
        names.add(bound_host.strip("[]").lower())
    return frozenset(names)


def admin_hosts_from_env(env: Mapping[str, str] | None = None) -> list[str]:
    """$CONNECTOR_ADMIN_HOSTS: comma-separated host names (or addresses) the admin listener
    also answers, e.g. the name of a tunnel or of the machine."""
    raw = (os.environ if env is None else env).get(ADMIN_HOSTS_ENV, "")
    return [h for h in raw.split(",") if h.strip()]


def host_allowed(name: str | None, allowed: frozenset[str]) -> bool:
    if name is None:
        return False
    return name in LOOPBACK_NAMES or _loopback_address(name) or name.rstrip(".") in allowed


def origin_allowed(origin: str | None, host: str, fetch_site: str | None) -> bool:
    """Whether a POST may come from the listener's own pages: not one the browser marks
    ``Sec-Fetch-Site: cross-site`` or ``same-site``, and not one whose ``Origin`` names
    another host and port than ``Host``. ``Origin: null`` tells nothing (the dashboard's
    ``Referrer-Policy: no-referrer`` makes browsers send it on its own forms), nor does its
    absence (a client that is no browser); then the CSRF value decides."""
    if fetch_site is not None and fetch_site.strip().lower() in ("cross-site", "same-site"):
        return False
    if origin is None or origin.strip() == "null":
        return True
    parts = urlsplit(origin.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return False
    return parts.netloc.lower() == host.strip().lower()


class SignInBackoff:
    """Failed credential attempts per address, and when each may try again (event loop
    thread only)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._peers: OrderedDict[str, tuple[int, float]] = OrderedDict()

    def wait(self, peer: str) -> float:
        """Seconds before ``peer`` may try again (0: now)."""
        entry = self._peers.get(peer)
        return max(entry[1] - self.clock(), 0.0) if entry else 0.0

    def failed(self, peer: str) -> tuple[int, float]:
        """Record a failure; (failures in a row, seconds until the next attempt)."""
        failures = self._peers.pop(peer, (0, 0.0))[0] + 1
        delay = backoff_delay(failures)
        self._peers[peer] = (failures, self.clock() + delay)
        while len(self._peers) > MAX_TRACKED_PEERS:
            self._peers.popitem(last=False)
        return failures, delay

    def succeeded(self, peer: str) -> None:
        self._peers.pop(peer, None)


def _header(scope: Mapping[str, Any], name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return bytes(value).decode("latin-1")
    return None


async def _plain(send: Any, status: int, text: str, headers: Mapping[str, str] = {}) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"text/plain; charset=utf-8"),
                (b"cache-control", b"no-store"),
                *((k.lower().encode(), v.encode()) for k, v in headers.items()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": text.encode()})


class AdminGuard:
    """ASGI middleware for the admin app: the Host allowlist, the Origin check and the
    sign-in backoff of this module's docstring."""

    def __init__(
        self,
        app: Any,
        bound_host: str | None = None,
        extra_hosts: Iterable[str] | None = None,
        backoff: SignInBackoff | None = None,
    ) -> None:
        self.app = app
        self.allowed = allowed_hosts(
            bound_host, admin_hosts_from_env() if extra_hosts is None else extra_hosts
        )
        self.backoff = backoff or SignInBackoff()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        host = _header(scope, b"host") or ""
        if not host_allowed(host_name(host), self.allowed):
            _refusals("host", "admin request refused: Host %r is not an admin host", host[:64])
            await _plain(send, 400, f"Unknown Host: add it to {ADMIN_HOSTS_ENV} to use it.")
            return
        post = scope["method"] == "POST"
        if post and not origin_allowed(
            _header(scope, b"origin"), host, _header(scope, b"sec-fetch-site")
        ):
            _refusals("origin", "admin POST refused: it came from another site")
            await _plain(send, 403, "Cross-site request refused.")
            return
        presents = _header(scope, b"authorization") is not None or (
            post and scope["path"] == SIGN_IN_PATH
        )
        if not presents:
            await self.app(scope, receive, send)
            return
        client = scope.get("client")
        peer = peer_key(str(client[0]) if client else None) or "unknown"
        wait = self.backoff.wait(peer)
        if wait > 0:
            _sign_ins("wait", "admin sign-in from %s refused: retry in %.0f s", peer, wait)
            await _plain(
                send,
                429,
                "Too many failed sign-ins from this address: wait, then try again.",
                {"Retry-After": str(math.ceil(wait))},
            )
            return
        status = 0

        async def watch(message: Any) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        await self.app(scope, receive, watch)
        if status == 401:
            failures, delay = self.backoff.failed(peer)
            _sign_ins(
                "failed",
                "admin sign-in failed from %s (%d in a row; next accepted in %.0f s)",
                peer,
                failures,
                delay,
            )
        elif 200 <= status < 400:
            self.backoff.succeeded(peer)
