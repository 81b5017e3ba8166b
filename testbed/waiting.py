"""Waiting on a condition with a deadline: the tests' only way to wait for something.

A fixed sleep either wastes time (the thing happened long ago) or flakes (it did not happen
yet on a loaded machine); these helpers return as soon as the condition holds and fail with
what was awaited when the deadline passes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import TypeVar

T = TypeVar("T")


def wait_until(
    check: Callable[[], T], timeout: float, what: str | Callable[[], str], interval: float = 0.02
) -> T:
    """Call ``check`` until it returns something truthy and return that; fail after
    ``timeout`` seconds with ``what`` (a text, or a function giving it then) and the last
    value in the message."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() >= deadline:
            said = what() if callable(what) else what
            raise AssertionError(
                f"timed out after {timeout} s waiting for {said} (last: {value!r})"
            )
        time.sleep(interval)


def between_stamps() -> datetime:
    """An instant after every CRM stamp made before this call and before every stamp made
    after it (the sandboxes stamp at 1 ms resolution, from this machine's clock).

    It waits (at most about 2 ms) until the clock has left the current millisecond and the
    next one, and returns the middle of that next one, in which nothing can be stamped any
    more. A mid-millisecond instant also survives the adapters' float conversions to ms.
    """
    current = _millisecond(datetime.now(UTC))
    while (middle := _millisecond(datetime.now(UTC))) <= current:
        pass
    while _millisecond(datetime.now(UTC)) <= middle:
        pass
    return middle + timedelta(microseconds=500)


def _millisecond(t: datetime) -> datetime:
    return t.replace(microsecond=t.microsecond // 1000 * 1000)
