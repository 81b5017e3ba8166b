"""How often the pipeline calls a CRM while leads trickle in, derived from the org's budget.

Under a trickle every CRM call carries whatever arrived since the last one, so the spacing
between calls sets both the latency it adds and the calls it spends. Each lead costs three
calls, each shared by its batch: the inbox worker's read back (one call per claim) and the
dispatcher's owner read and owner write (two calls per round). With the inbox claiming every
``inbox_s`` and the org's dispatchers starting a round every ``dispatch_s``, a lead waits up to
``inbox_s + dispatch_s`` (plus the work itself) and the org spends
``1/inbox_s + 2/dispatch_s`` calls a second, whatever the arrival rate, until batches fill up.

For a budget of C calls a second, the smallest ``inbox_s + dispatch_s`` with
``1/inbox_s + 2/dispatch_s = C`` is at ``dispatch_s = sqrt(2) * inbox_s`` (Lagrange), so
``inbox_s = (1 + sqrt(2)) / C``. The pipeline takes ``SHARE`` of the budget and leaves the
rest to the poller, the owner sync, reassignment and the operator's commands.

A backlog (a full claim, a full request) is not spaced: it goes at once and the client-side
rate limiter keeps it under the budget.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from connector.core.config import HubSpotCrm, SalesforceCrm

__all__ = ["NOMINAL_CALLS_PER_S", "SHARE", "Pacing", "Spacer", "org_pacing", "pacing_for"]

SHARE = 0.8
# Salesforce counts API requests per 24 hours, not per 10 seconds: its orgs are paced like
# HubSpot's default budget of 100 calls per 10 s.
NOMINAL_CALLS_PER_S = 10.0


@dataclass(frozen=True)
class Pacing:
    """Seconds between the starts of two partial inbox claims / two partial dispatcher
    rounds of one org (the dispatcher figure is org-wide, shared by its dispatchers)."""

    inbox_s: float
    dispatch_s: float


def pacing_for(calls_per_s: float, share: float = SHARE) -> Pacing:
    """The spacing that spends ``share`` of ``calls_per_s`` with the least added latency."""
    if not calls_per_s > 0 or not 0 < share <= 1:
        raise ValueError("calls_per_s must be > 0 and share in (0, 1]")
    inbox = (1 + math.sqrt(2)) / (calls_per_s * share)
    return Pacing(inbox_s=inbox, dispatch_s=math.sqrt(2) * inbox)


def org_pacing(crm: SalesforceCrm | HubSpotCrm) -> Pacing:
    """HubSpot: from its ``limit_per_10s``; Salesforce: from the nominal budget."""
    if isinstance(crm, HubSpotCrm):
        return pacing_for(crm.limit_per_10s / 10.0)
    return pacing_for(NOMINAL_CALLS_PER_S)


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

    def reserve(self) -> float:
        """Take the next start time; the seconds to wait until it (0.0: start now)."""
        with self._lock:
            now = self._clock()
            start = max(now, self._next)
            self._next = start + self.interval
            return start - now
