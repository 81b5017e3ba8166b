"""HubSpot v3 request signatures (``X-HubSpot-Signature-v3``), as pure functions.

HubSpot signs ``method + uri + body + timestamp`` with HMAC-SHA256 keyed by the app's client
secret and sends the base64 digest with the millisecond timestamp in
``X-HubSpot-Request-Timestamp``. The ``uri`` is the full URL HubSpot called (scheme, host, path
and query) with a fixed set of percent-escapes decoded first; ``normalize_v3_uri`` applies that
decoding, and both ``sign_v3`` and ``verify_v3`` call it, so either form of the URL may be
passed in. Several secrets may be configured at once so a client secret can be rotated without
rejecting deliveries signed with the old one.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
from collections.abc import Sequence

DEFAULT_MAX_AGE_MS = 300_000
"""HubSpot's guidance: reject requests whose timestamp is more than 5 minutes old."""

SIGNATURE_HEADER = "X-HubSpot-Signature-v3"
TIMESTAMP_HEADER = "X-HubSpot-Request-Timestamp"

# HubSpot's v3 docs list exactly these escapes as the ones to decode in the request URI.
_V3_DECODE = {
    "3A": ":",
    "2F": "/",
    "3F": "?",
    "40": "@",
    "21": "!",
    "24": "$",
    "27": "'",
    "28": "(",
    "29": ")",
    "2A": "*",
    "2C": ",",
    "3B": ";",
}
_V3_ESCAPE_RE = re.compile("%(" + "|".join(_V3_DECODE) + ")", re.IGNORECASE)
_TIMESTAMP_RE = re.compile(r"[0-9]{1,16}")


class SignatureError(Exception):
    """A request that failed signature checks; the message never holds a secret."""

    def __init__(self, code: str, http_status: int = 401, message: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.http_status = http_status
        self.message = message

    def __repr__(self) -> str:
        return f"SignatureError({self.code!r}, {self.http_status}, {self.message!r})"


def normalize_v3_uri(uri: str) -> str:
    """Decode the percent-escapes HubSpot decodes before signing (``%3A`` -> ``:`` and so on).

    Decoded characters never include ``%``, so the result is stable under repeated calls.
    """
    return _V3_ESCAPE_RE.sub(lambda m: _V3_DECODE[m.group(1).upper()], uri)


def _digest(secret: str, method: str, uri: str, body: bytes, timestamp: str) -> bytes:
    # surrogatepass: odd input must still hash deterministically rather than raise.
    prefix = f"{method}{normalize_v3_uri(uri)}".encode("utf-8", "surrogatepass")
    key = secret.encode("utf-8", "surrogatepass")
    return hmac.new(key, prefix + body + timestamp.encode(), hashlib.sha256).digest()


def sign_v3(secret: str, method: str, uri: str, body: bytes, timestamp_ms: int) -> str:
    """The ``X-HubSpot-Signature-v3`` value HubSpot would send for this request."""
    return base64.b64encode(_digest(secret, method, uri, body, str(timestamp_ms))).decode()


def signed_headers(secret: str, url: str, body: bytes, timestamp_ms: int) -> dict[str, str]:
    """The headers of a webhook POST of ``body`` to ``url`` as HubSpot sends it."""
    return {
        "Content-Type": "application/json",
        SIGNATURE_HEADER: sign_v3(secret, "POST", url, body, timestamp_ms),
        TIMESTAMP_HEADER: str(timestamp_ms),
    }


def verify_v3(
    secrets: Sequence[str],
    method: str,
    uri: str,
    body: bytes,
    signature: str | None,
    timestamp: str | None,
    now_ms: int,
    max_age_ms: int = DEFAULT_MAX_AGE_MS,
) -> None:
    """Return if the request is signed by any of ``secrets`` within ``max_age_ms`` of
    ``now_ms`` (either side, to bound clock skew and replay); raise SignatureError otherwise.

    ``signature`` and ``timestamp`` are the raw header values (None when absent). The timestamp
    is signed exactly as sent. Raises ValueError if ``secrets`` is empty (a configuration bug).
    """
    if not secrets:
        raise ValueError("no HubSpot client secret configured")
    if signature is None or not signature.strip():
        raise SignatureError("missing_signature", 401, f"{SIGNATURE_HEADER} header is missing")
    if timestamp is None or not timestamp.strip():
        raise SignatureError("missing_timestamp", 401, f"{TIMESTAMP_HEADER} header is missing")
    if not _TIMESTAMP_RE.fullmatch(timestamp):
        raise SignatureError("bad_timestamp", 401, f"{TIMESTAMP_HEADER} is not a millisecond time")
    skew = now_ms - int(timestamp)
    if skew > max_age_ms:
        raise SignatureError("stale_timestamp", 401, f"request is {skew} ms old, over {max_age_ms}")
    if -skew > max_age_ms:
        raise SignatureError(
            "stale_timestamp", 401, f"request is {-skew} ms in the future, over {max_age_ms}"
        )
    try:
        presented = base64.b64decode(signature.strip().encode("ascii"), validate=True)
    except (UnicodeEncodeError, ValueError):
        raise SignatureError("bad_signature", 401, "signature is not base64") from None
    matched = False
    for secret in secrets:
        # Check every secret so timing does not reveal which one (if any) matched.
        expected = _digest(secret, method, uri, body, timestamp)
        matched |= hmac.compare_digest(expected, presented)
    if not matched:
        raise SignatureError("bad_signature", 401, "signature does not match")
