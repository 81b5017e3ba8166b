"""One CRM call budget per org, shared by every process through PostgreSQL.

Each process keeps its own rolling-window limiter (``crm_adapters/ratelimit.py``), which
alone lets N processes together make N times the CRM's limit. Before each call an adapter
also takes one call from the org's token bucket in ``crm_budgets`` (``crm_budget_take`` in
``db/functions/budget.sql``: one statement, the row locked for it, the server's clock), so
all of them together stay under the limit. The bucket's shape (``bucket_for``, pure) is
chosen so that no rolling window of the CRM's length ever holds more than its limit.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import Engine

import db
from connector.core import outage
from connector.core.database import one_statement

log = logging.getLogger(__name__)

_TAKE = db.pyformat(db.queries("budget")["take"])

WINDOW_PAD = 1.05
"""The server counts arrival times; processes count send times: windows are padded."""

MAX_WAIT_S = 60.0
"""The longest one call waits for the shared budget; then it goes (the local limiter and
the CRM's 429 handling still apply)."""


@dataclass(frozen=True)
class Bucket:
    rate: float  # calls per second
    burst: float  # calls that may go at once after a quiet spell


def bucket_for(limit: int, window_s: float = 10.0) -> Bucket:
    """A bucket that gives at most ``limit`` calls in any ``window_s``: at most ``burst`` at
    once plus ``rate * window_s`` while the window lasts, and burst + (limit - burst) /
    WINDOW_PAD stays under the limit. The burst is a tenth of the limit (at least 1)."""
    if limit < 1 or window_s <= 0:
        raise ValueError("limit must be >= 1 and window_s > 0")
    burst = max(1.0, float(limit // 10))
    rate = max(limit - burst, 1.0) / (window_s * WINDOW_PAD)
    return Bucket(rate, burst)


class SharedBudget:
    """``acquire()`` blocks until the org's shared bucket gave this process one call."""

    def __init__(
        self,
        engine: Engine,
        org: str,
        bucket: Bucket,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.engine = engine
        self.params = {"org": org, "rate": bucket.rate, "burst": bucket.burst}
        self.sleep = sleep
        self.waited_s = 0.0

    def acquire(self) -> float:
        """Take one call; the seconds waited. With the database unavailable the call goes
        on the process's own limiter (the outage is counted, see core/outage.py)."""
        waited = 0.0
        while waited < MAX_WAIT_S:
            try:
                row = one_statement(self.engine, _TAKE, self.params)
            except Exception as exc:
                if not outage.counted("shared CRM budget", exc):
                    log.warning("shared CRM budget: %s; the call goes", type(exc).__name__)
                break
            wait = float(row[0]) if row is not None else 0.0
            if wait <= 0:
                break
            wait = min(wait, MAX_WAIT_S - waited)
            self.sleep(wait)
            waited += wait
        self.waited_s += waited
        return waited
