"""`connector status`: what the routing state holds for one org."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, text

import db
from connector.core.config import OrgConfig

OUTBOX_STATES = ("pending", "claimed", "sent", "dead", "superseded")


def org_status(engine: Engine, cfg: OrgConfig) -> dict[str, Any]:
    """The documented JSON shape: org, leads, teams (config order) with members, outbox."""
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
        counts = [m["assigned"] for m in team["members"] if m["active"]]
        spread = (max(counts) - min(counts)) if counts else 0
        lines.append(f"  team {team['name']} (spread {spread})")
        for m in team["members"]:
            flag = "" if m["active"] else "  (inactive)"
            if m.get("account_matched"):
                flag += f"  ({m['account_matched']} by account)"
            lines.append(
                f"    {m['name']:<28} {m['crm_user_id']:<20} w={m['weight']:<3} "
                f"{m['assigned']:>8}{flag}"
            )
    skipped = status["skipped"]
    if skipped:
        lines.append(
            f"  skipped (the CRM said not ours): {sum(skipped.values())} ("
            + ", ".join(f"{k} {v}" for k, v in skipped.items())
            + ")"
        )
    inbox = status["inbox"]
    lines.append(f"  inbox: {inbox['pending']} waiting for a CRM read, {inbox['dead']} dead")
    ob = status["outbox"]
    lines.append(
        f"  outbox: {ob['pending']} pending, {ob['sent']} sent, {ob['dead']} dead, "
        f"{ob['superseded']} superseded"
    )
    return "\n".join(lines)
