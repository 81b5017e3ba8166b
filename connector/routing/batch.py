"""A batch's plan: store its leads, match rules and accounts, then one ``route_team`` call a team.

In the caller's transaction: ``insert_leads`` stores the new leads (a repeat reports its
stored outcome), the rules are matched in Python, a lead of a ``route_to: account_owner`` rule
goes to its account's owner when the mirror knows one (``connector.routing.accounts``; no
rotation turn), and every other lead goes to its rule's team: one ``route_team`` call a team,
in overflow order (``overflow_order``), each locking its team, picking on the server and
recording (``connector.routing.calls`` says what is computed here first). Leads a team cannot
place go on to its overflow team, else stay unassigned with the reason. When the batch may go
to more than one team, or records account owners' leads, every team it may go to is locked
first, in name order (``lock_teams``), so two batches never deadlock; account owners' leads
are recorded right after those locks. The batch's instant is read once, before the locks.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import NamedTuple

from sqlalchemy import Connection, TextClause, text

import db
from connector.core.config import OrgConfig
from connector.routing import accounts
from connector.routing.calls import TeamInputs, team_params
from connector.routing.decisions import DecisionRecorder, Standing
from connector.routing.leads import Lead, Outcome, RoutingError, assigned_outcome
from connector.routing.rules import Match, RuleSet, Unparsed, match

_SQL: dict[str, TextClause] = {k: text(v) for k, v in db.queries("routing").items()}

Item = tuple[int, str, Match]  # (lead id, stored CRM id, its rule match)


class Owner(NamedTuple):
    """A picked member as its outcome names it."""

    crm_user_id: str
    name: str


# a lead a team could not place: (its item, its candidates, the seats' standings, the reps
# away by command)
Left = tuple[Item, tuple[tuple[int, str | None], ...], list[Standing], list[str]]


@dataclass
class Batch:
    """One batch's working state in its transaction: outcomes and decisions."""

    conn: Connection
    cfg: OrgConfig
    source: str
    recorder: DecisionRecorder
    parents: dict[str, str | None] = field(default_factory=dict)  # stored CRM id -> parent
    results: dict[str, Outcome] = field(default_factory=dict)
    # a rotation's picks (stored CRM id -> team, owner, candidates): their outcomes are built
    # once they are asked for (after the commit, without the teams' locks)
    picked: dict[str, tuple[str, Owner, tuple[tuple[int, str | None], ...]]] = field(
        default_factory=dict
    )
    first: int | None = None  # the batch: its first new lead's id (decisions record it)
    no_rule: list[int] = field(default_factory=list)
    by_team: dict[str, list[Item]] = field(default_factory=lambda: defaultdict(list))

    def in_input_order(self, keys: Sequence[str]) -> list[Outcome]:
        """One outcome per input lead; a repeat inside the batch (perhaps by its other id
        form) is a duplicate of the first."""
        out: list[Outcome] = []
        seen: set[str] = set()
        for key in keys:
            o = self.results.get(key)
            if o is None:
                team, owner, candidates = self.picked[key]
                o = assigned_outcome(key, team, owner.crm_user_id, owner.name, candidates)
            if key in seen:
                o = Outcome(o.crm_id, "duplicate", o.team, o.owner_id, o.owner_name, o.reason)
            seen.add(key)
            out.append(o)
        return out


def overflow_order(cfg: OrgConfig, teams: set[str]) -> list[str]:
    """``teams`` so that every team comes before the team it overflows into (then by name)."""
    depth = dict.fromkeys(teams, 0)
    for name in teams:
        for i, t in enumerate(cfg.overflow_chain(name)):
            if t in depth:
                depth[t] = max(depth[t], i)
    return sorted(teams, key=lambda t: (depth[t], t))


