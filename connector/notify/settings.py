"""The org's notification settings in the database (notify_settings), from its YAML: the row
queue_notifications reads in the routing transaction. No `notifications:` block, or no
rep channel: no row, and routing queues nothing."""

from __future__ import annotations

from sqlalchemy import Engine, TextClause, text

import db
from connector.core.config import OrgConfig

_SQL: dict[str, TextClause] = {k: text(v) for k, v in db.queries("notify").items()}


def apply_notify_settings(engine: Engine, cfg: OrgConfig) -> None:
    n = cfg.notifications
    with engine.begin() as conn:
        if n is None or not n.rep_channels:
            conn.execute(_SQL["delete_settings"], {"org": cfg.org})
            return
        conn.execute(
            _SQL["upsert_settings"],
            {"org": cfg.org, "channels": list(n.rep_channels), "opted_out": n.opted_out},
        )
