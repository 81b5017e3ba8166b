"""The router's server calls: what the config decides, computed before the team's lock.

Every rotation pick is made on the server, by ``route_team`` (db/routing.sql; one call for a
team's 1..N leads) or ``route_new_lead`` (one new lead: its insert, then ``route_team``, in one
round trip). Either locks the team row, reads the members with a snapshot taken under the
lock, picks with ``rotation_picks`` (the production form of ``rotation.pick_available``) and
records everything with ``record_assignments``; so the team row is locked for that call plus
the commit. What only the config knows is computed here (pure, clock injected) and passed
in: each configured member's working hours and YAML time off at ``now`` (as
``away``/``off_shift``), its caps, catch-up's K, the rules tried and the SLA.

``now`` is read before the call, so before any wait for the team lock: a lead that waits
behind a batch across midnight or a shift's end is judged (caps day, hours, time off, the
decision's ``at``) on the earlier side of that boundary, by the length of the wait.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from connector.core.config import OrgConfig, Team
from connector.core.hours import WeeklyHours
from connector.routing.availability import Window, config_windows, periods
from connector.routing.decisions import rule_fields, trace_key, trace_rules
from connector.routing.rules import Match, RuleSet


@dataclass(frozen=True)
class TeamInputs:
    """A team's configured members as the server calls take them (from the config)."""

    name: str
    timezone: str
    users: tuple[str, ...]
    windows: tuple[tuple[Window, ...], ...]
    hours: tuple[WeeklyHours | None, ...]
    per_day: tuple[int | None, ...]
    per_week: tuple[int | None, ...]
    team_per_day: int | None
    team_per_week: int | None
    max_in_a_row: int | None
    overflow_team: str | None
    # no member has working hours or time off in the config: nobody is ever blocked by it
    unscheduled: bool = False


def team_inputs(team: Team) -> TeamInputs:
    caps = [team.caps_of(m) for m in team.members]
    windows = tuple(config_windows(team, m) for m in team.members)
    return TeamInputs(
        name=team.name,
        timezone=team.timezone,
        users=tuple(m.crm_user_id for m in team.members),
        windows=windows,
        hours=tuple(m.hours for m in team.members),
        per_day=tuple(c.per_day for c in caps),
        per_week=tuple(c.per_week for c in caps),
        team_per_day=team.caps.per_day,
        team_per_week=team.caps.per_week,
        max_in_a_row=team.max_in_a_row,
        overflow_team=team.overflow_team,
        unscheduled=not any(windows) and all(m.hours is None for m in team.members),
    )


def config_blocked(inputs: TeamInputs, now: datetime) -> list[str | None]:
    """Per configured member: ``away`` (YAML time off), ``off_shift`` (outside its hours) or
    None, at ``now``; time off set from the command line is read under the lock."""
    if inputs.unscheduled:
        return [None] * len(inputs.users)
    out: list[str | None] = []
    for windows, hours in zip(inputs.windows, inputs.hours, strict=True):
        if any(w.covers(now) for w in windows):
            out.append("away")
        elif hours is not None and not hours.is_open(now):
            out.append("off_shift")
        else:
            out.append(None)
    return out


def team_params(inputs: TeamInputs, now: datetime) -> dict[str, Any]:
    """The parameters of a team's call that come from the config, at ``now``."""
    p = periods(now, inputs.timezone)
    return {
        "team": inputs.name,
        "now": now,
        "day": p.day,
        "week": p.week,
        "users": list(inputs.users),
        "blocked": config_blocked(inputs, now),
        "per_day": list(inputs.per_day),
        "per_week": list(inputs.per_week),
        "team_per_day": inputs.team_per_day,
        "team_per_week": inputs.team_per_week,
        "max_in_a_row": inputs.max_in_a_row,
    }


class TraceCache:
    """The start of single leads' decisions as JSON text (the source and the rules tried,
    with the values they looked at), by source and those values: a lead's trace depends on
    nothing else, and most leads share one. Bounded: emptied at ``size`` entries, and a trace
    longer than ``MAX_KEPT`` characters (long field values) is not kept."""

    MAX_KEPT = 4096

    def __init__(self, rules: RuleSet, size: int = 1024) -> None:
        self.rules = rules
        self.size = size
        self._fields = rule_fields(rules)
        self._text: dict[tuple[object, ...], str] = {}

    def detail(self, source: str, fields: Mapping[str, Any], now: datetime, tail: str) -> str:
        """``json.dumps({"source": ..., "rules": ..., "values": ..., "at": ..., **tail})``
        where ``tail`` is the JSON text of the rest's members (no braces)."""
        try:
            key: tuple[object, ...] = (source, trace_key(self._fields, fields))
            start = self._text.get(key) if self.rules.timeless else None
        except TypeError:  # an unhashable value (a list or an object): not kept
            key, start = (), None
        if not self.rules.timeless:  # a relative date: the trace depends on the instant too
            key = ()
        if start is None:
            tried, values = trace_rules(self.rules, fields, now)
            start = json.dumps({"source": source, "rules": tried, "values": values})[:-1]
            if key and len(start) <= self.MAX_KEPT:
                if len(self._text) >= self.size:
                    self._text.clear()
                self._text[key] = start
        return f'{start}, "at": {json.dumps(now.isoformat())}, {tail}}}'


def lead_params(
    cfg: OrgConfig,
    traces: TraceCache,
    inputs: TeamInputs,
    lead: tuple[str, Mapping[str, Any], str | None],
    m: Match,
    source: str,
    now: datetime,
) -> dict[str, Any]:
    """The parameters of one ``route_new_lead`` call; ``lead`` is (stored CRM id, fields,
    stored parent id). Its decision is the one a batch's lead gets: the trace, the instant,
    the team, the outcome and the SLA (``DecisionRecorder.shared``); the server adds the
    batch (the lead itself), the pick and the seats."""
    crm_id, fields, parent_id = lead
    sla = cfg.sla_for(m.rule_index, m.team)
    minutes = sla.minutes if sla else None
    tail = f'"team": {json.dumps(m.team)}, "outcome": "assigned"'
    if minutes is not None:
        tail += f', "sla_minutes": {minutes}'
    return {
        **team_params(inputs, now),
        "org": cfg.org,
        "crm_object": cfg.crm_object,
        "source": source,
        "crm_id": crm_id,
        "fields": json.dumps(fields),
        "parent_id": parent_id,
        "rule_index": m.rule_index,
        "rule_name": m.rule_name,
        "detail": traces.detail(source, fields, now, tail),
        "sla_minutes": minutes,
    }
