"""`connector status`: what the routing state holds for one org."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Engine, text

import db
from connector.core.config import OrgConfig
from connector.shell.availability import rep_states
from connector.shell.tables import table

OUTBOX_STATES = ("pending", "claimed", "sent", "dead", "superseded")
HEAD_NOW = ("NOW", "WHY BELOW FAIR SHARE")


def org_status(engine: Engine, cfg: OrgConfig, now: datetime | None = None) -> dict[str, Any]:
    """The documented JSON shape: org, leads, teams (config order) with members (each with
    its state at ``now`` and its last 24 hours), outbox."""
    now = now or datetime.now(UTC)
    states = {
        (team, r.crm_user_id): r
        for team, reps in rep_states(engine, cfg, now).items()
        for r in reps
    }
    q = db.queries("status")
    with engine.connect() as conn:
        leads = conn.execute(text(q["lead_counts"]), {"org": cfg.org}).one()
        members = conn.execute(text(q["member_counts"]), {"org": cfg.org}).all()
        outbox = {r.state: r.n for r in conn.execute(text(q["outbox_counts"]), {"org": cfg.org})}
        skipped = {r.reason: r.n for r in conn.execute(text(q["skipped_counts"]), {"org": cfg.org})}
        inbox = {r.state: r.n for r in conn.execute(text(q["inbox_counts"]), {"org": cfg.org})}
    by_team: dict[str, list[dict[str, Any]]] = {}
    for r in members:
        if not r.in_config and r.assigned == 0:
            continue
        member: dict[str, Any] = {
            "crm_user_id": r.crm_user_id,
            "name": r.name,
            "assigned": r.assigned,
            "weight": r.weight,
            "active": r.active and r.in_config,
        }
        if cfg.account_matching:  # of `assigned`, those given to their account's owner
            member["account_matched"] = r.account_matched
        rep = states.get((r.team, r.crm_user_id)) if r.in_config else None
        if rep is not None:
            member.update(rep.as_dict())
        by_team.setdefault(r.team, []).append(member)
    teams = [{"name": t.name, "members": by_team.get(t.name, [])} for t in cfg.teams]
    return {
        "org": cfg.org,
        "leads": {
            "total": leads.total,
            "assigned": leads.assigned,
            "unassigned": leads.total - leads.assigned,
        },
        # Records the CRM said were not ours to route (by reason), never assigned or written.
        "skipped": dict(sorted(skipped.items())),
        "inbox": {
            "pending": inbox.get("pending", 0) + inbox.get("claimed", 0),
            "dead": inbox.get("dead", 0),
        },
        "teams": teams,
        "outbox": {
            # "pending" counts what the CRM has not seen yet, claimed rows included.
            "pending": outbox.get("pending", 0) + outbox.get("claimed", 0),
            "sent": outbox.get("sent", 0),
            "dead": outbox.get("dead", 0),
            "superseded": outbox.get("superseded", 0),
        },
    }


def format_status(status: dict[str, Any]) -> str:
    """A human-readable table of the same figures."""
    leads = status["leads"]
    lines = [
        f"org {status['org']}: {leads['total']} leads, {leads['assigned']} assigned, "
        f"{leads['unassigned']} unassigned"
    ]
    for team in status["teams"]:
        lines.append(f"team {team['name']}")
        rows = []
        for m in team["members"]:
            day = m.get("last_24h")
            total = str(m["assigned"])
            if m.get("account_matched"):
                total += f" ({m['account_matched']} by account)"
            rows.append(
                [
                    m["name"],
                    m["crm_user_id"],
                    m["weight"],
                    total,
                    day["leads"] if day else "",
                    f"{day['fair_share']:.1f}" if day else "",
                    m["now"]["text"] if "now" in m else "no longer configured",
                    (day["below_fair_share"] or "") if day else "",
                ]
            )
        lines += table(
            [*("REP", "CRM USER", "WEIGHT", "ALL TIME", "24H", "FAIR 24H"), *HEAD_NOW],
            rows,
            right=(2, 3, 4, 5),
            indent="  ",
        )
    lines.append(
        "  ALL TIME: leads assigned ever; 24H: leads of the last 24 hours; FAIR 24H: the rep's "
        "weighted share of its team's leads of the last 24 hours"
    )
    skipped = status["skipped"]
    if skipped:
        lines.append(
            f"skipped (the CRM said not ours): {sum(skipped.values())} ("
            + ", ".join(f"{k} {v}" for k, v in skipped.items())
            + ")"
        )
    inbox = status["inbox"]
    lines.append(f"inbox: {inbox['pending']} waiting for a CRM read, {inbox['dead']} dead")
    ob = status["outbox"]
    lines.append(
        f"outbox: {ob['pending']} pending, {ob['sent']} sent, {ob['dead']} dead, "
        f"{ob['superseded']} superseded"
    )
    return "\n".join(lines)
