"""Log lines a stranger can trigger, at most one per kind per interval, with a count.

A refused request is worth a line in the log, but a flood of them must not become a flood of
lines: the first of a kind is logged at once, the ones that follow within ``interval`` seconds
are only counted, and the next line logged for that kind says how many were not.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

DEFAULT_INTERVAL = 10.0
MAX_KINDS = 1024
"""Kinds remembered at once; past it the oldest is forgotten (its count is lost)."""


class ThrottledLog:
    """``log(kind, message, *args)`` writes a warning unless one of ``kind`` was written less
    than ``interval`` seconds ago; then it only counts it."""

    def __init__(
        self,
        logger: logging.Logger,
        interval: float = DEFAULT_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
        level: int = logging.WARNING,
    ) -> None:
        self.logger = logger
        self.interval = interval
        self.clock = clock
        self.level = level
        self._last: dict[str, tuple[float, int]] = {}  # kind -> (last written, not written)
        self._lock = threading.Lock()

    def __call__(self, kind: str, message: str, *args: object) -> bool:
        """Write or count one event of ``kind``; True when a line was written."""
        now = self.clock()
        with self._lock:
            last = self._last.get(kind)
            if last is not None and now - last[0] < self.interval:
                self._last[kind] = (last[0], last[1] + 1)
                return False
            suppressed = last[1] if last is not None else 0
            self._last.pop(kind, None)
            self._last[kind] = (now, 0)
            if len(self._last) > MAX_KINDS:
                del self._last[next(iter(self._last))]
        if suppressed:
            message += " (and %d more since the previous line)"
            args = (*args, suppressed)
        self.logger.log(self.level, message, *args)
        return True
