"""What each dashboard page shows, read from the database: one function per page, so the
handlers only render. The reps' states are ``shell/availability.py``'s (as `connector status`
shows them); the lead page's decisions are `connector explain`'s (``shell/explain.py``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Engine, TextClause, text

import db
from connector.core.config import OrgConfig
from connector.core.crm_kinds import crm_kind
from connector.notify.dispatch import finished_rows as notify_finished
from connector.shell.availability import RepNow, rep_states
from connector.shell.dashboard.figures import (
    Member,
    TeamWindow,
    fill_slots,
    hour_slots,
    start_of_day,
    team_windows,
)
from connector.shell.explain import NotFound, load_explanation, rule_line
from connector.shell.status import org_status

_SQL: dict[str, TextClause] = {k: text(v) for k, v in db.queries("dashboard").items()}

LATENCY_HOURS = 24
PROBLEM_ROWS = 50
RECENT_DECISIONS = 50


@dataclass
class Latency:
    slots: list[datetime]
    p50: list[float | None]
    p99: list[float | None]
    counts: list[int]


@dataclass
class Overview:
    org: str
    now: datetime
    today: list[TeamWindow]
    week: list[TeamWindow]
    latency: Latency
    depth: dict[str, int]
    oldest_open: dict[str, Any] | None
    dead: list[dict[str, Any]]
    superseded: list[dict[str, Any]]
    decisions: list[dict[str, Any]]
    reps: dict[str, list[RepNow]] = field(default_factory=dict)
    # notifications that died (connector/notify), newest PROBLEM_ROWS
    dead_notifications: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class LeadStory:
    """Everything recorded about one lead's routing."""

    lead: dict[str, Any]
    assignment: dict[str, Any] | None
    events: list[dict[str, Any]] = field(default_factory=list)
    outbox: list[dict[str, Any]] = field(default_factory=list)
    # the latest routing decision's rules tried, as `connector explain` writes them
    rules: list[str] = field(default_factory=list)
    skipped: dict[str, Any] | None = None
    # `connector explain --json`'s decisions (candidates, skip reasons, the pick); none for a
    # lead merged into another
    decisions: list[dict[str, Any]] = field(default_factory=list)


def overview(engine: Engine, cfg: OrgConfig, now: datetime) -> Overview:
    """The org page: fair share (today, 7 days), latency, outbox depth, problems, decisions."""
    org = cfg.org
    slots = hour_slots(now, LATENCY_HOURS)
    team_order = [t.name for t in cfg.teams]
    with engine.connect() as conn:
        conn.execute(_SQL["no_jit"])
        members = [
            Member(r.team_id, r.team, r.member_id, r.crm_user_id, r.name, r.weight, r.active)
            for r in conn.execute(_SQL["members"], {"org": org})
        ]

        def counts(since: datetime) -> dict[int, int]:
            rows = conn.execute(_SQL["window_counts"], {"org": org, "since": since})
            return {r.member_id: r.n for r in rows}

        today = team_windows(members, counts(start_of_day(now)), team_order)
        week = team_windows(members, counts(now - timedelta(days=7)), team_order)
        lat_rows = {
            r.bucket: r
            for r in conn.execute(
                _SQL["latency_buckets"],
                {"org": org, "since": slots[0], "bucket": "1 hour", "origin": slots[0]},
            )
        }
        depth = {r.state: r.n for r in conn.execute(_SQL["outbox_depth"], {"org": org})}
        oldest = conn.execute(_SQL["oldest_open"], {"org": org}).first()
        dead, superseded = (
            [
                dict(r._mapping)
                for r in conn.execute(
                    _SQL["finished_rows"], {"org": org, "state": state, "limit": PROBLEM_ROWS}
                )
            ]
            for state in ("dead", "superseded")
        )
        decisions = [
            dict(r._mapping)
            for r in conn.execute(_SQL["recent_decisions"], {"org": org, "limit": RECENT_DECISIONS})
        ]
    latency = Latency(
        slots,
        fill_slots(slots, {b: r.p50 for b, r in lat_rows.items()}),
        fill_slots(slots, {b: r.p99 for b, r in lat_rows.items()}),
        [int(lat_rows[s].n) if s in lat_rows else 0 for s in slots],
    )
    return Overview(
        org=org,
        now=now,
        today=today,
        week=week,
        latency=latency,
        depth={s: depth.get(s, 0) for s in ("pending", "claimed", "dead", "superseded")},
        oldest_open=dict(oldest._mapping) if oldest is not None else None,
        dead=dead,
        superseded=superseded,
        decisions=decisions,
        reps=rep_states(engine, cfg, now),
        dead_notifications=(
            notify_finished(engine, org, "dead", limit=PROBLEM_ROWS)
            if cfg.notifications is not None
            else []
        ),
    )


