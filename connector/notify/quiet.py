"""Quiet hours: whether a rep's messages wait because the rep is off shift or away (pure).

A rep is quiet when the org chose `quiet_when_away` and, in every team that lists the rep,
the rep is away (YAML time off, or `connector rep away`: ``away``) or outside its working
hours at ``now`` (the same test the rotation uses, connector/routing/availability.py). An
inactive rep is not quiet: its messages (a lead taken away) go out.
"""

from __future__ import annotations

from datetime import datetime

from connector.core.config import OrgConfig
from connector.routing.availability import Candidate, Window, blocked_reason, config_windows

#: How long held messages wait before their rep is looked at again.
RECHECK_SECONDS = 60.0


def is_quiet(
    cfg: OrgConfig,
    crm_user_id: str,
    now: datetime,
    away: tuple[datetime, datetime] | None = None,
) -> bool:
    n = cfg.notifications
    if n is None or not n.quiet_when_away:
        return False
    found = False
    for team in cfg.teams:
        for m in team.members:
            if m.crm_user_id != crm_user_id:
                continue
            found = True
            windows = config_windows(team, m)
            if away is not None:
                windows += (Window(away[0], away[1]),)
            c = Candidate(member_id=0, active=True, hours=m.hours, away=windows)
            if blocked_reason(c, now) is None:
                return False
    return found
