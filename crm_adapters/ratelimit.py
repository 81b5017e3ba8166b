"""Client-side rolling-window budget so calls stay under a CRM's per-window request limit."""

from __future__ import annotations

import bisect
import math
import threading
import time
from collections import deque
from collections.abc import Callable

__all__ = ["MAX_HOLD_S", "RollingWindowLimiter"]

# The longest any hold lasts (a safety cap; a value that is not a finite number counts as
# it). The HubSpot adapter holds for at most one window of its general limiter (10.55 s).
MAX_HOLD_S = 60.0


class RollingWindowLimiter:
    """At most `limit` acquisitions in any `window` seconds; thread-safe, blocks until allowed."""

    def __init__(
        self,
        limit: int,
        window: float,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if limit < 1 or window <= 0:
            raise ValueError("limit must be >= 1 and window > 0")
        self.limit = limit
        self.configured_limit = limit
        self.window = window
        self._clock = clock
        self._sleep = sleep
        self._stamps: deque[float] = deque()
        self._lock = threading.Lock()
        self._held_until = float("-inf")
        self.waited_s = 0.0

    def _prune(self, now: float) -> None:
        while self._stamps and now - self._stamps[0] >= self.window:
            self._stamps.popleft()

    def try_acquire(self) -> float:
        """Take a slot and return 0.0, or return the seconds to wait before one frees up."""
        with self._lock:
            now = self._clock()
            if now < self._held_until:
                return self._held_until - now
            self._prune(now)
            if len(self._stamps) < self.limit:
                self._stamps.append(now)
                return 0.0
            # the wait until enough stamps leave (observe can leave more than the limit)
            return max(self._stamps[len(self._stamps) - self.limit] + self.window - now, 1e-3)

    def acquire(self) -> float:
        """Block until a slot is taken; return the seconds spent waiting."""
        waited = 0.0
        while True:
            wait = self.try_acquire()
            if wait == 0.0:
                if waited:
                    with self._lock:
                        self.waited_s += waited
                return waited
            self._sleep(wait)
            waited += wait

    def observe(self, server_max: int, remaining: int, sent_at: float | None = None) -> None:
        """Learn from the CRM's own count (its rate-limit headers on a call's answer).

        The limit becomes the smaller of the configured one and the server's; and when the
        server has counted more calls in its window than this process has (other processes
        with the same token), the missing ones are counted here, as made when this call was
        sent (`sent_at`, default now): the server counted them before it answered, so they
        free up there no later than here, with the window's padding to spare. (Stamped at the
        answer instead, a slow answer would bring back calls of our own that had left the
        window.) Calls still in flight are counted here and not there, which is why the two
        counts are compared, never added.
        """
        if server_max < 1 or remaining < 0:
            return
        used = min(max(server_max - remaining, 0), server_max)
        with self._lock:
            now = self._clock()
            self.limit = min(self.configured_limit, server_max)
            at = now if sent_at is None else min(sent_at, now)
            self._prune(now)
            while len(self._stamps) < used:
                bisect.insort(self._stamps, at)

    def hold(self, seconds: float) -> None:
        """The server refused a call: give out no slot for `seconds` from now (its Retry-After,
        or a whole window when it named no time), so a refusal is not retried into. At most
        MAX_HOLD_S; a value that is not a finite number counts as that."""
        if not math.isfinite(seconds):
            seconds = MAX_HOLD_S
        with self._lock:
            until = self._clock() + min(max(seconds, 0.0), MAX_HOLD_S)
            self._held_until = max(self._held_until, until)

    def held_for(self) -> float:
        """Seconds left of a hold (0.0 when none)."""
        with self._lock:
            return max(self._held_until - self._clock(), 0.0)

    def in_window(self) -> int:
        """Slots used in the current window."""
        with self._lock:
            self._prune(self._clock())
            return len(self._stamps)
