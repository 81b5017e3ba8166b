"""Pure batching and backoff rules: group writes by parent, jittered exponential delays."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable

from crm_adapters.base import OwnerWrite

__all__ = ["HUBSPOT_BATCH_MAX", "backoff_delay", "plan_batches"]

# HubSpot's batch read and batch update take at most this many ids a call.
HUBSPOT_BATCH_MAX = 100


def _groups(writes: Iterable[OwnerWrite]) -> list[list[OwnerWrite]]:
    """Writes grouped by parent, sorted by parent id; parentless writes are single groups last."""
    by_parent: dict[str, list[OwnerWrite]] = {}
    orphans: list[list[OwnerWrite]] = []
    for w in writes:
        if w.parent_id is None:
            orphans.append([w])
        else:
            by_parent.setdefault(w.parent_id, []).append(w)
    return [by_parent[p] for p in sorted(by_parent)] + orphans


def plan_batches(writes: Iterable[OwnerWrite], max_batch: int) -> list[list[OwnerWrite]]:
    """Order writes by parent and cut them into full batches of `max_batch` (the last may be
    smaller).

    Salesforce's advice is to order records by parent and never to put one parent in two
    requests that run at the same time. The batches of one plan are meant to be sent one
    after another (the dispatcher does), so a parent that straddles two consecutive batches
    is never locked by two of our requests at once, and every request but the last is full:
    CRM quotas count requests. Parentless writes come last. Deterministic for a given input.
    """
    if max_batch < 1:
        raise ValueError("max_batch must be >= 1")
    ordered = [w for group in _groups(writes) for w in group]
    return [ordered[i : i + max_batch] for i in range(0, len(ordered), max_batch)]


def backoff_delay(
    attempt: int,
    base: float = 0.5,
    cap: float = 60.0,
    rng: Callable[[], float] = random.random,
    retry_after: float | None = None,
) -> float:
    """Seconds to wait before retry number `attempt` (0-based), with full jitter.

    Without `retry_after` the delay is uniform in [0, min(cap, base * 2**attempt)). With it the
    server's wish wins: at least `retry_after`, plus up to `base` of jitter so that workers told
    the same instant do not stampede back together.
    """
    if retry_after is not None and retry_after >= 0:
        return retry_after + rng() * base
    ceiling = min(cap, base * (2.0 ** min(max(attempt, 0), 62)))
    return rng() * ceiling
