"""Weighted round robin with a hard fairness bound (pure functions, no I/O).

The rotation is a uniprocessor *Pfair* schedule: a rep with weight ``w`` in a team of total
weight ``W`` is owed ``n * w / W`` of the team's first ``n`` turns. The rep's ``j``-th turn may
go out no earlier than slot ``floor((j - 1) * W / w)`` and must go out before slot
``ceil(j * W / w)``; at every slot the eligible rep with the earliest deadline wins. Earliest
deadline first is optimal for unit jobs on one machine, and the weights sum to exactly one
slot per slot, so every rep's count stays strictly within one turn of its weighted share after
every single assignment. With equal weights this is plain round robin: counts differ by at
most one and ties go to the rep listed first. The bound also holds from *any* state in which
every rep is already strictly within one turn of its share (the deadlines of such a state are
all still ahead, and the demand of every window fits it), which is what the policies below
rely on.

A simpler "largest deficit first" rule is not enough: with many reps of uneven weight it lets
a rep drift up to ~1.4 leads from its share (found by simulation), which breaks the promise.

**Reps who cannot take a lead** (``pick_available``). The rotation runs over every *active*
rep of the team; a rep's turns are its leads plus its *credited* turns. A rep that is capped
or off shift, and (with ``catch_up: none``) a rep that is away, is passed over: when the
schedule reaches its turn, the turn is credited to it and the schedule moves on to the next
turn, until the turn belongs to a rep that can take the lead. Guarantees:

* ``catch_up: none`` -- every active rep's turns (leads + credited turns) stay strictly within
  one of its weighted share of the team's turns, after every lead, whoever is away, capped or
  off shift. So a rep back from time away neither owes nor is owed leads for it: it rejoins
  exactly where its share puts it. With equal weights the leads follow the configured order,
  skipping whoever is unavailable: any two reps that are available throughout a run of
  consecutive leads get counts in that run that differ by at most one.
* ``catch_up: {max_in_a_row: K}`` -- capped and off-shift turns are credited as above, but an
  away rep's turns are not: while it is away the others take its share, and it comes back
  *behind* (its turns at least one below its weighted share). A rep that is behind is served
  before any rep that is not (earliest deadline first), so it gets extra leads until it is
  back within one of its share; and no rep gets a (K+1)-th lead in a row while another rep
  can take it, unless it is already ahead of its share (more turns than its share, which the
  rotation never picks while a rep at or below its share can take the lead). K applies only
  to reps whose share is at most K of every K+1 leads (``limits_runs``): a heavier rep needs
  longer runs for its share alone (weights 1, 1, 5 with K = 1), so it follows the plain
  rotation, and back from time away catches up without a limit (``check-config`` says
  so). For a rep K applies to, each K+1 leads pay at least ``K - (K+1) * w / W`` of its
  debt; when that is zero (K * W = (K+1) * w, e.g. K = 1 in a team of two equal reps) the
  debt is never paid, and ``check-config`` warns. When nobody is behind, the rotation is the
  ``none`` rotation (the Hypothesis tests check this pick for pick).

In both policies a capped rep is never given a lead past its cap, an away, off-shift or
inactive rep is never given one, and a lead that no rep can take is reported as unplaced.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple


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
    done = [counts[s.member_id] for s in order]
    if all(s.weight == order[0].weight for s in order):
        return _round_robin([s.member_id for s in order], done, count)
    return _pfair(order, done, total, team_assigned, count)


def _round_robin(ids: Sequence[int], done: Sequence[int], count: int) -> list[int]:
    """``next_owners`` when every weight is equal, without its heaps (a batch's picks are
    made with the team's lock held). With ``n`` seats of weight ``w`` a seat that has had
    ``d`` turns is released at slot ``d * n`` and its deadline is ``(d + 1) * n``, so the
    schedule gives each slot to the seat with the fewest turns, then the first in rank; that
    seat is always released, as the turns add up to the slot and the fewest is at most
    ``slot / n``. The picks are therefore every seat's next turns ordered by (turns before,
    rank): level by level, each seat that has reached the level in rank order
    (``test_rotation`` checks it against the heaps pick for pick)."""
    picks: list[int] = []
    level = min(done)
    top = max(done)
    while len(picks) < count and level < top:
        picks.extend([mid for mid, d in zip(ids, done, strict=True) if d <= level])
        level += 1
    if len(picks) < count:  # every seat has reached the level: whole rounds from here
        rounds = -(-(count - len(picks)) // len(ids))
        picks.extend(list(ids) * rounds)
    return picks[:count]


def _pfair(
    order: Sequence[Seat], done: list[int], total: int, team_assigned: int, count: int
) -> list[int]:
    """The schedule for ``order`` (seats by rank) whose turns so far are ``done``."""
    # Two heaps, O(log k) a pick: seats waiting for their release slot, and released seats by
    # (deadline, rank). Rank (heavier first, then config position) breaks deadline ties.
    waiting: list[tuple[int, int]] = []
    ready: list[tuple[int, int]] = []
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


class Turn(NamedTuple):
    """One lead's pick: the member, or None when nobody could take it; ``candidates`` holds
    every active seat with the reason it was skipped for this lead (None: it could take it).
    A named tuple, not a dataclass: a batch makes one a lead, and a frozen dataclass costs
    about three times as much to build."""

    member_id: int | None
    candidates: tuple[tuple[int, str | None], ...]


@dataclass(frozen=True)
class Picks:
    turns: list[Turn]
    # turns credited to passed-over reps (member id -> number), to add to their counts
    credited: dict[int, int] = field(default_factory=dict)


def _unconstrained(
    seats: Sequence[Seat],
    blocked: Mapping[int, str],
    room: Mapping[int, int | None],
    count: int,
    max_in_a_row: int | None,
) -> bool:
    """Nobody blocked, no cap reached within ``count`` leads, no catch-up: every lead of the
    batch is the plain rotation's (``next_owners``), with every seat a candidate."""
    if max_in_a_row is not None or any(s.member_id in blocked for s in seats):
        return False
    return all((r := room.get(s.member_id)) is None or r >= count for s in seats)


