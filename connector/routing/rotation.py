"""Weighted round robin with a hard fairness bound (pure functions, no I/O).

The rotation is a uniprocessor *Pfair* schedule: a rep with weight ``w`` in a team of total
weight ``W`` is owed ``n * w / W`` of the team's first ``n`` leads. The rep's ``j``-th lead may
go out no earlier than slot ``floor((j - 1) * W / w)`` and must go out before slot
``ceil(j * W / w)``; at every slot the eligible rep with the earliest deadline wins. Earliest
deadline first is optimal for unit jobs on one machine, and the weights sum to exactly one
slot per slot, so every rep's count stays strictly within one lead of its weighted share after
every single assignment. With equal weights this is plain round robin: counts differ by at
most one and ties go to the rep listed first.

A simpler "largest deficit first" rule is not enough: with many reps of uneven weight it lets
a rep drift up to ~1.4 leads from its share (found by simulation), which breaks the promise.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Seat:
    """One active rep's place in a team rotation, counted since the team's current epoch."""

    member_id: int
    weight: int
    assigned: int
    position: int


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def next_owners(seats: Sequence[Seat], team_assigned: int, count: int) -> list[int]:
    """Return the member ids for the team's next ``count`` leads, in order.

    ``team_assigned`` is the number of leads the team handed out since its epoch began; it must
    equal the sum of ``seat.assigned``. Raises ValueError when there is no active seat.
    """
    if count <= 0:
        return []
    if not seats:
        raise ValueError("team has no active member")
    if any(s.weight <= 0 for s in seats):
        raise ValueError("weights must be positive")
    total = sum(s.weight for s in seats)
    counts = {s.member_id: s.assigned for s in seats}
    if sum(counts.values()) != team_assigned:
        raise ValueError("team_assigned does not match the members' counts")
    order = sorted(seats, key=lambda s: (-s.weight, s.position, s.member_id))
    # Two heaps, O(log k) a pick: seats waiting for their release slot, and released seats by
    # (deadline, rank). Rank (heavier first, then config position) breaks deadline ties.
    waiting: list[tuple[int, int]] = []
    ready: list[tuple[int, int]] = []
    done = [counts[s.member_id] for s in order]
    for rank, seat in enumerate(order):
        heapq.heappush(waiting, ((done[rank] * total) // seat.weight, rank))
    picks: list[int] = []
    for slot in range(team_assigned, team_assigned + count):
        while waiting and waiting[0][0] <= slot:
            _, rank = heapq.heappop(waiting)
            deadline = _ceil_div((done[rank] + 1) * total, order[rank].weight)
            heapq.heappush(ready, (deadline, rank))
        if not ready:  # cannot happen while the weights sum to one slot per slot
            raise AssertionError("rotation found no eligible seat")
        _, rank = heapq.heappop(ready)
        seat = order[rank]
        done[rank] += 1
        picks.append(seat.member_id)
        heapq.heappush(waiting, ((done[rank] * total) // seat.weight, rank))
    return picks


def max_lag(weights: Sequence[int], counts: Sequence[int]) -> float:
    """The largest distance, in leads, between any rep's count and its weighted share."""
    total_w = sum(weights)
    n = sum(counts)
    if total_w == 0:
        return 0.0
    return max(
        (abs(c * total_w - n * w) / total_w for w, c in zip(weights, counts, strict=True)),
        default=0.0,
    )
