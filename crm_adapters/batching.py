"""Pure batching and backoff rules: group writes by parent, jittered exponential delays."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable

from crm_adapters.base import OwnerWrite

__all__ = ["backoff_delay", "plan_batches"]


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
    """Pack writes into batches of <= max_batch that never split a parent across batches.

    A parent with more than `max_batch` writes gets full batches of only its own records, and
    its remainder is packed like any other group. The batches of one claim go out one after
    another, so a parent is still never in two requests at the same time. Groups are placed
    first-fit in parent order (each batch stays sorted by parent, and few requests go out half
    empty); the plan is deterministic for a given input.
    """
    if max_batch < 1:
        raise ValueError("max_batch must be >= 1")
    batches: list[list[OwnerWrite]] = []
    for group in _groups(writes):
        if len(group) > max_batch:
            full = len(group) - len(group) % max_batch
            batches.extend(group[i : i + max_batch] for i in range(0, full, max_batch))
            group = group[full:]
            if not group:
                continue
        # first fit: the earliest batch with room (groups arrive in parent order, so every
        # batch stays sorted by parent; a split parent's full chunks have no room)
        for batch in batches:
            if len(batch) + len(group) <= max_batch:
                batch.extend(group)
                break
        else:
            batches.append(list(group))
    return batches


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
