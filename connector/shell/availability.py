"""Each rep's state now and its last 24 hours, read once for `connector status`, `connector
rep list` and the dashboard (``rep_states``); the wording is ``routing/rep_state.py``'s."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Engine, text

import db
from connector.core.config import OrgConfig
from connector.routing.availability import member_candidate, periods
from connector.routing.rep_state import RepState, below_share, fair_shares, state_now

WINDOW = timedelta(hours=24)
WINDOW_TEXT = "the last 24h"
# the newest rotation picks of an org counted for "passed over" (one decision row each)
MAX_PICKS = 5000


@dataclass(frozen=True)
class RepNow:
    """One configured member of a team: its state now, and its last 24 hours: leads, its
    weighted fair share of the team's leads, the team's recorded picks it was a seat in and
    why it was passed over in them, and (when at least one lead short) why it is below."""

    team: str
    member_id: int
    crm_user_id: str
    name: str
    weight: int
    state: RepState
    leads: int
    fair_share: float
    picks: int
    skips: dict[str, int] = field(default_factory=dict)
    below: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "now": self.state.as_dict(),
            "last_24h": {
                "leads": self.leads,
                "fair_share": round(self.fair_share, 2),
                "picks": self.picks,
                "passed_over": dict(sorted(self.skips.items())),
                "below_fair_share": self.below,
            },
        }


def rep_states(engine: Engine, cfg: OrgConfig, now: datetime) -> dict[str, list[RepNow]]:
    """Team name -> its configured members (config order of the teams, position order of
    the members), each as the router would judge it at ``now``."""
    since = now - WINDOW
    with engine.connect() as conn:
        team_ids = {
            r.name: r.id
            for r in conn.execute(text(db.queries("availability")["teams"]), {"org": cfg.org})
        }
        away_reasons = {
            r.crm_user_id: r.reason
            for r in conn.execute(text(db.queries("reps")["time_off"]), {"org": cfg.org})
        }
        counts = {
            r.member_id: r.n
            for r in conn.execute(
                text(db.queries("dashboard")["window_counts"]), {"org": cfg.org, "since": since}
            )
        }
        skips: dict[int, dict[str | None, int]] = defaultdict(dict)
        for r in conn.execute(
            text(db.queries("availability")["recent_skips"]),
            {"org": cfg.org, "since": since, "limit": MAX_PICKS},
        ):
            skips[r.member_id][r.skip] = r.n
        seats: dict[str, list[Any]] = {}
        for team in cfg.teams:
            if team.name not in team_ids:
                continue
            p = periods(now, team.timezone)
            seats[team.name] = list(
                conn.execute(
                    text(db.queries("routing")["team_candidates"]),
                    {"org": cfg.org, "team_id": team_ids[team.name], "day": p.day, "week": p.week},
                )
            )
    out: dict[str, list[RepNow]] = {}
    for team in cfg.teams:
        rows = seats.get(team.name, [])
        configured = {m.crm_user_id: m for m in team.members}
        total = sum(counts.get(r.id, 0) for r in rows)
        active = [r.id for r in rows if r.active]
        shares = fair_shares({r.id: r.weight for r in rows}, active, total)
        reps = []
        for r in rows:
            c = member_candidate(
                team,
                configured.get(r.crm_user_id),
                r,
                (r.day_count, r.week_count),
                away_reasons.get(r.crm_user_id),
            )
            mine = skips.get(r.id, {})
            passed = {k: n for k, n in mine.items() if k is not None}
            leads = counts.get(r.id, 0)
            reps.append(
                RepNow(
                    team=team.name,
                    member_id=r.id,
                    crm_user_id=r.crm_user_id,
                    name=r.name,
                    weight=r.weight,
                    state=state_now(c, now, team.timezone),
                    leads=leads,
                    fair_share=shares[r.id],
                    picks=sum(mine.values()),
                    skips=passed,
                    below=below_share(leads, shares[r.id], sum(mine.values()), passed, WINDOW_TEXT)
                    if r.active
                    else None,
                )
            )
        out[team.name] = reps
    return out
