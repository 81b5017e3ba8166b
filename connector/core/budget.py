"""One CRM call budget per org, shared by every process through PostgreSQL.

Each process keeps its own rolling-window limiter (``crm_adapters/ratelimit.py``), which
alone lets N processes together make N times the CRM's limit. Before each call an adapter
also takes one call from the org's row in ``crm_budgets`` (``crm_budget_take`` in
``db/functions/budget.sql``: one statement, the row locked for it, the server's clock): at
most the limit in any window, counted over every process, as the CRM counts it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from sqlalchemy import Engine

import db
from connector.core import outage
from connector.core.database import one_statement

log = logging.getLogger(__name__)

_TAKE = db.pyformat(db.queries("budget")["take"])

WINDOW_PAD = 1.05
"""The server counts arrival times; processes count send times: windows are padded (as the
HubSpot adapter pads its own)."""

MAX_WAIT_S = 60.0
"""The longest one call waits for the shared budget; then it goes (the local limiter and
the CRM's 429 handling still apply)."""


def padded_window(window_s: float) -> float:
    """The window the shared budget counts in for a CRM window of ``window_s``."""
    return window_s * WINDOW_PAD + 0.05


class SharedBudget:
    """``acquire()`` blocks until the org's shared budget gave this process one call: at
    most ``limit`` calls in any ``window_s`` (padded) over every process."""

    def __init__(
        self,
        engine: Engine,
        org: str,
        limit: int,
        window_s: float = 10.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if limit < 1 or window_s <= 0:
            raise ValueError("limit must be >= 1 and window_s > 0")
        self.engine = engine
        self.params = {"org": org, "limit": limit, "window_s": padded_window(window_s)}
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
