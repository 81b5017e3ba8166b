"""HubSpot's rate limits as the adapter keeps to them: the rolling ten-second budget its
X-HubSpot-RateLimit-* headers tell, how long and which of an account's limiters a refused
call holds, and the limiters one process shares per account."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Mapping
from typing import Any

from crm_adapters.ratelimit import RollingWindowLimiter

__all__ = ["refusal_hold", "refused_limiters", "shared_limiter", "window_budget"]


def window_budget(headers: Mapping[str, str]) -> tuple[int, int] | None:
    """(max, remaining) of the rolling ten-second window from lower-cased X-HubSpot-RateLimit-*
    headers, or None when they are missing, not numbers, or for another interval."""
    try:
        interval = headers.get("x-hubspot-ratelimit-interval-milliseconds")
        if interval is not None and int(interval) != 10_000:
            return None
        server_max = int(headers["x-hubspot-ratelimit-max"])
        remaining = int(headers["x-hubspot-ratelimit-remaining"])
    except (KeyError, ValueError):
        return None
    if server_max < 1 or remaining < 0:
        return None
    return server_max, remaining


def refusal_hold(policy: str, retry_after: float | None, window: float) -> float:
    """Seconds to send nothing more on an account after a request-scoped 429: the server's
    Retry-After when it gave one, else the refused policy's window (SECONDLY: one second),
    else the limiter's own window."""
    if retry_after is not None:
        return retry_after
    return 1.0 if policy == "SECONDLY" else window


def refused_limiters(policy: str, search: bool) -> tuple[str, ...]:
    """Which of an account's limiters a request-scoped 429 holds: a search refused for the
    searches' own per-second limit holds searches only; refused for any other policy (the
    account's ten-second budget, which every call spends) or for none named, it holds every
    call; any other call's refusal holds the other calls (searches have their own budget)."""
    if not search:
        return ("general",)
    return ("search",) if policy == "SECONDLY" else ("search", "general")


_LIMITERS: dict[tuple[str, str, str], RollingWindowLimiter] = {}
_LIMITERS_LOCK = threading.Lock()


def shared_limiter(base_url: str, token: str, kind: str, limit: int, window: float) -> Any:
    """One limiter per (account token, kind) per process, shared by all adapters of it."""
    key = (base_url, hashlib.sha256(token.encode()).hexdigest()[:16], f"{kind}:{limit}/{window}")
    with _LIMITERS_LOCK:
        lim = _LIMITERS.get(key)
        if lim is None:
            lim = _LIMITERS[key] = RollingWindowLimiter(limit, window)
        return lim
