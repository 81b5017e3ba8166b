"""Account-owner routing inside the assignment transaction (the I/O around domains.py).

``match_accounts`` takes the new leads whose rule says ``route_to: account_owner``, reads in
one statement (``match_lookup``) the accounts they could belong to (by parent id and by
domain) and the org's reps, and lets ``domains.decide`` judge each lead. Matched leads are
recorded by ``record_matched``: assignment + outbox row, no rotation count. Their team row is
not locked FOR UPDATE (the rotation does not move), unless the team has catch-up, whose picks
read its latest owners (these included) by assignment id: then they are recorded under the
lock, so their ids follow its order. The assignment's foreign key check takes FOR KEY SHARE
on the team row, which conflicts with that lock; so the router records them in the same
name-ordered pass as its team locks, never before (tests/test_account_locks.py shows the
deadlock that ordering avoids, and the ids a catch-up team would get out of order). The
other leads go on to their rule's team rotation, and ``note_fallbacks`` stores why on their
assignments.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, TextClause, text

import db
from connector.core.config import OrgConfig
from connector.core.ownership import owner_key
from connector.routing.domains import AccountDecision, AccountRow, Rep, decide, lead_domains

__all__ = [
    "AccountDecision",
    "Candidate",
    "Matched",
    "Seat",
    "decide_owner",
    "match_accounts",
    "note_fallbacks",
    "owner_seats",
    "record_matched",
    "seat_for",
]

_SQL: dict[str, TextClause] = {k: text(v) for k, v in db.queries("accounts").items()}


@dataclass(frozen=True)
class Candidate:
    """A new lead under an account_owner rule."""

    lead_id: int
    crm_id: str
    fields: Mapping[str, Any]
    parent_id: str | None
    team: str
    rule_index: int
    rule_name: str


@dataclass(frozen=True)
class Seat:
    """One member row of the org's teams (a rep may sit in several teams)."""

    member_id: int
    crm_user_id: str
    name: str
    active: bool
    team_id: int
    team: str
    epoch: int


@dataclass(frozen=True)
class Matched:
    candidate: Candidate
    seat: Seat
    decision: AccountDecision


def seat_for(seats: Sequence[Seat], team: str) -> Seat | None:
    """The member row a matched lead is recorded under: the owner's active seat in the rule's
    team if there is one, else their first active seat by team name (pure)."""
    active = [s for s in seats if s.active]
    for s in active:
        if s.team == team:
            return s
    return active[0] if active else None


def owner_seats(
    kind: str, found: Iterable[tuple[int, Seat]]
) -> tuple[dict[str, list[Seat]], dict[str, Rep]]:
    """(owner key -> its member rows by team name then position, owner key -> its standing)
    from (position, seat) pairs; pure, shared with `connector simulate`."""
    seats: dict[str, list[Seat]] = defaultdict(list)
    for _, s in sorted(found, key=lambda x: (x[1].team, x[0])):
        seats[owner_key(kind, s.crm_user_id)].append(s)
    reps = {key: Rep(any(s.active for s in rows)) for key, rows in seats.items()}
    return dict(seats), reps


def decide_owner(
    parent_id: str | None,
    domains: Sequence[tuple[str, str]],
    by_id: Mapping[str, AccountRow],
    by_domain: Mapping[str, Sequence[AccountRow]],
    seats: Mapping[str, Sequence[Seat]],
    reps: Mapping[str, Rep],
    team: str,
) -> tuple[AccountDecision, Seat | None]:
    """One lead's account decision and the seat it is recorded under (None: it goes on to
    its rule's team rotation); pure, shared with `connector simulate`."""
    decision = decide(parent_id, domains, by_id, by_domain, reps)
    chosen = None
    if decision.matched and decision.owner_id is not None:
        chosen = seat_for(seats.get(decision.owner_id, []), team)
    return decision, chosen


def match_accounts(
    conn: Connection, cfg: OrgConfig, candidates: Sequence[Candidate]
) -> tuple[list[Matched], dict[int, AccountDecision]]:
    """(leads matched to an eligible account owner, decisions of the others by lead id)."""
    if not candidates:
        return [], {}
    kind = cfg.crm.kind
    match_fields = cfg.match_fields
    domains = {c.lead_id: lead_domains(c.fields, match_fields) for c in candidates}
    # parent ids are stored in the comparable form already (Salesforce: 18 characters)
    parents = {c.lead_id: owner_key(kind, c.parent_id) if c.parent_id else None for c in candidates}
    by_id: dict[str, AccountRow] = {}
    by_domain: dict[str, list[AccountRow]] = defaultdict(list)
    found_seats: list[tuple[int, Seat]] = []
    params = {
        "org": cfg.org,
        "crm_ids": sorted({p for p in parents.values() if p}),
        "domains": sorted({d for ds in domains.values() for _, d in ds}),
    }
    for r in conn.execute(_SQL["match_lookup"], params):
        if r.kind == "rep":
            seat = Seat(r.member_id, r.crm_user_id, r.name, r.active, r.team_id, r.team, r.epoch)
            found_seats.append((r.position, seat))
        elif r.kind == "account":
            by_id[r.crm_id] = AccountRow(r.crm_id, r.owner_id, r.modified_at)
        else:
            by_domain[r.domain].append(AccountRow(r.crm_id, r.owner_id, r.modified_at))
    seats, reps = owner_seats(kind, found_seats)
    matched: list[Matched] = []
    others: dict[int, AccountDecision] = {}
    for c in candidates:
        decision, chosen = decide_owner(
            parents[c.lead_id], domains[c.lead_id], by_id, by_domain, seats, reps, c.team
        )
        if chosen is None:
            others[c.lead_id] = decision
        else:
            matched.append(Matched(c, chosen, decision))
    return matched, others


def record_matched(conn: Connection, cfg: OrgConfig, source: str, rows: Sequence[Matched]) -> None:
    """Assign matched leads to their account's owner (no rotation count, no team lock), by
    team (each team's rows share its id and epoch)."""
    by_team: dict[int, list[Matched]] = defaultdict(list)
    for m in rows:
        by_team[m.seat.team_id].append(m)
    for team_id, group in by_team.items():
        conn.execute(
            _SQL["record_matched"],
            {
                "org": cfg.org,
                "crm_object": cfg.crm_object,
                "source": source,
                "team_id": team_id,
                "epoch": group[0].seat.epoch,
                "lead_ids": [m.candidate.lead_id for m in group],
                "member_ids": [m.seat.member_id for m in group],
                "owner_ids": [m.seat.crm_user_id for m in group],
                "crm_ids": [m.candidate.crm_id for m in group],
                "parent_ids": [m.candidate.parent_id for m in group],
                "rule_indexes": [m.candidate.rule_index for m in group],
                "rule_names": [m.candidate.rule_name for m in group],
                "decisions": json.dumps([m.decision.as_json() for m in group]),
            },
        )


def note_fallbacks(conn: Connection, decisions: Mapping[int, AccountDecision]) -> None:
    """Store why leads under an account_owner rule went to the rotation (on the assignments
    recorded in this transaction; a lead left unassigned has none)."""
    if not decisions:
        return
    ids = sorted(decisions)
    conn.execute(
        _SQL["note_fallbacks"],
        {"lead_ids": ids, "decisions": [json.dumps(decisions[i].as_json()) for i in ids]},
    )
