"""Dashboard sessions and CSRF tokens: stateless HMACs, so any replica that shares the admin
token accepts the same cookie.

A session cookie is ``nonce.issued.sig`` with ``sig = HMAC(key, "session:" + nonce + ":" +
issued)``, ``issued`` the Unix second it was made: a cookie older than the key's ``max_age``
(``CONNECTOR_ADMIN_SESSION_SECONDS``, 8 hours by default) is no session, whoever holds it.
The CSRF value for a form is ``HMAC(key, "csrf:" + nonce)``: bound to that cookie, useless
with any other. The key is derived from CONNECTOR_ADMIN_TOKEN when one is set (so only
someone who knew the token could have been given a valid cookie), else it is random per
process (loopback only).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from connector.core.config import ConfigError

COOKIE = "connector_dashboard"
DEFAULT_SESSION_SECONDS = 8 * 3600
"""A working day: sign in once in the morning."""
SESSION_SECONDS_ENV = "CONNECTOR_ADMIN_SESSION_SECONDS"
_MAX_SESSION_SECONDS = 366 * 86400


@dataclass(frozen=True)
class SessionKey:
    """What signs and checks sessions: the HMAC key, how long a session lasts, the clock."""

    secret: bytes
    max_age: int = DEFAULT_SESSION_SECONDS
    clock: Callable[[], float] = field(default=time.time, compare=False)


def session_seconds_from_env(env: Mapping[str, str] | None = None) -> int:
    """$CONNECTOR_ADMIN_SESSION_SECONDS (default 8 hours); ConfigError (one line) unless it
    is a whole number of seconds from 60 to a year."""
    raw = (os.environ if env is None else env).get(SESSION_SECONDS_ENV, "").strip()
    if not raw:
        return DEFAULT_SESSION_SECONDS
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 9) or not (
        60 <= int(raw) <= _MAX_SESSION_SECONDS
    ):
        raise ConfigError(
            f"{SESSION_SECONDS_ENV} must be a whole number of seconds from 60 to "
            f"{_MAX_SESSION_SECONDS}, got {raw[:20]!r}"
        )
    return int(raw)


def session_key(
    admin_token: str | None,
    max_age: int | None = None,
    clock: Callable[[], float] = time.time,
) -> SessionKey:
    """The key for this process: from the token (shared by replicas) or random; sessions last
    ``max_age`` seconds (default: $CONNECTOR_ADMIN_SESSION_SECONDS)."""
    age = session_seconds_from_env() if max_age is None else max_age
    if admin_token:
        secret = hmac.new(admin_token.encode(), b"connector-dashboard-v1", hashlib.sha256).digest()
    else:
        secret = secrets.token_bytes(32)
    return SessionKey(secret, age, clock)


def _mac(key: SessionKey, purpose: str, value: str) -> str:
    return hmac.new(key.secret, f"{purpose}:{value}".encode(), hashlib.sha256).hexdigest()


def new_session(key: SessionKey) -> str:
    """A fresh cookie value, issued now."""
    nonce = secrets.token_hex(16)
    issued = str(int(key.clock()))
    return f"{nonce}.{issued}.{_mac(key, 'session', f'{nonce}:{issued}')}"


def session_nonce(key: SessionKey, cookie: str | None) -> str | None:
    """The nonce of a cookie this key signed that has not expired, or None for a missing,
    forged or expired one."""
    if not cookie or cookie.count(".") != 2:
        return None
    nonce, issued, sig = cookie.split(".")
    if not nonce or not (issued.isascii() and issued.isdigit() and len(issued) <= 12):
        return None
    expected = _mac(key, "session", f"{nonce}:{issued}")
    if not hmac.compare_digest(sig.encode(), expected.encode()):
        return None
    age = key.clock() - int(issued)
    if not -60 <= age <= key.max_age:  # a minute of clock skew between replicas
        return None
    return nonce


def csrf_token(key: SessionKey, nonce: str) -> str:
    return _mac(key, "csrf", nonce)


def csrf_ok(key: SessionKey, cookie: str | None, given: str | None) -> bool:
    """True when ``given`` is the CSRF value of a valid session cookie."""
    nonce = session_nonce(key, cookie)
    if nonce is None or not given:
        return False
    return hmac.compare_digest(given.encode(), csrf_token(key, nonce).encode())


def bearer_ok(admin_token: str | None, header: str) -> bool:
    if not admin_token:
        return False
    return hmac.compare_digest(header.encode(), f"Bearer {admin_token}".encode())
