"""One claim of an org's outbox rows, in one short transaction (``claim_rows``): it frees the
rows whose lease ended, claims ready rows from a floor id up under a lease, and gives back
what ``plan_round`` holds for later (``hold_tail``), or rolls the claim back
(``ClaimDeferred``) when nothing of it is worth a CRM request yet. The dispatcher keeps the
floor and the rescue window between claims (``connector.writeback.dispatch``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Engine, TextClause, text

import db
from connector.core.ownership import owner_key
from connector.writeback.outcomes import Claimed, plan_round

log = logging.getLogger(__name__)

_SQL: dict[str, TextClause] = {k: text(v) for k, v in db.queries("outbox").items()}


class ClaimDeferred(Exception):
    """A claim not worth a CRM request yet, rolled back (see Dispatcher.claim)."""


@dataclass(frozen=True)
class Claim:
    """What one committed claim did: the expired leases it freed (``rescued``, as of
    ``rescued_at``), every row it claimed, the rows this round sends (``kept``), and for the
    floor the lowest row it skipped between ``floor`` and ``top``, its highest claimed id."""

    rescued_at: datetime
    rescued: list[int]
    claimed: list[Claimed]
    kept: list[Claimed]
    skipped: int | None = None
    top: int = 0


def claim_rows(
    engine: Engine,
    org: str,
    token: str,
    *,
    kind: str,
    max_batch: int,
    limit: int,
    lease_seconds: float,
    floor: int,
    since: datetime | None,
) -> Claim:
    """Claim ready rows from ``floor`` up for ``token``, after freeing the leases that ended
    since ``since`` (None: all of them); raises ``ClaimDeferred`` (nothing committed) when
    ``plan_round`` keeps none of them."""
    with engine.begin() as conn:
        conn.execute(_SQL["claim_lock"], {"org": org})
        freed = conn.execute(_SQL["rescue_expired"], {"org": org, "since": since}).one()
        rescued_at, rescued = freed.at, list(freed.ids)
        if rescued:
            log.warning(
                "org %s: %d outbox rows had an expired lease; claimable again",
                org,
                len(rescued),
            )
        if conn.execute(_SQL["paused_until"], {"org": org}).first() is not None:
            # Returning commits the rescue. A full claim counts as done: while the org is
            # paused nothing is claimed, and reading from the start on every poll would
            # only cost time (with a snapshot held open, a lot of it).
            return Claim(rescued_at, rescued, [], [])
        # Asked before the claim: under claim_lock other claims can only finish, so "none
        # in flight" stays true through the claim, which then excludes no parent. Asked
        # after it, a claim that finished in between would pass for "none", though the
        # claim skipped its parents' rows: a tail that is not the tail.
        others = bool(
            conn.execute(_SQL["others_in_flight"], {"org": org, "token": token}).scalar_one()
        )
        rows = conn.execute(
            _SQL["claim"],
            {
                "org": org,
                "token": token,
                "limit": limit,
                "lease_seconds": lease_seconds,
                "floor": floor,
            },
        ).all()
        claimed = [
            Claimed(
                r.id,
                r.crm_id,
                r.owner_id,
                r.parent_id,
                r.attempts,
                float(r.age),
                frozenset(owner_key(kind, o) for o in r.replaces_owners),
            )
            for r in rows
        ]
        plan = plan_round(claimed, max_batch, limit, others_in_flight=others)
        if plan.released:
            if not plan.kept:
                # rolls the claim back (the floor learns nothing: the next claim reads
                # from where this one did)
                raise ClaimDeferred
            conn.execute(_SQL["release"], {"ids": plan.released, "token": token})
        skipped, top = None, 0
        if claimed:
            top = max(c.id for c in claimed)
            skipped = conn.execute(
                _SQL["lowest_skipped"], {"org": org, "floor": floor, "top": top}
            ).scalar_one()
    return Claim(rescued_at, rescued, claimed, plan.kept, skipped, top)