def insert(batch: Batch, first: Mapping[str, Lead]) -> dict[str, int]:
    """Insert the new leads (stored CRM id -> lead id); a repeat gets its stored outcome."""
    cfg = batch.cfg
    unique = list(first.items())
    rows = batch.conn.execute(
        _SQL["insert_leads"],
        {
            "org": cfg.org,
            "crm_object": cfg.crm_object,
            "source": batch.source,
            "crm_ids": [cid for cid, _ in unique],
            "fields": json.dumps([x.fields for _, x in unique]),
            "parent_ids": [batch.parents[cid] for cid, _ in unique],
        },
    ).all()
    new_ids = {cid: lead_id for lead_id, cid in rows}  # insert_leads' columns, in order
    old = [cid for cid in first if cid not in new_ids]
    if old:
        for r in batch.conn.execute(
            _SQL["existing_leads"],
            {"org": cfg.org, "crm_object": cfg.crm_object, "crm_ids": old},
        ):
            batch.results[r.crm_id] = Outcome(
                r.crm_id,
                "duplicate",
                r.team,
                r.crm_user_id,
                r.owner_name,
                None if r.crm_user_id else r.unassigned_reason,
            )
    return new_ids


def match_rules(
    batch: Batch,
    rules: RuleSet,
    first: Mapping[str, Lead],
    new_ids: Mapping[str, int],
    now: datetime,
    unparsed: Unparsed | None = None,
) -> list[Item]:
    """The new leads' rule matches at the batch's instant, in input order (the earliest lead
    gets the next rep); a lead no rule matches is unassigned."""
    picked: list[Item] = []
    for cid, lead in first.items():
        if cid not in new_ids:
            continue
        lead_id = new_ids[cid]
        batch.recorder.started(lead_id, batch.source, lead.fields, now)
        m = match(rules, lead.fields, now, unparsed)
        if m is None:
            batch.recorder.unassigned(lead_id, "no_rule_matched")
            batch.no_rule.append(lead_id)
            batch.results[cid] = Outcome(cid, "unassigned", reason="no_rule_matched")
        else:
            picked.append((lead_id, cid, m))
    return picked


def match_accounts(
    batch: Batch, picked: Sequence[Item], first: Mapping[str, Lead]
) -> tuple[dict[str, list[accounts.Matched]], dict[int, accounts.AccountDecision]]:
    """Leads of ``route_to: account_owner`` rules that go to their account's owner, by the
    team of the owner's seat (their outcomes and decisions set), and the decisions of those
    that fall back to their rule's team rotation, by lead id."""
    cfg = batch.cfg
    candidates = [
        accounts.Candidate(
            lead_id, cid, first[cid].fields, batch.parents[cid], m.team, m.rule_index, m.rule_name
        )
        for lead_id, cid, m in picked
        if cfg.rules[m.rule_index].route_to == "account_owner"
    ]
    found, fallbacks = accounts.match_accounts(batch.conn, cfg, candidates)
    matched: dict[str, list[accounts.Matched]] = defaultdict(list)
    for hit in found:
        c, seat = hit.candidate, hit.seat
        matched[seat.team].append(hit)
        batch.results[c.crm_id] = Outcome(
            c.crm_id,
            "assigned",
            seat.team,
            seat.crm_user_id,
            seat.name,
            account_id=hit.decision.account_id,
        )
        batch.recorder.account(c.lead_id, hit.decision.as_json())
        batch.recorder.detail(c.lead_id).update(
            {
                "team": seat.team,
                "epoch": seat.epoch,
                "outcome": "assigned",
                "chosen": {
                    "member_id": seat.member_id,
                    "crm_user_id": seat.crm_user_id,
                    "name": seat.name,
                    "by": "account_owner",
                },
            }
        )
    for lead_id, decision in fallbacks.items():
        batch.recorder.account(lead_id, decision.as_json())
    return dict(matched), fallbacks


def lock_teams(
    batch: Batch, needed: set[str], matched: Mapping[str, Sequence[accounts.Matched]]
) -> None:
    """Lock every team the batch may go to, in name order, and record the account owners'
    leads under those locks. A team that only receives such leads is not locked (its
    rotation does not move; the assignment's foreign key check takes FOR KEY SHARE on it),
    unless it has catch-up: its picks read its latest owners by assignment id, account
    owners' leads included, so they are recorded under its lock, in its order."""
    cfg = batch.cfg
    names = needed | {t for t in matched if cfg.team(t).max_in_a_row is not None}
    rows = batch.conn.execute(_SQL["lock_teams"], {"org": cfg.org, "names": sorted(names)}).all()
    missing = sorted(names - {r.name for r in rows})
    if missing:
        raise RoutingError(
            f"team {missing[0]!r} of org {cfg.org!r} is not in the database: "
            "run `connector migrate` with this config"
        )
    for team_name in sorted(matched):
        accounts.record_matched(batch.conn, cfg, batch.source, matched[team_name])