def _plain_picks(seats: Sequence[Seat], count: int) -> Picks:
    order = sorted(seats, key=lambda s: (-s.weight, s.position, s.member_id))
    candidates: tuple[tuple[int, str | None], ...] = tuple((s.member_id, None) for s in order)
    owners = next_owners(seats, sum(s.assigned for s in seats), count)
    return Picks([Turn(m, candidates) for m in owners])


def pick_available(
    seats: Sequence[Seat],
    blocked: Mapping[int, str],
    room: Mapping[int, int | None],
    count: int,
    *,
    max_in_a_row: int | None = None,
    recent: Sequence[int] = (),
) -> Picks:
    """Pick the owners of the team's next ``count`` leads among the reps that can take them.

    ``seats`` are the team's active reps; ``seat.assigned`` is its turns (leads + credited
    turns) in the epoch. ``blocked`` maps a seat to why it cannot take any lead now (``away``
    or ``off_shift``); ``room`` to how many more leads its caps allow (None: no cap; 0:
    capped). ``max_in_a_row`` is K of ``catch_up: {max_in_a_row: K}`` (None: ``catch_up:
    none``); ``recent`` the team's latest owners, newest first (only its first K matter).
    When nobody is blocked, no cap can bind within ``count`` leads and there is no catch-up,
    the picks are the plain rotation's (``next_owners``, O(log k) a lead): the same picks,
    which tests/test_rotation_policies.py checks against the lead-by-lead loop.
    """
    if count <= 0:
        return Picks([])
    if any(s.weight <= 0 for s in seats):
        raise ValueError("weights must be positive")
    if seats and _unconstrained(seats, blocked, room, count, max_in_a_row):
        return _plain_picks(seats, count)
    return _picks(seats, blocked, room, count, max_in_a_row, recent)


