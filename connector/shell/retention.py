"""Retention: received personal data and finished queue rows are not kept forever.

After an org's ``retention_days`` (default 30) the fields a lead arrived with (emails, names)
are cleared, and finished inbox events, written or superseded outbox rows and skip records
are deleted; recorded routing decisions lose the field values they quoted (`explain` then
says the value was purged). Leads, assignments and the members' counts stay, so
`connector status` and the fairness figures keep working; `status`'s outbox "sent" count
then covers the retention window only. Dead rows stay until an operator retries them. Work
is done in batches of short transactions; one process per org at a time (an advisory lock),
whichever process it is.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from sqlalchemy import Engine, TextClause, text

import db

log = logging.getLogger(__name__)

SQL: dict[str, TextClause] = {k: text(v) for k, v in db.queries("retention").items()}
BATCH = 5000


@dataclass
class Purged:
    fields_cleared: int = 0
    events_deleted: int = 0
    outbox_deleted: int = 0
    skips_deleted: int = 0
    decision_values_cleared: int = 0
    notifications_deleted: int = 0
    ran: bool = True


def _drain(engine: Engine, name: str, org: str, days: int, batch: int) -> int:
    total = 0
    while True:
        with engine.begin() as conn:
            if not conn.execute(SQL["try_lock"], {"org": org}).scalar_one():
                return -1
            n = len(conn.execute(SQL[name], {"org": org, "days": days, "batch": batch}).all())
        total += n
        if n < batch:
            return total


def purge(engine: Engine, org: str, days: int, batch: int = BATCH) -> Purged:
    """Apply the retention to one org; -1 counts mean another process was purging."""
    if days < 1:
        raise ValueError("retention must be at least 1 day")
    out = Purged(
        fields_cleared=_drain(engine, "clear_fields", org, days, batch),
        events_deleted=_drain(engine, "delete_events", org, days, batch),
        outbox_deleted=_drain(engine, "delete_outbox", org, days, batch),
        skips_deleted=_drain(engine, "delete_skips", org, days, batch),
        decision_values_cleared=_drain(engine, "clear_decision_values", org, days, batch),
        notifications_deleted=_drain(engine, "delete_notifications", org, days, batch),
    )
    out.ran = (
        min(
            out.fields_cleared,
            out.events_deleted,
            out.outbox_deleted,
            out.skips_deleted,
            out.decision_values_cleared,
            out.notifications_deleted,
        )
        >= 0
    )
    log.info("org %s: retention %d days applied: %s", org, days, out)
    return out
