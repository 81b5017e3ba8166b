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
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from sqlalchemy import Connection, TextClause, text

import db
from connector.core.config import OrgConfig
from connector.routing.rules import CompiledRule
from connector.routing.rules import _norm as norm

SKIP_REASONS = ("inactive", "capped", "away", "off_shift", "current_owner")
"""Named reasons a candidate rep was passed over (None = eligible); `current_owner` is the
rep a re-route takes the lead from."""

_SQL: dict[str, TextClause] = {k: text(v) for k, v in db.queries("decisions").items()}


class SeatRow(Protocol):
    """What the recorder needs of a member row: its rotation turns at the moment of a pick
    (``assign._StandingViews`` and ``reassign._Member`` provide these)."""

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


def trace_rules(
    rules: Sequence[CompiledRule], fields: Mapping[str, object]
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Each rule tried, in order, up to the first match, with every condition's result.

    Returns (rules, values): the field values a condition looked at are kept apart, so
    retention can remove them from a decision without losing its shape.
    """
    tried: list[dict[str, Any]] = []
    values: dict[str, Any] = {}
    for rule in rules:
        checks = []
        for field, allowed in rule.conditions:
            value = fields.get(field)
            values[field] = value
            ok = value is not None and norm(value) in allowed
            checks.append({"field": field, "allowed": sorted(allowed), "ok": ok})
        matched = all(c["ok"] for c in checks)
        tried.append(
            {
                "index": rule.index,
                "name": rule.name,
                "team": rule.team,
                "matched": matched,
                "checks": checks,
            }
        )
        if matched:
            break
    return tried, values


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


@dataclass
class _Pending:
    detail: dict[str, Any]
    sla_minutes: int | None = None


class DecisionRecorder:
    """Collects one batch's decisions; ``flush`` writes them in the caller's transaction."""

    def __init__(self, cfg: OrgConfig, rules: Sequence[CompiledRule], kind: str = "route") -> None:
        self.cfg = cfg
        self.rules = rules
        self.kind = kind
        self._by_lead: dict[int, _Pending] = {}

    def _entry(self, lead_id: int) -> _Pending:
        return self._by_lead.setdefault(lead_id, _Pending({}))

    def detail(self, lead_id: int) -> dict[str, Any]:
        """The decision recorded so far for one lead (a live reference)."""
        return self._entry(lead_id).detail

    def started(self, lead_id: int, source: str, fields: Mapping[str, object]) -> None:
        """The lead is new and its rules are about to be matched: trace them."""
        tried, values = trace_rules(self.rules, fields)
        d = self._entry(lead_id).detail
        d.update({"source": source, "rules": tried, "values": values})

    def judged_at(self, lead_ids: Sequence[int], at: datetime, batch: int) -> None:
        """The instant availability (caps, hours, time off) was judged at for these leads, and
        their batch (its first lead id): `connector simulate` replays each batch at its instant."""
        stamp = at.isoformat()
        for lead_id in lead_ids:
            self._entry(lead_id).detail.update({"at": stamp, "batch": batch})

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
        considered, in the rotation's order; ``picks`` = the member chosen for each lead."""
        standings = pick_standings(members, candidates, picks)
        for i, (lead_id, (entries, chosen)) in enumerate(zip(lead_ids, standings, strict=True)):
            p = self._entry(lead_id)
            p.detail.update(
                {
                    "team": team,
                    "epoch": epoch,
                    "candidates": entries,
                    "chosen": chosen,
                    "outcome": "assigned",
                }
            )
            if rule_indexes is not None:
                sla = self.cfg.sla_for(rule_indexes[i], team)
                p.sla_minutes = sla.minutes if sla else None
                if sla:
                    p.detail["sla_minutes"] = sla.minutes

    def unassigned(
        self,
        lead_id: int,
        reason: str,
        team: str | None = None,
        members: Sequence[SeatRow] = (),
        candidates: Sequence[tuple[int, str | None]] = (),
    ) -> None:
        by_id = {m.id: m for m in members}
        d = self._entry(lead_id).detail
        d.update({"outcome": "unassigned", "reason": reason})
        if team is not None:
            d["team"] = team
            d["candidates"] = [
                candidate_entry(by_id[mid], by_id[mid].assigned_in_epoch, r)
                for mid, r in candidates
            ]

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