def route_team(batch: Batch, inputs: TeamInputs, group: list[Item], now: datetime) -> list[Left]:
    """One ``route_team`` call: the team's leads picked and recorded on the server. Returns
    the leads nobody could take when the team has an overflow team (nothing was written for
    them), with their candidates, the seats' standings and the reps away by command; without
    one they were recorded unassigned. Their outcomes, and the picked leads', are set in
    ``batch``."""
    recorder = batch.recorder
    decisions = recorder.group_picked(
        inputs.name, [(lead_id, m.rule_index) for lead_id, _, m in group]
    )
    final = inputs.overflow_team is None
    cfg = batch.cfg
    row = batch.conn.execute(
        _SQL["route_team"],
        {
            **team_params(inputs, now),
            "org": cfg.org,
            "crm_object": cfg.crm_object,
            "source": batch.source,
            "batch": batch.first,
            "lead_ids": decisions.lead_ids,
            "crm_ids": [cid for _, cid, _ in group],
            "parent_ids": [batch.parents.get(cid) for _, cid, _ in group],
            "rule_indexes": [m.rule_index for _, _, m in group],
            "rule_names": [m.rule_name for _, _, m in group],
            "sla_minutes": decisions.slas,
            "details": recorder.shared(decisions),
            "detail_of": decisions.positions,
            "final": final,
        },
    ).one()
    if row.status == "no_team":
        raise RoutingError(
            f"team {inputs.name!r} of org {cfg.org!r} is not in the database: "
            "run `connector migrate` with this config"
        )
    ids: list[int] = row.seat_ids
    k = len(ids)
    owners = {
        mid: Owner(user, name)
        for mid, user, name in zip(ids, row.seat_users, row.seat_names, strict=True)
    }
    skips: list[str | None] = row.seat_skips
    left: list[Left] = []
    written: list[int] = []
    last: list[str | None] | None = None
    candidates: tuple[tuple[int, str | None], ...] = ()
    for i, (item, member_id) in enumerate(zip(group, row.member_ids, strict=True)):
        lead_id, cid, _ = item
        these = skips[i * k : (i + 1) * k]
        if these != last:  # a batch's leads mostly share one set of candidates
            candidates = tuple(zip(ids, these, strict=True))
            last = these
        if member_id is not None:
            batch.picked[cid] = (inputs.name, owners[member_id], candidates)
            written.append(lead_id)
        elif final:
            batch.results[cid] = Outcome(
                cid, "unassigned", inputs.name, reason=row.reason, candidates=candidates
            )
            written.append(lead_id)
        else:
            counts = row.seat_counts[i * k : (i + 1) * k]
            standings = [
                Standing(mid, owners[mid].crm_user_id, owners[mid].name, w, c)
                for mid, w, c in zip(ids, row.seat_weights, counts, strict=True)
            ]
            left.append((item, candidates, standings, row.away_by_command))
    recorder.forget(written)
    return left


def route(
    batch: Batch,
    teams: Mapping[str, TeamInputs],
    matched: Mapping[str, Sequence[accounts.Matched]],
    now: datetime,
) -> None:
    """Route every team's leads, in overflow order; leads a team cannot place go on to its
    overflow team."""
    needed = {t for name in batch.by_team for t in batch.cfg.overflow_chain(name)}
    if len(needed) > 1 or matched:
        lock_teams(batch, needed, matched)
    for team_name in overflow_order(batch.cfg, needed):
        group = batch.by_team.get(team_name)
        if not group:
            continue
        inputs = teams[team_name]
        for item, candidates, standings, away in route_team(batch, inputs, group, now):
            batch.recorder.away_by_command(item[0], away)
            batch.recorder.overflowed(item[0], team_name, standings, candidates)
            batch.by_team[inputs.overflow_team or ""].append(item)  # route_team: it has one