def totals(engine: Engine, cfg: OrgConfig) -> dict[str, Any]:
    """All-time figures: exactly what `connector status --json` prints (the same function)."""
    return org_status(engine, cfg)


class BadCrmId(ValueError):
    """Text that cannot be a CRM record id of the org's CRM; the message says why."""


MAX_CRM_ID = 64


def lead_by_crm_id(engine: Engine, cfg: OrgConfig, crm_id: str) -> int | None:
    """The id of the org's live lead with this CRM record id, in any of the CRM's forms (a
    15-character Salesforce id finds the lead stored under its 18 characters); None when
    there is none. BadCrmId for text that is no id of the org's CRM."""
    value = crm_id.strip()
    kind = crm_kind(cfg.crm.kind)
    if not value or len(value) > MAX_CRM_ID or not value.isprintable():
        raise BadCrmId(f"a CRM record id has 1 to {MAX_CRM_ID} printable characters")
    if kind.typed_ids and not kind.is_id(value):
        raise BadCrmId(f"{value!r} is not a {kind.label} record id")
    params = {"org": cfg.org, "crm_object": cfg.crm_object, "crm_id": kind.id_key(value)}
    with engine.connect() as conn:
        row = conn.execute(text(db.queries("explain")["lead"]), params).first()
    return None if row is None else int(row.id)


def lead_story(engine: Engine, cfg: OrgConfig, lead_id: int) -> LeadStory | None:
    """The explanation page's data: the lead, its assignment (rule, team, rep), the pushes
    that named its record, its outbox rows with attempts and errors, any skip record, and
    the decisions `connector explain` shows. None when the org has no such lead."""
    org = cfg.org
    with engine.connect() as conn:
        lead = conn.execute(_SQL["lead"], {"org": org, "lead_id": lead_id}).first()
        if lead is None:
            return None
        key = {"org": org, "crm_id": lead.crm_id, "crm_object": lead.crm_object}
        assignment = conn.execute(_SQL["lead_assignment"], {"lead_id": lead_id}).first()
        events = [dict(r._mapping) for r in conn.execute(_SQL["lead_events"], key)]
        outbox = [dict(r._mapping) for r in conn.execute(_SQL["lead_outbox"], {"lead_id": lead_id})]
        skipped = conn.execute(_SQL["lead_skipped"], key).first()
    decisions: list[dict[str, Any]] = []
    if lead.merged_into is None and lead.crm_object == cfg.crm_object:
        try:
            decisions = load_explanation(engine, cfg, lead.crm_id)["decisions"]
        except NotFound:  # merged or purged since the read above
            decisions = []
    # the latest routing decision's rules tried, as `connector explain` writes them
    routed = [d for d in decisions if d["kind"] == "route"]
    last = routed[-1] if routed else {}
    rules = [rule_line(r, last.get("values")).strip() for r in last.get("rules", [])]
    return LeadStory(
        lead=dict(lead._mapping),
        assignment=dict(assignment._mapping) if assignment is not None else None,
        events=events,
        outbox=outbox,
        skipped=dict(skipped._mapping) if skipped is not None else None,
        rules=rules,
        decisions=decisions,
    )
