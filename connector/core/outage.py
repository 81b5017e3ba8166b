"""Database outages in the log: one warning when the database goes away, a summary every
``SUMMARY_EVERY_S`` while it stays down, one line when it is back. Meanwhile every failed
operation (a webhook answered 503, an inbox or dispatcher round, a poll, a health check) is
counted by where it happened instead of being logged, so an outage of any length writes a
few lines, not one (or a traceback) per attempt.

Failures are reported by the places that catch them (``counted``); the database boundary
(``core/database.py``) reports each new connection and each statement that succeeded
(``DATABASE.recovered``, a no-op while the database is up).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable

from connector.core.errors import DatabaseUnavailable

# a success this soon after the first failure does not end an outage (``recovered``)
SETTLE_S = 1.0
SUMMARY_EVERY_S = 30.0

AFTERMATH_S = 5.0
"""After the database is back, connections that died with it still fail once each as their
pools reach them: failures this soon after the end of an outage are counted with it
(``late_failures``), not taken for a new one."""


def _first_line(exc: BaseException) -> str:
    text = str(getattr(exc, "message", "") or exc).strip()
    line = text.splitlines()[0] if text else type(exc).__name__
    return line if len(line) <= 200 else line[:197] + "..."


class Outage:
    """The process's view of the database: up, or down since when, with the failures
    counted meanwhile. Thread-safe; ``recovered`` costs one attribute read while up."""

    def __init__(
        self,
        logger: logging.Logger,
        summary_every_s: float = SUMMARY_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.log = logger
        self.summary_every_s = summary_every_s
        self.clock = clock
        self._lock = threading.Lock()
        self.down_since: float | None = None
        self._summary_at = 0.0
        self._back_at = -float("inf")
        self._failures: Counter[str] = Counter()
        self.late_failures = 0

    def failed(self, where: str, exc: BaseException) -> None:
        """One operation at ``where`` failed because the database is unavailable."""
        with self._lock:
            now = self.clock()
            first = self.down_since is None
            if first and now - self._back_at < AFTERMATH_S:
                self.late_failures += 1
                return
            if first:
                self.down_since = self._summary_at = now
                self._failures.clear()
            self._failures[where] += 1
            summary = not first and now - self._summary_at >= self.summary_every_s
            if summary:
                self._summary_at = now
            down_s, total, detail = self._state(now)
        if first:
            self.log.warning(
                "database unavailable (%s: %s); failures are counted until it is back, with "
                "a summary every %g s",
                where,
                _first_line(exc),
                self.summary_every_s,
            )
        elif summary:
            self.log.warning(
                "database still unavailable after %.0f s: %d operations failed (%s)",
                down_s,
                total,
                detail,
            )

    def recovered(self) -> None:
        """A connection opened or a statement succeeded: the database is back if it was
        down for at least ``SETTLE_S``. Sooner, the success is most likely of a statement
        that was already running on another connection when the first failure came (it was
        answered before the server went), not a sign that the server is back."""
        if self.down_since is None:
            return
        with self._lock:
            if self.down_since is None or self.clock() - self.down_since < SETTLE_S:
                return
            self._back_at = self.clock()
            down_s, total, detail = self._state(self._back_at)
            self.down_since = None
            self._failures.clear()
        self.log.warning(
            "database is back after %.1f s: %d operations failed meanwhile (%s)",
            down_s,
            total,
            detail,
        )

    def counted(self, where: str, exc: BaseException) -> bool:
        """Count ``exc`` if it says the database is unavailable (the caller then logs
        nothing); False for any other error, which the caller logs as before."""
        if isinstance(exc, DatabaseUnavailable):
            self.failed(where, exc)
            return True
        return False

    def _state(self, now: float) -> tuple[float, int, str]:
        down_s = now - (self.down_since if self.down_since is not None else now)
        detail = ", ".join(f"{w} {n}" for w, n in sorted(self._failures.items()))
        return down_s, sum(self._failures.values()), detail


DATABASE = Outage(logging.getLogger("connector.database"))
"""The process's one outage record (every engine and pool of a process reaches one
database server)."""


def counted(where: str, exc: BaseException) -> bool:
    """``DATABASE.counted``: True when ``exc`` was a database outage, now counted."""
    return DATABASE.counted(where, exc)
