"""How often the pipeline calls a CRM while leads trickle in, derived from the org's budget.

Under a trickle every CRM call carries whatever arrived since the last one, so the spacing
of the calls sets both the latency they add and the calls they spend. A cycle of the pipeline
costs three calls, each shared by the cycle's leads: the inbox worker's read back (one per
claim), then the dispatcher's owner read and owner write (two per round). The inbox starts a
claim at most every ``cycle_s``, and so does each org's dispatching (org-wide), so a trickle
costs at most ``3 / cycle_s`` calls a second per process, whatever its rate, until batches
fill up (replicas each pace themselves, as each keeps its own rate limiter); the
pipeline takes ``SHARE`` of the budget and leaves the rest to the poller, the owner sync,
reassignment and the operator's commands.

In one process (``connector run``) the inbox worker nudges the org's dispatchers as soon as a
round's routing has committed (``Nudges``), so a lead waits at most one cycle plus the
work itself. A worker with no dispatchers in its process (``connector serve``) announces the
round through the database, and ``connector dispatch`` processes nudge theirs when they hear
it (``connector.writeback.wakeups``). Without a nudge, dispatchers start a round every
``cycle_s`` (``Spacer``), which can add up to one more cycle.

A backlog (a full claim, a full request) is not spaced: it goes at once and the client-side
rate limiter keeps it under the budget.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = [
    "CALLS_PER_CYCLE",
    "NOMINAL_CALLS_PER_S",
    "SHARE",
    "Nudges",
    "Pacing",
    "Spacer",
    "pacing_for",
]

SHARE = 0.8
# Salesforce counts API requests per 24 hours, not per 10 seconds: its orgs are paced like
# HubSpot's default budget of 100 calls per 10 s.
NOMINAL_CALLS_PER_S = 10.0


CALLS_PER_CYCLE = 3  # read back, owner read, owner write


@dataclass(frozen=True)
class Pacing:
    """Seconds between the starts of two partial inbox claims of an org, and between two
    partial dispatcher rounds of the org (org-wide in a process)."""

    cycle_s: float
    # The records one read-back call carries: a paced claim of more than this many events
    # takes whole reads only (1: any number).
    read_unit: int = 1


def pacing_for(calls_per_s: float, share: float = SHARE, read_unit: int = 1) -> Pacing:
    """The cycle that spends at most ``share`` of ``calls_per_s`` under a trickle."""
    if not calls_per_s > 0 or not 0 < share <= 1:
        raise ValueError("calls_per_s must be > 0 and share in (0, 1]")
    return Pacing(cycle_s=CALLS_PER_CYCLE / (calls_per_s * share), read_unit=read_unit)


class Nudges:
    """Per org, the events of its dispatchers in this process; the inbox worker of this
    process (or, in ``connector dispatch``, the outbox listener) sets them after each round
    that claimed events (once its routing committed), so the owner writes go out in the same
    cycle."""

    def __init__(self) -> None:
        self._events: dict[str, list[threading.Event]] = {}
        self._lock = threading.Lock()

    def listener(self, org: str) -> threading.Event:
        """A new event for one dispatcher of ``org``."""
        event = threading.Event()
        with self._lock:
            self._events.setdefault(org, []).append(event)
        return event

    def nudge(self, org: str) -> None:
        with self._lock:
            events = list(self._events.get(org, ()))
        for event in events:
            event.set()

    def wake_all(self) -> None:
        """Wake every dispatcher (at shutdown, after its stop event is set)."""
        with self._lock:
            events = [e for es in self._events.values() for e in es]
        for event in events:
            event.set()


class Spacer:
    """Hands out start times at least ``interval`` seconds apart; thread-safe, so the
    dispatchers of one org in one process share one and space their rounds org-wide."""

    def __init__(self, interval: float, clock: Callable[[], float] = time.monotonic) -> None:
        if interval < 0:
            raise ValueError("interval must be >= 0")
        self.interval = interval
        self._clock = clock
        self._next = -math.inf
        self._lock = threading.Lock()

    def note(self) -> None:
        """A round started now without waiting for its turn (a nudged one, or one whose wait
        for its booked turn a nudge cut short): the next turn is an interval from now. Turns
        booked before are dropped: the dispatchers waiting for them were woken by the same
        nudge, and kept, they would push every later turn further out (each cycle of nudges
        used to book a turn it never took: 10 s ahead after 10 s of traffic, so a round for
        rows from elsewhere came that much later once the nudges stopped)."""
        with self._lock:
            self._next = self._clock() + self.interval

    def reserve(self) -> float:
        """Take the next start time; the seconds to wait until it (0.0: start now)."""
        with self._lock:
            now = self._clock()
            start = max(now, self._next)
            self._next = start + self.interval
            return start - now
