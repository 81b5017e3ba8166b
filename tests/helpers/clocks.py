"""Clocks a test sets by hand: what the code under test reads instead of the real time."""

from __future__ import annotations

from datetime import datetime


class Ticks:
    """A monotonic clock in seconds (for ``time.monotonic``); move it with ``now += s``."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        """A sleep on this clock: time moves, nobody waits."""
        self.now += seconds


class WallClock:
    """A wall clock (for ``now()``-style callables returning an aware datetime); set ``at``."""

    def __init__(self, at: datetime) -> None:
        self.at = at

    def __call__(self) -> datetime:
        return self.at