def limits_runs(max_in_a_row: int, weight: int, total: int) -> bool:
    """Whether ``max_in_a_row`` K applies to a rep of ``weight`` in a team of ``total``: only
    when its share is at most K of every K+1 leads. A heavier rep needs longer runs for its
    share alone (weights 1, 1, 5 with K = 1: 5 of every 7 leads cannot come one at a time), so
    K would keep it below its share for ever; it follows the plain rotation instead."""
    return max_in_a_row * total >= (max_in_a_row + 1) * weight


def _picks(
    seats: Sequence[Seat],
    blocked: Mapping[int, str],
    room: Mapping[int, int | None],
    count: int,
    max_in_a_row: int | None,
    recent: Sequence[int],
) -> Picks:
    """``pick_available`` lead by lead (every case; the unconstrained one has a fast path)."""
    order = sorted(seats, key=lambda s: (-s.weight, s.position, s.member_id))
    rank = {s.member_id: i for i, s in enumerate(order)}
    total = sum(s.weight for s in order)
    turns_of = {s.member_id: s.assigned for s in order}
    left = {s.member_id: room.get(s.member_id) for s in order}
    slot = sum(turns_of.values())
    history = list(recent[: max_in_a_row or 0])
    credited: dict[int, int] = {}
    out: list[Turn] = []

    def release(s: Seat) -> int:
        return (turns_of[s.member_id] * total) // s.weight

    def deadline(s: Seat) -> int:
        return _ceil_div((turns_of[s.member_id] + 1) * total, s.weight)

    def reason(s: Seat) -> str | None:
        if s.member_id in blocked:
            return blocked[s.member_id]
        return "capped" if left[s.member_id] == 0 else None

    for _ in range(count):
        reasons = {s.member_id: reason(s) for s in order}
        candidates = tuple((s.member_id, reasons[s.member_id]) for s in order)
        can_take = [s for s in order if reasons[s.member_id] is None]
        if not can_take:
            out.append(Turn(None, candidates))
            continue
        # Passed over with a credit: capped, off shift, and away unless the team catches up.
        credit = {
            s.member_id
            for s in order
            if reasons[s.member_id] in ("capped", "off_shift")
            or (reasons[s.member_id] == "away" and max_in_a_row is None)
        }
        excluded: int | None = None
        if max_in_a_row is not None and len(can_take) > 1 and len(history) >= max_in_a_row:
            last = history[0]
            streak = all(m == last for m in history[:max_in_a_row])
            seat = next((s for s in can_take if s.member_id == last), None)
            if (
                streak
                and seat is not None
                and slot * seat.weight >= turns_of[last] * total  # not ahead of its share
                and limits_runs(max_in_a_row, seat.weight, total)
            ):
                excluded = last
        while True:
            pool = [
                s
                for s in order
                if s.member_id != excluded
                and (reasons[s.member_id] is None or s.member_id in credit)
                and release(s) <= slot
            ]
            if pool:
                best = min(pool, key=lambda s: (deadline(s), rank[s.member_id]))
                if best.member_id in credit:
                    turns_of[best.member_id] += 1
                    credited[best.member_id] = credited.get(best.member_id, 0) + 1
                    slot += 1
                    continue
            else:  # the away reps' share is not consumed: serve the earliest deadline
                best = min(
                    (s for s in can_take if s.member_id != excluded),
                    key=lambda s: (deadline(s), rank[s.member_id]),
                )
            break
        turns_of[best.member_id] += 1
        slot += 1
        if left[best.member_id] is not None:
            left[best.member_id] = left[best.member_id] - 1  # type: ignore[operator]
        history.insert(0, best.member_id)
        del history[max_in_a_row or 0 :]
        out.append(Turn(best.member_id, candidates))
    return Picks(out, credited)
