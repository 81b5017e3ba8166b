"""One lead in one round trip: what the config decides, computed before the team lock.

A single new lead of a rotation rule whose team has no overflow team is assigned by ONE call
of the server-side function ``route_lead`` (db/functions/routing.sql): it inserts the
lead, locks the team row, reads the members with their turns, CLI time off and caps counters,
picks with a mirror of ``connector.routing.rotation.pick_available`` (``rotation_pick``, or
its SQL form ``rotation_pick_plain`` when nothing is blocked or capped and the team has no
catch-up), and records the assignment, counts, caps counters, outbox row and decision. So the
team row is locked for one statement plus the commit. What only the config knows is computed
here (pure, clock injected) and passed in: each configured member's working hours and YAML
time off at ``now`` (as ``away``/``off_shift``), its caps, catch-up's K, the rules tried and
the SLA.

A PLAIN team's lead (no caps, no catch-up, nobody blocked by the config at ``now``:
``plain_call``) takes ``route_plain`` instead: the same work and the same records in two
statements instead of route_lead's six, the second reading the seats with a snapshot taken
under the team lock. It hands the lead to ``route_lead``, having left
nothing behind, when it must not decide it: a repeat, a rep of the team away by `connector
rep away`, a team not in the database or retired while the lead waited for its lock, or one
with no active member. Two round trips then, the same outcome, and the same records as read
through ``decision_details``: route_plain writes the pick's part of its decision in columns
of its own, so no JSON is built under the lock.

A batch whose leads all go to one such team, when its active members also share one weight
(``plain_batch_at``), is one call too once the batch's leads are stored: ``route_plain_batch``
(db/functions/routing.sql, called by ``assign.Router``) locks the team, reads the seats
under the lock, picks by round robin in SQL and records what ``record_assignments``
records.

One difference from the general path, by design: ``now`` is read before the call, so before
the wait for the team lock, while the general path reads it once the locks are held. A lead
(or a plain team's batch) that waits behind a batch across midnight or a shift's end is
judged (caps day, hours, time off, the decision's ``at``) on the earlier side of that
boundary, by the length of the wait.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from connector.core.config import OrgConfig, Team
from connector.core.hours import WeeklyHours
from connector.routing.availability import Window, config_windows, periods
from connector.routing.decisions import rule_fields, trace_key, trace_rules
from connector.routing.rules import CompiledRule, Match


@dataclass(frozen=True)
class TeamInputs:
    """A team's configured members as the single-lead call needs them (from the config)."""

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
    # no caps and no catch-up: a lead that finds nobody blocked by the config at its ``now``
    # takes the plain path (``route_plain``)
    plain: bool
    # no member has working hours or time off in the config: nobody is ever blocked by it
    unscheduled: bool = False
    # every active member has the same weight: a batch's picks are plain round robin
    equal_weights: bool = False


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
        plain=(
            team.max_in_a_row is None
            and team.caps.per_day is None
            and team.caps.per_week is None
            and all(c.per_day is None and c.per_week is None for c in caps)
        ),
        unscheduled=not any(windows) and all(m.hours is None for m in team.members),
        equal_weights=len({m.weight for m in team.members if m.active}) <= 1,
    )


def single_teams(cfg: OrgConfig) -> dict[str, TeamInputs]:
    """The teams whose leads may take the single-call path: those without an overflow team
    (a lead they cannot place moves on to another team's lock, which the general path takes
    in name order)."""
    return {t.name: team_inputs(t) for t in cfg.teams if t.overflow_team is None}


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


def plain_batch_at(inputs: TeamInputs, now: datetime) -> bool:
    """Whether a batch of the team's leads may take ``route_plain_batch`` at ``now``: every
    active member of the same weight, no caps, no catch-up, and nobody away or off shift by
    the config."""
    return (
        inputs.plain
        and inputs.equal_weights
        and (inputs.unscheduled or all(b is None for b in config_blocked(inputs, now)))
    )


def plain_call(inputs: TeamInputs, params: Mapping[str, Any]) -> bool:
    """Whether a call may take ``route_plain`` (two statements, one call): its team has no
    caps and no catch-up, and no member is away or off shift by the config at ``now``."""
    return inputs.plain and (inputs.unscheduled or all(b is None for b in params["blocked"]))


class TraceCache:
    """The start of single leads' decisions as JSON text (the source and the rules tried,
    with the values they looked at), by source and those values: a lead's trace depends on
    nothing else, and most leads share one. Bounded: emptied at ``size`` entries, and a trace
    longer than ``MAX_KEPT`` characters (long field values) is not kept."""

    MAX_KEPT = 4096

    def __init__(self, rules: Sequence[CompiledRule], size: int = 1024) -> None:
        self.rules = rules
        self.size = size
        self._fields = rule_fields(rules)
        self._text: dict[tuple[object, ...], str] = {}

    def detail(self, source: str, fields: Mapping[str, Any], now: datetime) -> str:
        """``json.dumps({"source": ..., "rules": ..., "values": ..., "at": ...})``."""
        try:
            key: tuple[object, ...] = (source, trace_key(self._fields, fields))
            start = self._text.get(key)
        except TypeError:  # an unhashable value (a list or an object): not kept
            key, start = (), None
        if start is None:
            tried, values = trace_rules(self.rules, fields)
            start = json.dumps({"source": source, "rules": tried, "values": values})[:-1]
            if key and len(start) <= self.MAX_KEPT:
                if len(self._text) >= self.size:
                    self._text.clear()
                self._text[key] = start
        return f'{start}, "at": {json.dumps(now.isoformat())}}}'


def call_params(
    cfg: OrgConfig,
    traces: TraceCache,
    inputs: TeamInputs,
    lead: tuple[str, Mapping[str, Any], str | None],
    m: Match,
    source: str,
    now: datetime,
) -> dict[str, Any]:
    """The parameters of one ``route_lead`` call; ``lead`` is (stored CRM id, fields,
    stored parent id)."""
    crm_id, fields, parent_id = lead
    p = periods(now, inputs.timezone)
    sla = cfg.sla_for(m.rule_index, m.team)
    return {
        "org": cfg.org,
        "crm_object": cfg.crm_object,
        "source": source,
        "crm_id": crm_id,
        "fields": json.dumps(fields),
        "parent_id": parent_id,
        "team": m.team,
        "rule_index": m.rule_index,
        "rule_name": m.rule_name,
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
        # the decision so far; route_lead adds the batch (the lead itself), the team, the
        # candidates, the pick and the reps away by `connector rep away`
        "detail": traces.detail(source, fields, now),
        "sla_minutes": sla.minutes if sla else None,
    }
