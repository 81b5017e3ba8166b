"""What a claimed notification becomes after its message was tried (pure).

Nothing is lost to an outage: a failure of the channel itself (transport, timeout, 5xx, a
refused token or login, a rate limit) sends the row back with a delay, however often; only a
failure that belongs to the message (no such Slack user, an address the relay refuses for
good) makes it ``dead``, with the reason, for `connector notify retry` after the fix.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

#: Longest wait between two tries of a row whose channel fails.
BACKOFF_CAP_S = 300.0


class SendError(Exception):
    """A message was not accepted. ``code`` is the channel's (Slack's error, an SMTP code)."""

    def __init__(self, code: str, message: str = "") -> None:
        super().__init__(f"{code}: {message}" if message else code)
        self.code = code
        self.message = message


class RateLimited(SendError):
    """Over the channel's rate limit: try again after ``retry_after`` seconds."""

    def __init__(self, code: str, retry_after: float) -> None:
        super().__init__(code, f"retry after {retry_after:g} s")
        self.retry_after = retry_after


class ChannelDown(SendError):
    """The channel failed (transport, 5xx, credentials): retried without limit."""


class Undeliverable(SendError):
    """This message can never go as it is (no such user, address refused for good)."""


@dataclass(frozen=True)
class Outcome:
    state: str  # sent | dead | pending | held
    error: str | None = None
    delay: float = 0.0
    refund: int = 0  # 1: the attempt the claim counted was not a try
    sent_as: str | None = None


def backoff(attempts: int, rng: Callable[[], float] = random.random) -> float:
    """Seconds before the next try after ``attempts`` failed ones: doubling from 1 s, capped,
    with jitter (half to all of it)."""
    base = min(BACKOFF_CAP_S, 2.0 ** max(0, attempts - 1))
    return base * (0.5 + 0.5 * rng())


def sent(key: str) -> Outcome:
    return Outcome("sent", sent_as=key)


def held(recheck_s: float) -> Outcome:
    return Outcome("held", delay=recheck_s, refund=1)


def not_tried(delay: float, why: str) -> Outcome:
    """Back without a try (its channel is rate limited or down in this round)."""
    return Outcome("pending", why, delay=delay, refund=1)


def after_failure(
    exc: SendError, attempts: int, rng: Callable[[], float] = random.random
) -> Outcome:
    reason = str(exc)[:300]
    if isinstance(exc, RateLimited):
        return Outcome("pending", reason, delay=max(exc.retry_after, 0.0), refund=1)
    if isinstance(exc, Undeliverable):
        return Outcome("dead", reason)
    return Outcome("pending", reason, delay=backoff(attempts, rng))
