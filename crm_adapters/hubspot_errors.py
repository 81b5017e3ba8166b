"""HubSpot's failures read as the connector's errors (``crm_adapters.base``): a whole
request's HTTP answer (status, body, headers), one record's error of a 207 answer, and the
exceptions hubspot-api-client and urllib3 raise."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import urllib3
from hubspot.crm.objects.exceptions import ApiException as ObjectsApiException
from hubspot.crm.owners.exceptions import ApiException as OwnersApiException

from crm_adapters.base import (
    AuthError,
    CrmError,
    PermanentError,
    RateLimitedError,
    RetryableError,
)

__all__ = [
    "API_EXCEPTIONS",
    "classify_hubspot_exception",
    "classify_hubspot_http",
    "classify_hubspot_record_error",
    "header_value",
    "seconds_or_none",
    "seconds_until_utc_midnight",
]

_RETRYABLE_CATEGORIES = frozenset(
    {"INTERNAL_ERROR", "SERVICE_UNAVAILABLE", "TIMEOUT", "LOCKED", "CONFLICT_RETRY"}
)
API_EXCEPTIONS = (ObjectsApiException, OwnersApiException)


def _body_dict(body: object) -> dict[str, Any]:
    if isinstance(body, bytes | bytearray):
        body = body.decode("utf-8", "replace")
    if isinstance(body, str):
        try:
            body = json.loads(body) if body else None
        except ValueError:
            return {}
    return body if isinstance(body, dict) else {}


def header_value(headers: Mapping[str, str] | None, name: str) -> str | None:
    if not headers:
        return None
    low = name.lower()
    for k, v in headers.items():
        if k.lower() == low:
            return str(v)
    return None


def seconds_or_none(value: str | None) -> float | None:
    """A Retry-After in seconds when it is a positive finite number, else None."""
    try:
        seconds = float(value) if value is not None else math.nan
    except ValueError:
        return None
    return seconds if math.isfinite(seconds) and seconds > 0 else None


def seconds_until_utc_midnight(now: datetime | None = None) -> float:
    """Seconds to the next UTC midnight (HubSpot's DAILY limit resets around then)."""
    n = (now or datetime.now(UTC)).astimezone(UTC)
    midnight = (n + timedelta(days=1)).replace(hour=0, minute=0, second=0, microsecond=0)
    return max((midnight - n).total_seconds(), 1.0)


def classify_hubspot_record_error(category: str, message: str = "") -> CrmError:
    """Map one per-record error (`category` of a 207 error entry) to an error class."""
    if category == "RATE_LIMITS":
        return RateLimitedError(category, message, 1.0, scope="request")
    if category in _RETRYABLE_CATEGORIES:
        return RetryableError(category, message)
    return PermanentError(category or "UNKNOWN", message)


def classify_hubspot_http(
    status: int,
    body: object = None,
    headers: Mapping[str, str] | None = None,
    now: datetime | None = None,
) -> CrmError:
    """Map a failed whole-request HTTP answer (status, body, headers) to an error class."""
    data = _body_dict(body)
    message = str(data.get("message", ""))
    category = str(data.get("category") or "")
    retry_after = seconds_or_none(header_value(headers, "Retry-After"))
    if status == 429:
        policy = str(data.get("policyName") or "")
        if policy == "DAILY":
            return RateLimitedError(
                "DAILY", message, retry_after or seconds_until_utc_midnight(now), scope="org"
            )
        return RateLimitedError(policy or "429", message, retry_after or 1.0, scope="request")
    if status in (401, 403):
        return AuthError(category or str(status), message)
    if status in (0, 408, 423) or status >= 500:
        return RetryableError(category or str(status), message, retry_after)
    return PermanentError(category or str(status), message)


def classify_hubspot_exception(exc: BaseException) -> CrmError:
    """Translate hubspot-api-client / urllib3 exceptions into the CrmError hierarchy."""
    if isinstance(exc, CrmError):
        return exc
    if isinstance(exc, API_EXCEPTIONS):
        headers = dict(exc.headers) if exc.headers else {}
        return classify_hubspot_http(int(exc.status or 0), exc.body, headers)
    if isinstance(exc, urllib3.exceptions.MaxRetryError) and exc.reason is not None:
        return classify_hubspot_exception(exc.reason)
    if isinstance(exc, urllib3.exceptions.NewConnectionError | urllib3.exceptions.ProtocolError):
        return RetryableError("connection", type(exc).__name__)
    if isinstance(exc, urllib3.exceptions.TimeoutError | TimeoutError):
        return RetryableError("timeout", type(exc).__name__)
    if isinstance(exc, urllib3.exceptions.HTTPError | ConnectionError | OSError):
        return RetryableError("connection", type(exc).__name__)
    if isinstance(exc, ValueError):
        return RetryableError("bad_response", type(exc).__name__)
    return RetryableError("unexpected", type(exc).__name__)
