"""Where a queue claim starts reading pending rows (pure): the inbox worker holds one per org,
each outbox dispatcher one for its org.

A snapshot held open (a long report, a forgotten ``BEGIN``) keeps every row version a claim
has left behind, and its index entries: no vacuum may remove what the snapshot might still
read. A claim that reads the pending events "oldest first" from the start of the index steps
over every event claimed since that snapshot began, a cost that grows all the while the
snapshot stays open. Starting at a *floor* id skips them: the index is in id order, so the
scan begins past the entries of events already claimed.

Ids come from a sequence in insert order, but an insert can commit after a later id was
claimed, and an event can become pending again under an old id. So:

* the floor only passes the ids of claims made at least ``lag`` seconds ago (an insert takes
  milliseconds; the receivers give up on one after 10 s);
* an event this worker rescheduled (a failed CRM read) keeps the floor at or below its id
  until a claim takes it again or it has been due for a whole ``full_every``;
* a claim may leave rows pending below the highest id it took (the outbox's rows of a parent
  in flight, a retry not yet due, a partial request given back): it tells the lowest of
  them (``skipped``), and the floor stays at or below it until a claim that reads that far
  again tells another;
* every ``full_every`` seconds a claim reads from the start (floor 0) and frees the claims of
  workers whose lease expired. Whatever the floor passed (an insert slower than the lag,
  another process's retry, a dead event requeued by ``connector inbox retry``) is claimed by
  one of these, oldest first: later, never lost. When such a claim comes back full, the
  claims after it *sweep* on from where it stopped until one comes back short, so thousands
  of requeued events drain at the worker's pace, not a batch per ``full_every``.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable

__all__ = ["FLOOR_LAG_S", "ClaimFloor"]

# A row inserted this long after a later id was claimed can be passed by the floor (and is
# then claimed by the next full claim): an insert takes milliseconds, the receivers give up on
# one after 10 s (EventWriter.store_timeout), and routing's transactions are as short.
FLOOR_LAG_S = 15.0


class ClaimFloor:
    """One org's floor; not thread-safe (the worker's loop is its only user)."""

    def __init__(
        self, lag: float, full_every: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if lag < 0 or full_every <= 0:
            raise ValueError("lag must be >= 0 and full_every > 0")
        self.lag = lag
        self.full_every = full_every
        self._clock = clock
        self._full_at = -float("inf")
        self._safe = 0  # every event with an id up to this was claimed (or not ready then)
        self._marks: deque[tuple[float, int]] = deque()  # (when, highest id claimed)
        self._retried: dict[int, float] = {}  # id -> when it is due again
        self._sweep: int | None = None  # where a sweep after a full claim goes on from
        self._skipped: int | None = None  # lowest id a claim left pending below its top...
        self._skipped_top = 0  # ...and the highest id those reports covered

    @classmethod
    def for_lease(cls, lease_seconds: float) -> ClaimFloor:
        """The floor of a claim under this lease: a full claim (which also frees every expired
        lease) every min(30 s, a quarter of the lease): 30 s for the inbox's 120-s lease, 15 s
        for the outbox's 60-s lease."""
        return cls(lag=FLOOR_LAG_S, full_every=max(min(30.0, lease_seconds / 4), 0.01))

    def next_claim(self) -> tuple[int, bool]:
        """(the lowest id to read, whether this claim is a full one from the start)."""
        now = self._clock()
        if now >= self._full_at:
            return 0, True
        while self._marks and self._marks[0][0] <= now - self.lag:
            self._safe = max(self._safe, self._marks.popleft()[1])
        floor = self._safe + 1
        if self._retried:
            floor = min(floor, min(self._retried))
        if self._skipped is not None:
            floor = min(floor, self._skipped)
        if self._sweep is not None:
            if self._sweep >= floor:  # the sweep has reached the floor: done
                self._sweep = None
            else:
                floor = self._sweep
        return floor, False

    @property
    def sweeping(self) -> bool:
        """Whether the next claim goes on from a full claim that came back full."""
        return self._sweep is not None

    def claimed(self, ids: Iterable[int], full: bool, exhausted: bool = True) -> None:
        """Record a claim's ids (possibly none); ``full`` as returned by ``next_claim``;
        ``exhausted``: it took everything that was ready (fewer than it asked for)."""
        now = self._clock()
        got = list(ids)
        if full:
            self._full_at = now + self.full_every
            # due before the previous full claim: a full claim has had its chance at them
            stale = [i for i, due in self._retried.items() if due <= now - self.full_every]
            for i in stale:
                del self._retried[i]
        if full or self._sweep is not None:
            self._sweep = None if exhausted or not got else max(got) + 1
        for i in got:
            self._retried.pop(i, None)
        if got:
            self._marks.append((now, max(got)))

    def skipped(self, lowest: int | None, floor: int, top: int) -> None:
        """After a claim from ``floor`` that took rows up to id ``top``: the lowest id it left
        pending in that range, or None. What earlier claims told stands where this range
        does not cover it: a report below ``floor`` or above ``top`` still holds, and when
        an earlier report covered ids beyond ``top``, the floor stays at or below ``top + 1``
        until a claim covers them again."""
        prev, prev_top = self._skipped, self._skipped_top
        if prev is None:
            self._skipped, self._skipped_top = lowest, max(top, prev_top)
        elif not floor <= prev <= top:  # this claim did not read the earlier report's row
            self._skipped = prev if lowest is None else min(prev, lowest)
            self._skipped_top = max(top, prev_top)
        elif top >= prev_top:  # it read everything the earlier reports covered
            self._skipped, self._skipped_top = lowest, top
        else:  # it stopped short of what they covered: (top, prev_top] is unknown again
            self._skipped = top + 1 if lowest is None else min(lowest, top + 1)
            self._skipped_top = prev_top

    def rescheduled(self, ids_due_in: Iterable[tuple[int, float]]) -> None:
        """Events this worker set back to pending, each due in so many seconds."""
        now = self._clock()
        for i, due_in in ids_due_in:
            self._retried[i] = now + max(due_in, 0.0)

    def rescued(self, ids: Iterable[int]) -> None:
        """Events whose claim had expired, pending again under their old ids."""
        self.rescheduled((i, 0.0) for i in ids)
