"""The read of a what-if replay's window: the org's stored leads, decisions, rotations, caps'
counts, latest owners and account mirror, in one READ ONLY transaction (``load_history``).

``first_decisions`` and ``turns_in`` are the pure parts: which recorded decision holds each
team's turns at the window's start, and the turns it recorded.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Engine, text

import db
from connector.core.config import OrgConfig
from connector.core.ownership import owner_key
from connector.routing.decisions import expand, member_ids
from connector.routing.domains import AccountRow, lead_domains
from connector.routing.replay_history import History, HistoryLead, LoadKey, Mirror, TeamRotation
from connector.routing.rules import match, org_rules
from connector.routing.simulate import replay_batches

_SQL = db.queries("simulate")
# How far back the caps' weekly counts can reach from the window's start.
LOAD_DAYS = 8


def _history_lead(r: Any) -> HistoryLead:
    overflowed = r.overflow_from if isinstance(r.overflow_from, list) else []
    away = r.away if isinstance(r.away, list) else []
    return HistoryLead(
        r.lead_id,
        r.crm_id,
        r.fields if isinstance(r.fields, dict) else json.loads(r.fields),
        r.received_at,
        r.team,
        r.owner,
        r.unassigned_reason if r.assignment_id is None else None,
        r.assignment_id,
        r.epoch,
        bool(r.reassigned),
        r.current_team,
        r.parent_id,
        datetime.fromisoformat(r.at) if r.at else None,
        r.batch,
        r.decision_id,
        frozenset(str(x) for x in away),
        tuple(str(x) for x in overflowed),
        bool(r.by_account),
    )


def _touches(lead: HistoryLead, team: str) -> bool:
    """Whether the lead's recorded decision lists ``team``'s candidates (picked, left
    unassigned or passed on to an overflow team there)."""
    return (lead.team == team and not lead.by_account) or team in lead.overflowed


def first_decisions(leads: Sequence[HistoryLead], teams: Iterable[str]) -> dict[str, int]:
    """team -> the lead of its first decision in the window, in replay order (pure)."""
    todo = set(teams)
    out: dict[str, int] = {}
    for batch in replay_batches(leads):
        for lead in batch:
            for team in [t for t in todo if _touches(lead, t)]:
                out[team] = lead.lead_id
                todo.discard(team)
        if not todo:
            break
    return out


def turns_in(detail: Mapping[str, Any], team: str) -> dict[str, int] | None:
    """The rotation's turns per rep as a decision recorded them for ``team`` (pure)."""
    lists = [detail.get("candidates")] if detail.get("team") == team else []
    lists += [h.get("candidates") for h in detail.get("overflow_from", []) if h.get("team") == team]
    for cands in lists:
        if cands:
            return {str(c["crm_user_id"]): int(c["count"]) for c in cands}
    return None


def _turns_start(conn: Connection, leads: Sequence[HistoryLead], teams: Iterable[str]) -> Any:
    firsts = first_decisions(leads, teams)
    if not firsts:
        return {}
    details: dict[int, Any] = {}
    for r in conn.execute(
        text(_SQL["first_decisions"]), {"lead_ids": sorted(set(firsts.values()))}
    ):
        details.setdefault(r.lead_id, r.detail)
    # picks recorded compactly name members by id: expand them to the full form
    ids = sorted({i for d in details.values() for i in member_ids(d)})
    if ids:
        who = {
            r.id: (r.crm_user_id, r.name) for r in conn.execute(text(_SQL["members"]), {"ids": ids})
        }
        details = {k: expand(d, who) for k, d in details.items()}
    out: dict[str, dict[str, int]] = {}
    for team, lead_id in firsts.items():
        turns = turns_in(details.get(lead_id) or {}, team)
        if turns is not None:
            out[team] = turns
    return out


def _loads_before(conn: Connection, cfg: OrgConfig, since: datetime) -> dict[LoadKey, int]:
    params = {
        "org": cfg.org,
        "since": since,
        "teams": [t.name for t in cfg.teams],
        "zones": [t.timezone for t in cfg.teams],
    }
    out: Counter[LoadKey] = Counter()
    for r in conn.execute(text(_SQL["loads_before"]), params):
        week = r.day - timedelta(days=r.day.weekday())
        out[(r.team, r.crm_user_id, "day", r.day)] += r.n
        out[(r.team, r.crm_user_id, "week", week)] += r.n
    return dict(out)


def _recent_before(conn: Connection, cfg: OrgConfig, since: datetime) -> dict[str, list[str]]:
    ks = {t.name: t.max_in_a_row for t in cfg.teams if t.max_in_a_row}
    if not ks:
        return {}
    out: dict[str, list[str]] = defaultdict(list)
    params = {"org": cfg.org, "since": since, "teams": sorted(ks), "k": max(ks.values())}
    for r in conn.execute(text(_SQL["recent_before"]), params):
        out[r.team].append(r.crm_user_id)
    return dict(out)


def _mirror(conn: Connection, cfg: OrgConfig, leads: Sequence[HistoryLead]) -> Mirror:
    """The mirror rows the leads of the proposed config's account_owner rules can match, in
    one statement."""
    rules = org_rules(cfg)
    kind = cfg.crm.kind
    parents: set[str] = set()
    domains: set[str] = set()
    for lead in leads:
        m = match(rules, lead.fields, lead.judged_at)
        if m is None or cfg.rules[m.rule_index].route_to != "account_owner":
            continue
        if lead.parent_id:
            parents.add(owner_key(kind, lead.parent_id))
        domains.update(d for _, d in lead_domains(lead.fields, cfg.match_fields))
    if not parents and not domains:
        return Mirror()
    mirror = Mirror()
    params = {"org": cfg.org, "crm_ids": sorted(parents), "domains": sorted(domains)}
    for r in conn.execute(text(_SQL["accounts"]), params):
        row = AccountRow(r.crm_id, r.owner_id, r.modified_at)
        if r.kind == "account":
            mirror.by_id[r.crm_id] = row
        else:
            mirror.by_domain.setdefault(r.domain, []).append(row)
    return mirror


def load_history(engine: Engine, cfg: OrgConfig, since: datetime) -> History:
    """Read the window in one READ ONLY transaction (the replay never writes)."""
    params = {"org": cfg.org, "since": since}
    with engine.connect() as conn, conn.begin():
        conn.execute(text("SET TRANSACTION READ ONLY"))
        leads = [_history_lead(r) for r in conn.execute(text(_SQL["history"]), params)]
        team_rows = conn.execute(text(_SQL["teams"]), params).all()
        count_rows = conn.execute(text(_SQL["counts_before"]), params).all()
        turns = _turns_start(conn, leads, {r.team for r in team_rows})
        loads = _loads_before(conn, cfg, since)
        recent = _recent_before(conn, cfg, since)
        mirror = _mirror(conn, cfg, leads)
    rotations = {r.team: TeamRotation(r.epoch, r.fingerprint) for r in team_rows}
    names = {r.crm_user_id: r.name for r in team_rows}
    before: dict[str, dict[int, dict[str, int]]] = defaultdict(lambda: defaultdict(dict))
    for r in count_rows:
        before[r.team][r.epoch][r.crm_user_id] = r.n
    return History(
        leads,
        rotations,
        {t: dict(e) for t, e in before.items()},
        names,
        turns,
        loads,
        recent,
        mirror,
    )
