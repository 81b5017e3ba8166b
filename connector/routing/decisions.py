"""Routing decisions, recorded when they are made (for `connector explain`).

The router (and reassignment, the SLA check) tell a ``DecisionRecorder`` what they did at
each point: the rules tried, the team, every candidate rep with the reason it was skipped
(``None`` = eligible), the pick and its standing in the rotation, an optional matched
account. ``flush`` writes one ``routing_decisions`` row per lead in ONE statement of the same
transaction as the assignment, so a decision is on record exactly when its assignment is.

Skip reasons are named values: ``inactive``, ``capped``, ``away``, ``off_shift`` (from
``connector.routing.availability``) and ``current_owner`` (a re-route), passed in each lead's
candidate list. A routed lead's decision also holds ``at`` (the instant availability was
judged at), ``batch`` (the first lead id of its batch) and ``away_by_command`` (reps away by
`connector rep away` then): `connector simulate` replays by them. Building the records is pure
(``trace_rules``, ``pick_standings``).

**A pick is recorded compactly**: ``seats`` holds four parallel lists
(member ids, weights, rotation counts at that moment, skip reasons) in the rotation's order,
and ``chosen_id`` the member picked; names, CRM user ids and the chosen rep's standing are
not repeated in every row. ``expand`` (pure) turns such a record back into the full form
(``candidates`` with names, ``chosen`` with its weighted share), the form older rows were
written in, so `connector explain` and `connector simulate` read both. A batch of 500 leads
built and sent about 1 KB of JSON per lead in the full form, most of the batch's time.

**Where a decision is read.** A rotation's picks (``record_assignments`` on the server) store
the pick's part of the decision (``batch``, ``epoch``, ``chosen_id``, ``seats``) in columns of
the ``routing_decisions`` row, so that none of it is built or parsed as JSON while the team's
lock is held. The other writers (an account owner's lead, a lead no rule matched, a
reassignment) keep them in ``detail``. Readers of whole decisions read the view
``decision_details``, which folds the columns back into ``detail`` under the same keys: one
shape whoever wrote the row (`connector simulate`'s history reads single keys from the table
itself). What is left of a batch's decisions mostly repeats from lead to lead (the trace of
the same rule, the batch's instant, the team): ``group_picked`` and ``shared`` hand the
server each distinct one once, with each pick's position in them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any, Protocol

from sqlalchemy import Connection, TextClause, text

import db
from connector.core.config import OrgConfig
from connector.core.rule_syntax import Not, Test
from connector.routing.rules import CompiledRule, Node, RuleSet, Values, conjuncts
from connector.routing.rules import _norm as norm

SKIP_REASONS = ("inactive", "capped", "away", "off_shift", "current_owner")
"""Named reasons a candidate rep was passed over (None = eligible); `current_owner` is the
rep a re-route takes the lead from."""

_SQL: dict[str, TextClause] = {k: text(v) for k, v in db.queries("decisions").items()}


class SeatRow(Protocol):
    """What the recorder needs of a member row: its rotation turns at the moment of a pick
    (``Standing`` and ``reassign._Member`` provide these)."""

    @property
    def id(self) -> int: ...
    @property
    def crm_user_id(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def weight(self) -> int: ...
    @property
    def assigned_in_epoch(self) -> int: ...


def _json_arg(value: object) -> object:
    return value.isoformat() if isinstance(value, date) else value


def trace_check(node: Node, v: Values) -> dict[str, Any]:
    """One condition's result for a trace: a test's field, operator and arguments (the
    original ``Field: [values]`` form as ``allowed``), a group's parts."""
    c = node.cond
    ok = node.check(v)
    if isinstance(c, Test):
        if c.plain and c.type == "text" and not c.case_sensitive:
            return {"field": c.field, "allowed": sorted({norm(a) for a in c.args}), "ok": ok}
        out: dict[str, Any] = {"field": c.field, "op": c.op, "args": [_json_arg(a) for a in c.args]}
        if c.type != "text":
            out["type"] = c.type
        if c.case_sensitive:
            out["case_sensitive"] = True
        out["ok"] = ok
        return out
    kind = "not" if isinstance(c, Not) else c.kind
    return {"group": kind, "ok": ok, "checks": [trace_check(k, v) for k in node.children]}


