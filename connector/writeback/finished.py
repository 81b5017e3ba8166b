"""The outbox's finished rows for the operator: the dead (with the CRM's reason) and the
superseded (with the owner found) listed, and dead rows requeued."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Engine, TextClause, text

import db

_SQL: dict[str, TextClause] = {k: text(v) for k, v in db.queries("outbox").items()}


def finished_rows(
    engine: Engine, org: str, state: str = "dead", limit: int = 100
) -> list[dict[str, Any]]:
    """Dead rows (with the CRM's reason) or superseded ones (with the owner found)."""
    with engine.connect() as conn:
        return [
            dict(r._mapping)
            for r in conn.execute(
                _SQL["list_finished"], {"org": org, "state": state, "limit": limit}
            )
        ]


def retry_dead(engine: Engine, org: str, ids: Sequence[int] | None = None) -> int:
    """Requeue dead rows (all of the org's, or the given ids); returns how many."""
    with engine.begin() as conn:
        return len(
            conn.execute(_SQL["retry_dead"], {"org": org, "ids": list(ids) if ids else None}).all()
        )
