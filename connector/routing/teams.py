"""Apply the configured teams to the routing state in Postgres.

The YAML is the source of truth. Applying it is idempotent and serialised per org by an
advisory lock. An edit that changes who is in the rotation or how it is weighted (a rep
added, removed, deactivated or reweighted, or the order changed) starts a new epoch: every
member's count restarts at zero, so the rotation is fair from the edit on, in every running
process at once, because they read the seats from Postgres on every assignment. A rename alone
changes nothing in the rotation.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass

from sqlalchemy import Connection, Engine, text

import db
from connector.core.config import OrgConfig, Team

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TeamChange:
    team: str
    epoch_restarted: bool


def rotation_fingerprint(team: Team) -> str:
    """What the rotation depends on: members in order, with weight and active flag."""
    shape = [(m.crm_user_id, m.weight, m.active) for m in team.members]
    return hashlib.sha256(json.dumps(shape).encode()).hexdigest()[:32]


def _apply_team(conn: Connection, org: str, team: Team) -> TeamChange | None:
    q = db.queries("teams")
    row = conn.execute(text(q["upsert_team"]), {"org": org, "name": team.name}).one()
    team_id, fingerprint = row.id, row.fingerprint
    for position, m in enumerate(team.members):
        conn.execute(
            text(q["upsert_member"]),
            {
                "team_id": team_id,
                "crm_user_id": m.crm_user_id,
                "name": m.name,
                "weight": m.weight,
                "active": m.active,
                "position": position,
            },
        )
    conn.execute(
        text(q["drop_members"]), {"team_id": team_id, "keep": [m.crm_user_id for m in team.members]}
    )
    new_fp = rotation_fingerprint(team)
    if new_fp == fingerprint:
        return None
    if not fingerprint:  # a team seen for the first time starts in its first epoch
        conn.execute(text(q["set_fingerprint"]), {"team_id": team_id, "fingerprint": new_fp})
        return None
    conn.execute(text(q["restart_epoch"]), {"team_id": team_id, "fingerprint": new_fp})
    log.info("org %s team %s: rotation changed, new epoch", org, team.name)
    return TeamChange(team.name, True)


def apply_teams(engine: Engine, cfg: OrgConfig) -> list[TeamChange]:
    """Bring the org's teams and members in Postgres in line with its config."""
    q = db.queries("teams")
    changes: list[TeamChange] = []
    with engine.begin() as conn:
        conn.execute(text(q["lock_org"]), {"org": cfg.org})
        for team in sorted(cfg.teams, key=lambda t: t.name):
            change = _apply_team(conn, cfg.org, team)
            if change:
                changes.append(change)
        conn.execute(text(q["retire_teams"]), {"org": cfg.org, "keep": [t.name for t in cfg.teams]})
    return changes