LISTED = 20
"""The rules a trace lists before its match; the ones after them are counted, not listed."""


def _traced(
    rule: CompiledRule, v: Values, fields: Mapping[str, object], values: dict[str, Any]
) -> dict[str, Any]:
    checks = [trace_check(n, v) for n in conjuncts(rule.node)] if rule.node else []
    for name in rule.fields:
        values[name] = fields.get(name)
    team = rule.team
    if rule.zone is not None and all(c["ok"] for c in checks):
        row = rule.zone.row(v)
        team = row.team if row is not None else None
        checks.append(
            {"territory": rule.zone.name, "row": row.where if row else None, "ok": bool(row)}
        )
    return {
        "index": rule.index,
        "name": rule.name,
        "team": team,
        "matched": all(c["ok"] for c in checks),
        "checks": checks,
    }


def trace_rules(
    rules: RuleSet, fields: Mapping[str, object], now: datetime | None = None
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Each rule tried, in order, up to the first match, with every condition's result
    (relative dates read at ``now``); after ``LISTED`` rules that did not match, one entry
    ``{"not_listed": n}`` counts the next ones that did not either, then the match.

    Returns (rules, values): the field values a condition looked at are kept apart, so
    retention can remove them from a decision without losing its shape.
    """
    tried: list[dict[str, Any]] = []
    values: dict[str, Any] = {}
    v = Values(fields, now, None)
    for rule in rules:
        if len(tried) == LISTED:
            m = rules.first(v, start=rule.index)
            stop = m.rule_index if m is not None else len(rules)
            if stop > rule.index:
                tried.append({"not_listed": stop - rule.index})
            if m is not None:
                tried.append(_traced(rules[stop], v, fields, values))
            break
        entry = _traced(rule, v, fields, values)
        tried.append(entry)
        if entry["matched"]:
            break
    return tried, values


def trace_key(names: Sequence[str], fields: Mapping[str, object]) -> tuple[object, ...]:
    """What a lead's trace (``trace_rules``) depends on: the values of the fields ``names``
    the rules look at, each with its type (1, 1.0 and True are one key of a dict, but not one
    trace). A value that cannot be hashed makes the key unusable as one (TypeError)."""
    key = tuple([(type(v), v) for v in [fields.get(f) for f in names]])
    hash(key)
    return key


def candidate_entry(seat: SeatRow, count: int, reason: str | None) -> dict[str, Any]:
    return {
        "member_id": seat.id,
        "crm_user_id": seat.crm_user_id,
        "name": seat.name,
        "weight": seat.weight,
        "count": count,
        "skip": reason,
    }


def pick_standings(
    members: Sequence[SeatRow],
    candidates: Sequence[tuple[int, str | None]],
    picks: Sequence[int],
) -> list[tuple[list[dict[str, Any]], dict[str, Any]]]:
    """For each pick in order: (every candidate as it stood at that moment, the chosen rep's
    standing: count and weighted share among the eligible reps, before and after).

    The counts are the rotation's (``assigned_in_epoch``), advanced by the earlier picks of
    the same batch, which is exactly what the rotation saw at each pick.
    """
    by_id = {m.id: m for m in members}
    reasons = dict(candidates)
    eligible = [mid for mid, r in candidates if r is None]
    counts = {m.id: m.assigned_in_epoch for m in members}
    total_weight = sum(by_id[m].weight for m in eligible)
    out: list[tuple[list[dict[str, Any]], dict[str, Any]]] = []
    for member_id in picks:
        team_total = sum(counts[m] for m in eligible)
        entries = [candidate_entry(by_id[mid], counts[mid], reasons[mid]) for mid, _ in candidates]
        seat = by_id[member_id]
        before = counts[member_id]
        chosen = {
            "member_id": member_id,
            "crm_user_id": seat.crm_user_id,
            "name": seat.name,
            "weight": seat.weight,
            "total_weight": total_weight,
            "count_before": before,
            "team_total_before": team_total,
            "share_before": round(team_total * seat.weight / total_weight, 4)
            if total_weight
            else 0.0,
            "share_after": round((team_total + 1) * seat.weight / total_weight, 4)
            if total_weight
            else 0.0,
        }
        counts[member_id] = before + 1
        out.append((entries, chosen))
    return out


def expand(detail: Mapping[str, Any], who: Mapping[int, tuple[str, str]]) -> dict[str, Any]:
    """A decision in the full form: a compact pick (``seats``, ``chosen_id``) becomes
    ``candidates`` and ``chosen`` as ``pick_standings`` builds them; ``who`` maps a member id
    to its (CRM user id, name). A record already in the full form is returned as it is."""
    out = dict(detail)
    seats = out.pop("seats", None)
    chosen_id = out.pop("chosen_id", None)
    if seats is None:
        return out
    ids = seats["ids"]
    rows = [
        Standing(mid, *who.get(mid, ("?", "?")), w, c)
        for mid, w, c in zip(ids, seats["weights"], seats["counts"], strict=True)
    ]
    candidates = list(zip(ids, seats["skips"], strict=True))
    if chosen_id is None:
        out["candidates"] = [
            candidate_entry(r, r.assigned_in_epoch, s)
            for r, (_, s) in zip(rows, candidates, strict=True)
        ]
        return out
    ((entries, chosen),) = pick_standings(rows, candidates, [chosen_id])
    out["candidates"] = entries
    out["chosen"] = chosen
    return out


@dataclass(frozen=True)
class Standing:
    """A member as a decision records it: its rotation count at the moment of one pick."""

    id: int
    crm_user_id: str
    name: str
    weight: int
    assigned_in_epoch: int


def member_ids(detail: Mapping[str, Any]) -> list[int]:
    """The member ids a compact decision names (to look their names up)."""
    seats = detail.get("seats")
    return list(seats["ids"]) if isinstance(seats, Mapping) else []


@dataclass
class _Pending:
    detail: dict[str, Any]
    sla_minutes: int | None = None


@dataclass
class PickedDecisions:
    """A team's picked leads' decisions, grouped (``DecisionRecorder.group_picked``): the
    first lead's of each distinct decision, the SLA it gets, each lead's position among them
    and its SLA minutes."""

    team: str
    lead_ids: list[int]
    parts: list[_Pending]
    minutes_of_part: list[int | None]
    positions: list[int]
    slas: list[int | None]


# The keys of a decision that holds nothing of its own lead: its trace (``started``: the same
# objects for leads whose rule fields have the same values), the batch's instant, and what
# its team and rule give it. Anything else (an account, an absence, an overflow, a detail
# changed through ``detail``) makes it the lead's own.
_SHARED_KEYS = frozenset(
    {"source", "rules", "values", "at", "batch", "team", "outcome", "sla_minutes"}
)


def _shared_key(d: Mapping[str, Any], sla_minutes: int | None) -> tuple[object, ...] | None:
    """What a decision with only shared parts is equal by, else None, once given
    ``sla_minutes`` when that is not None (as ``shared`` gives it). The trace's lists are
    compared by identity: ``started`` shares one pair of objects per distinct trace, and
    they stay alive (and unchanged) for the whole batch."""
    if not d.keys() <= _SHARED_KEYS:
        return None
    return (
        id(d.get("rules")),
        id(d.get("values")),
        d.get("source"),
        d.get("at"),
        d.get("batch"),
        d.get("team"),
        d.get("outcome"),
        d.get("sla_minutes") if sla_minutes is None else sla_minutes,
    )


def rule_fields(rules: RuleSet) -> list[str]:
    """The fields ``rules`` look at, sorted: what a lead's trace depends on (``trace_key``)."""
    return rules.fields


class DecisionRecorder:
    """Collects one batch's decisions; ``flush`` writes them in the caller's transaction."""

    def __init__(self, cfg: OrgConfig, rules: RuleSet, kind: str = "route") -> None:
        self.cfg = cfg
        self.rules = rules
        self.kind = kind
        self._by_lead: dict[int, _Pending] = {}
        self._fields = rule_fields(rules)
        self._slas: dict[tuple[int, str], int | None] = {}
        self._traces: dict[tuple[object, ...], tuple[list[dict[str, Any]], dict[str, Any]]] = {}

    def _entry(self, lead_id: int) -> _Pending:
        p = self._by_lead.get(lead_id)
        if p is None:
            p = self._by_lead[lead_id] = _Pending({})
        return p

    def detail(self, lead_id: int) -> dict[str, Any]:
        """The decision recorded so far for one lead (a live reference)."""
        return self._entry(lead_id).detail

    def started(
        self, lead_id: int, source: str, fields: Mapping[str, object], now: datetime | None = None
    ) -> None:
        """The lead is new and its rules are about to be matched at ``now``: trace them (a
        trace depends only on the values of the fields the rules look at, and on the instant,
        one for the batch, so a batch traces each distinct combination once)."""
        try:
            key = trace_key(self._fields, fields)
        except TypeError:  # an unhashable value (a list or an object): no cache
            tried, values = trace_rules(self.rules, fields, now)
        else:
            try:
                tried, values = self._traces[key]
            except KeyError:
                traced = trace_rules(self.rules, fields, now)
                tried, values = self._traces.setdefault(key, traced)
        self._entry(lead_id).detail.update({"source": source, "rules": tried, "values": values})

    def judged_at(self, lead_ids: Sequence[int], at: datetime, batch: int) -> None:
        """The instant availability (caps, hours, time off) was judged at for these leads, and
        their batch (its first lead id): `connector simulate` replays each batch at its instant."""
        stamp = {"at": at.isoformat(), "batch": batch}
        entry = self._entry
        for lead_id in lead_ids:
            entry(lead_id).detail.update(stamp)

    def away_by_command(self, lead_id: int, crm_user_ids: Sequence[str]) -> None:
        """Reps away by `connector rep away` when this lead was judged (the table keeps only
        each rep's latest absence, so the replay reads past ones here)."""
        if crm_user_ids:
            d = self._entry(lead_id).detail
            d["away_by_command"] = sorted({*d.get("away_by_command", ()), *crm_user_ids})

    def account(self, lead_id: int, entry: Mapping[str, Any]) -> None:
        """An account match decided the lead (or was tried): which account, whose owner."""
        self._entry(lead_id).detail["account"] = dict(entry)

    def team_pick(
        self,
        team: str,
        epoch: int,
        members: Sequence[SeatRow],
        candidates: Sequence[tuple[int, str | None]],
        lead_ids: Sequence[int],
        picks: Sequence[int],
        rule_indexes: Sequence[int] | None = None,
    ) -> None:
        """One team's picks: ``candidates`` = (member id, skip reason or None) for every rep
        considered, in the rotation's order; ``picks`` = the member chosen for each lead (the
        counts advance pick by pick, as the rotation's did)."""
        by_id = {m.id: m for m in members}
        ids = [mid for mid, _ in candidates]
        weights = [by_id[mid].weight for mid in ids]
        skips = [r for _, r in candidates]
        counts = {m.id: m.assigned_in_epoch for m in members}
        for i, (lead_id, pick) in enumerate(zip(lead_ids, picks, strict=True)):
            rule = rule_indexes[i] if rule_indexes is not None else None
            self.seat_pick(lead_id, team, epoch, (ids, weights, [counts[m] for m in ids], skips))
            self.picked(lead_id, team, pick, rule)
            counts[pick] += 1

    def seat_pick(
        self,
        lead_id: int,
        team: str,
        epoch: int,
        seats: tuple[list[int], list[int], list[int], list[str | None]],
    ) -> None:
        """The candidates of one pick, compactly: (member ids, weights, counts, skip reasons),
        parallel lists in the rotation's order."""
        ids, weights, counts, skips = seats
        self._entry(lead_id).detail.update(
            {
                "team": team,
                "epoch": epoch,
                "seats": {"ids": ids, "weights": weights, "counts": counts, "skips": skips},
            }
        )

    def picked(self, lead_id: int, team: str, member_id: int, rule_index: int | None) -> None:
        """The lead went to ``member_id``; with its rule, the SLA is looked up too."""
        p = self._entry(lead_id)
        p.detail["chosen_id"] = member_id
        p.detail["outcome"] = "assigned"
        if rule_index is not None:
            self._sla(p, team, rule_index)

    def _sla_minutes(self, rule_index: int, team: str) -> int | None:
        key = (rule_index, team)
        try:
            return self._slas[key]
        except KeyError:
            sla = self.cfg.sla_for(rule_index, team)
            minutes = self._slas[key] = sla.minutes if sla else None
            return minutes

    def _sla(self, p: _Pending, team: str, rule_index: int) -> None:
        minutes = p.sla_minutes = self._sla_minutes(rule_index, team)
        if minutes is not None:
            p.detail["sla_minutes"] = minutes

    def unassigned(
        self,
        lead_id: int,
        reason: str,
        team: str | None = None,
        members: Sequence[SeatRow] = (),
        candidates: Sequence[tuple[int, str | None]] = (),
    ) -> None:
        d = self._entry(lead_id).detail
        d.update({"outcome": "unassigned", "reason": reason})
        if team is not None:
            d["team"] = team
            by_id = {m.id: m for m in members}
            ids = [mid for mid, _ in candidates]
            d["seats"] = {
                "ids": ids,
                "weights": [by_id[mid].weight for mid in ids],
                "counts": [by_id[mid].assigned_in_epoch for mid in ids],
                "skips": [r for _, r in candidates],
            }

    def overflowed(
        self,
        lead_id: int,
        team: str,
        members: Sequence[SeatRow],
        candidates: Sequence[tuple[int, str | None]],
    ) -> None:
        """No rep of ``team`` could take the lead; it goes on to the team's overflow team."""
        by_id = {m.id: m for m in members}
        self._entry(lead_id).detail.setdefault("overflow_from", []).append(
            {
                "team": team,
                "candidates": [
                    candidate_entry(by_id[mid], by_id[mid].assigned_in_epoch, r)
                    for mid, r in candidates
                ],
            }
        )

    def group_picked(self, team: str, picks: Sequence[tuple[int, int]]) -> PickedDecisions:
        """How ``shared`` hands these leads' decisions to the server: the leads, given by
        (lead id, rule index), picked from ``team``'s seats, grouped by what their decisions
        will hold (``_shared_key``, with the SLA they get)."""
        parts: list[_Pending] = []
        minutes_of_part: list[int | None] = []
        positions: list[int] = []
        slas: list[int | None] = []
        lead_ids: list[int] = []
        seen: dict[tuple[object, ...], int] = {}
        pending = self._by_lead
        for lead_id, rule_index in picks:
            p = pending.get(lead_id) or _Pending({})  # none yet: an empty one, not kept
            minutes = self._sla_minutes(rule_index, team)
            key = _shared_key(p.detail, minutes)
            n = seen.get(key) if key is not None else None
            if n is None:
                n = len(parts)
                parts.append(p)
                minutes_of_part.append(minutes)
                if key is not None:
                    seen[key] = n
            positions.append(n)
            slas.append(minutes)
            lead_ids.append(lead_id)
        return PickedDecisions(team, lead_ids, parts, minutes_of_part, positions, slas)

    def shared(self, picked: PickedDecisions) -> str:
        """The JSON array of the grouped leads' distinct decisions as the server records them
        (each lead's position in it and its SLA minutes are ``picked``'s): the server writes
        the batch, epoch, pick and seats in columns, so their ``detail`` gets none of them,
        only the team, the outcome and the SLA. Decisions that hold nothing of their own are
        sent once. They stay here until ``forget``."""
        out: list[dict[str, Any]] = []
        for p, minutes in zip(picked.parts, picked.minutes_of_part, strict=True):
            d = {k: v for k, v in p.detail.items() if k != "batch"}
            d["team"] = picked.team
            d["outcome"] = "assigned"
            if minutes is not None:
                d["sla_minutes"] = minutes
            out.append(d)
        return json.dumps(out)

    def forget(self, lead_ids: Iterable[int]) -> None:
        """These leads' decisions were written by the server: not flushed here."""
        pending = self._by_lead
        for lead_id in lead_ids:
            pending.pop(lead_id, None)

    def flush(self, conn: Connection) -> int:
        """Write every decision (one statement); set SLA due times on new assignments."""
        if not self._by_lead:
            return 0
        ids = sorted(self._by_lead)
        conn.execute(
            _SQL["record_decisions"],
            {
                "org": self.cfg.org,
                "kind": self.kind,
                "lead_ids": ids,
                "details": json.dumps([self._by_lead[i].detail for i in ids]),
                "sla_minutes": [self._by_lead[i].sla_minutes for i in ids],
            },
        )
        n = len(ids)
        self._by_lead.clear()
        return n
