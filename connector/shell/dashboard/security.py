"""Dashboard sessions and CSRF tokens: stateless HMACs, so any replica that shares the admin
token accepts the same cookie.

A session cookie is ``nonce.sig`` with ``sig = HMAC(key, "session:" + nonce)``; the CSRF value
for a form is ``HMAC(key, "csrf:" + nonce)``: bound to that cookie, useless with any other.
The key is derived from CONNECTOR_ADMIN_TOKEN when one is set (so only someone who knew the
token could have been given a valid cookie), else it is random per process (loopback only).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

COOKIE = "connector_dashboard"


def session_key(admin_token: str | None) -> bytes:
    if admin_token:
        return hmac.new(admin_token.encode(), b"connector-dashboard-v1", hashlib.sha256).digest()
    return secrets.token_bytes(32)


def _mac(key: bytes, purpose: str, nonce: str) -> str:
    return hmac.new(key, f"{purpose}:{nonce}".encode(), hashlib.sha256).hexdigest()


def new_session(key: bytes) -> str:
    """A fresh cookie value."""
    nonce = secrets.token_hex(16)
    return f"{nonce}.{_mac(key, 'session', nonce)}"


def session_nonce(key: bytes, cookie: str | None) -> str | None:
    """The nonce of a cookie this key signed, or None for a missing or forged one."""
    if not cookie or cookie.count(".") != 1:
        return None
    nonce, sig = cookie.split(".")
    if not nonce or not hmac.compare_digest(sig.encode(), _mac(key, "session", nonce).encode()):
        return None
    return nonce


def csrf_token(key: bytes, nonce: str) -> str:
    return _mac(key, "csrf", nonce)


def csrf_ok(key: bytes, cookie: str | None, given: str | None) -> bool:
    """True when ``given`` is the CSRF value of a valid session cookie."""
    nonce = session_nonce(key, cookie)
    if nonce is None or not given:
        return False
    return hmac.compare_digest(given.encode(), csrf_token(key, nonce).encode())


def bearer_ok(admin_token: str | None, header: str) -> bool:
    if not admin_token:
        return False
    return hmac.compare_digest(header.encode(), f"Bearer {admin_token}".encode())
