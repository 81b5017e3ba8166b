"""What-if replay: the stored leads of a window, routed again through a proposed config.

``connector simulate --org ORG --config NEW.yaml --since 30d`` reads the org's leads received in
the window (their fields are the CRM's, as read back when they arrived), what happened to them
and the routing decision recorded for each, then routes them again in memory with the new
rules, teams, weights, caps, working hours, time off, overflow teams, catch-up and account
matching. Nothing is written: the reads run in one READ ONLY transaction and the replay is a
pure function that calls the live router's own pure functions (``rules.match``,
``accounts.decide_owner``, ``availability.eligibility``/``room``/``unplaced_reason``,
``rotation.pick_available``, ``assign.overflow_order``).

Order, instants and starting state are what make a replay with the config that actually ran
give back exactly the recorded owners and unassigned reasons:

- The router records, in each lead's decision, the instant it judged availability at (``at``)
  and its batch (the batch's first lead id). The replay routes batch by batch, in the order of
  their decision ids (two batches that share a team hold its lock in turn and record their
  decisions under it, so their ids come in lock order), each batch at its recorded instant.
  Inside a batch, leads go in the order of their assignment ids, which follow the picks of each
  team; the leads nobody took come after them, as they do in the router. Leads whose decision
  has no ``at`` (routed before it was recorded) are replayed one by one at their arrival, in
  arrival order with each team's assigned leads in assignment id order.
- A team whose rotation (members in order, weights, active flags) is unchanged continues from
  the turns (leads + credited turns) its members had at the team's first decision of the
  window, as recorded in that decision (else from the leads counted in the epoch before the
  window). A team whose rotation changed starts from zero, as applying the new config would
  start a new epoch. A team whose epoch changed inside the window is reported.
- Caps count, per rep and per day and week in the team's zone, the replay's own picks plus the
  leads the rotation gave the rep before the window (``loads_before``), judged at each batch's
  instant. Working hours and the config's time off are the proposed config's, judged at that
  instant. Catch-up starts from the team's latest owners before the window.
- Time off set with `connector rep away` lives in a table that keeps only each rep's latest
  absence, so it cannot tell who was away last week. The router records the reps it found away
  by the command in each decision (``away_by_command``); the replay keeps exactly those away
  for that lead, in every team, and adds the proposed config's ``time_off`` and ``hours``.
  Decisions older than that record only skip reasons: for them a rep recorded as skipped
  ``away`` stays away for that lead (then a ``time_off`` removed from the config cannot bring
  the rep back for those leads).
- Leads of ``route_to: account_owner`` rules are matched against the account mirror as it is
  NOW (crm_accounts, read in the same transaction), not as it was when they arrived.

The fairness guarantee of the replay is the rotation's own (``connector.routing.rotation``).
"""

from __future__ import annotations

import json
import sys
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, text

import db
from connector.core.charts import Bar, bar_chart, standalone
from connector.core.config import OrgConfig, Team
from connector.core.ownership import owner_key
from connector.routing import accounts
from connector.routing.availability import (
    Candidate,
    Window,
    config_windows,
    eligibility,
    periods,
    room,
    unplaced_reason,
)
from connector.routing.batch import overflow_order
from connector.routing.decisions import expand, member_ids
from connector.routing.domains import AccountRow, lead_domains
from connector.routing.rotation import Seat, pick_available
from connector.routing.rules import match, org_rules
from connector.routing.teams import rotation_fingerprint

_SQL = db.queries("simulate")
# How far back the caps' weekly counts can reach from the window's start.
LOAD_DAYS = 8


@dataclass(frozen=True)
class HistoryLead:
    """One stored lead and what the connector did with it."""

    lead_id: int
    crm_id: str
    fields: Mapping[str, Any]
    received_at: datetime
    # the team that decided (its rep's team when assigned) and the rep; ``reason`` why not
    team: str | None = None
    owner: str | None = None
    reason: str | None = None
    assignment_id: int | None = None
    epoch: int | None = None
    # reassigned since it was routed: ``team``/``owner`` are routing's pick, ``current_team``
    # the team of its owner now
    reassigned: bool = False
    current_team: str | None = None
    parent_id: str | None = None
    # from the recorded decision: the instant availability was judged at (None: not recorded),
    # the batch (its first lead id), the decision's id, the reps away by `rep away` (or, for
    # older decisions, skipped as away), the teams it overflowed from, given to its account's
    # owner
    at: datetime | None = None
    batch: int | None = None
    decision_id: int | None = None
    away: frozenset[str] = frozenset()
    overflowed: tuple[str, ...] = ()
    by_account: bool = False

    @property
    def judged_at(self) -> datetime:
        return self.at or self.received_at


@dataclass(frozen=True)
class TeamRotation:
    """A team's rotation as the database has it now."""

    epoch: int
    fingerprint: str


@dataclass(frozen=True)
class Mirror:
    """The account mirror as it is now: accounts by id and by domain."""

    by_id: dict[str, AccountRow] = field(default_factory=dict)
    by_domain: dict[str, list[AccountRow]] = field(default_factory=dict)


LoadKey = tuple[str, str, str, date]  # team, crm_user_id, "day" | "week", first day


@dataclass(frozen=True)
class History:
    leads: list[HistoryLead]
    rotations: dict[str, TeamRotation]
    # team -> epoch -> crm_user_id -> leads received before the window
    counts_before: dict[str, dict[int, dict[str, int]]]
    # crm_user_id -> the name the database knows (reps no longer in the config)
    names: dict[str, str] = field(default_factory=dict)
    # team -> crm_user_id -> turns at the team's first recorded decision of the window
    turns_start: dict[str, dict[str, int]] = field(default_factory=dict)
    # the caps' counts before the window (see the loads_before query)
    loads_before: dict[LoadKey, int] = field(default_factory=dict)
    # team -> its latest owners before the window, newest first (catch-up teams only)
    recent_before: dict[str, list[str]] = field(default_factory=dict)
    accounts: Mirror = field(default_factory=Mirror)


@dataclass(frozen=True)
class Replayed:
    lead: HistoryLead
    team: str | None
    owner: str | None
    reason: str | None
    overflowed: tuple[str, ...] = ()
    by_account: bool = False


@dataclass
class Simulation:
    outcomes: list[Replayed]
    # team -> "continued" (same rotation, counts carried over) | "restarted" (changed rotation)
    rotations: dict[str, str] = field(default_factory=dict)
    # teams whose epoch changed inside the window: their recorded order cannot be reproduced
    restarted_in_window: list[str] = field(default_factory=list)
    # teams that gave or got a reassigned lead of the window: reassignments move rotation counts
    # that the replay (routing only) does not repeat
    reassigned_in_window: list[str] = field(default_factory=list)
    # leads whose decision did not record the instant it was judged at: judged at arrival
    judged_at_arrival: int = 0


def replay_order(leads: Sequence[HistoryLead]) -> list[HistoryLead]:
    """Arrival order, with each team's assigned leads in the order its lock handed them out."""
    ordered = sorted(leads, key=lambda x: (x.received_at, x.lead_id))
    slots: dict[str, list[int]] = defaultdict(list)
    for i, lead in enumerate(ordered):
        if lead.assignment_id is not None and lead.team is not None:
            slots[lead.team].append(i)
    out = list(ordered)
    for positions in slots.values():
        by_lock = sorted((ordered[i] for i in positions), key=lambda x: x.assignment_id or 0)
        for i, lead in zip(positions, by_lock, strict=True):
            out[i] = lead
    return out


def _in_batch(x: HistoryLead) -> tuple[int, int]:
    """A batch's leads in the order its teams picked them (assignment ids follow the picks;
    a lead passed on to an overflow team gets its id there, after that team's own picks)."""
    return (x.assignment_id if x.assignment_id is not None else sys.maxsize, x.lead_id)


def replay_batches(leads: Sequence[HistoryLead]) -> list[list[HistoryLead]]:
    """The units the replay routes, in order: leads without a recorded batch one by one (see
    ``replay_order``), then the recorded batches in the order of their decision ids."""
    units = [[x] for x in replay_order([x for x in leads if x.batch is None])]
    grouped: dict[int, list[HistoryLead]] = defaultdict(list)
    for x in leads:
        if x.batch is not None:
            grouped[x.batch].append(x)
    batches = sorted(grouped.values(), key=lambda b: min(x.decision_id or 0 for x in b))
    return units + [sorted(b, key=_in_batch) for b in batches]


def _start_epochs(history: History) -> dict[str, tuple[int, bool]]:
    """Per team: the epoch it was in when the window began, and whether it changed inside."""
    seen: dict[str, set[int]] = defaultdict(set)
    for lead in history.leads:
        if lead.team is not None and lead.epoch is not None:
            seen[lead.team].add(lead.epoch)
    out: dict[str, tuple[int, bool]] = {}
    for team, rot in history.rotations.items():
        epochs = seen.get(team, set())
        first = min(epochs) if epochs else rot.epoch
        out[team] = (first, bool(epochs) and (len(epochs) > 1 or first != rot.epoch))
    return out


@dataclass
class _TeamState:
    """One team's rotation while replaying: turns per member (config order) and the latest
    owners, newest first (member indexes; -1 for an owner no longer in the team)."""

    team: Team
    turns: list[int]
    recent: list[int]

    def push(self, index: int) -> None:
        k = self.team.max_in_a_row or 0
        self.recent.insert(0, index)
        del self.recent[k:]


class _Replay:
    """The replay's state across batches; ``run`` routes one batch like ``Router.assign_in``."""

    def __init__(self, cfg: OrgConfig, history: History) -> None:
        self.cfg = cfg
        self.history = history
        self.rules = org_rules(cfg)
        self.result = Simulation(outcomes=[])
        self.loads: Counter[LoadKey] = Counter(history.loads_before)
        self.epochs = _start_epochs(history)
        self.states = {t.name: self._start(t) for t in cfg.teams}
        self.index = {
            t.name: {m.crm_user_id: i for i, m in enumerate(t.members)} for t in cfg.teams
        }
        found = [
            (i, accounts.Seat(i, m.crm_user_id, m.name, m.active, 0, t.name, 0))
            for t in cfg.teams
            for i, m in enumerate(t.members)
        ]
        self.seats, self.reps = accounts.owner_seats(cfg.crm.kind, found)
        self.windows = {
            (t.name, i): config_windows(t, m) for t in cfg.teams for i, m in enumerate(t.members)
        }

    def _start(self, team: Team) -> _TeamState:
        h = self.history
        recent = [
            next((i for i, m in enumerate(team.members) if m.crm_user_id == uid), -1)
            for uid in h.recent_before.get(team.name, [])[: team.max_in_a_row or 0]
        ]
        rot = h.rotations.get(team.name)
        if rot is None or rot.fingerprint != rotation_fingerprint(team):
            self.result.rotations[team.name] = "restarted"
            return _TeamState(team, [0] * len(team.members), recent)
        self.result.rotations[team.name] = "continued"
        epoch, changed = self.epochs[team.name]
        if changed:
            self.result.restarted_in_window.append(team.name)
        start = h.turns_start.get(team.name)
        if start is None:
            start = h.counts_before.get(team.name, {}).get(epoch, {})
        return _TeamState(team, [start.get(m.crm_user_id, 0) for m in team.members], recent)

    def run(self, batch: Sequence[HistoryLead]) -> None:
        at = batch[0].judged_at
        away = frozenset().union(*(x.away for x in batch))
        groups: dict[str, list[HistoryLead]] = defaultdict(list)
        for lead in batch:
            m = match(self.rules, lead.fields, at)
            if m is None:
                self.result.outcomes.append(Replayed(lead, None, None, "no_rule_matched"))
            elif not (
                self.cfg.rules[m.rule_index].route_to == "account_owner"
                and self._by_account(lead, m.team)
            ):
                groups[m.team].append(lead)
        hops: dict[int, list[str]] = defaultdict(list)
        needed = {t for name in groups for t in self.cfg.overflow_chain(name)}
        for name in overflow_order(self.cfg, needed):
            if groups.get(name):
                self._route_team(name, groups, hops, at, away)

    def _by_account(self, lead: HistoryLead, team: str) -> bool:
        """Give the lead to its account's owner (the mirror as it is now) if there is one."""
        kind = self.cfg.crm.kind
        parent = owner_key(kind, lead.parent_id) if lead.parent_id else None
        mirror = self.history.accounts
        domains = lead_domains(lead.fields, self.cfg.match_fields)
        _, seat = accounts.decide_owner(
            parent, domains, mirror.by_id, mirror.by_domain, self.seats, self.reps, team
        )
        if seat is None:
            return False
        self.states[seat.team].push(seat.member_id)  # an assignment of that team: catch-up sees it
        self.result.outcomes.append(
            Replayed(lead, seat.team, seat.crm_user_id, None, by_account=True)
        )
        return True

    def _candidates(self, team: Team, at: datetime, away: frozenset[str]) -> list[Candidate]:
        p = periods(at, team.timezone)
        out = []
        for i, m in enumerate(team.members):
            caps = team.caps_of(m)
            windows = self.windows[(team.name, i)]
            if m.crm_user_id in away:  # away by `connector rep away` when this batch was judged
                windows += (Window(at, at + timedelta(microseconds=1)),)
            out.append(
                Candidate(
                    member_id=i,
                    active=m.active,
                    hours=m.hours,
                    away=windows,
                    per_day=caps.per_day,
                    per_week=caps.per_week,
                    day_count=self.loads[(team.name, m.crm_user_id, "day", p.day)],
                    week_count=self.loads[(team.name, m.crm_user_id, "week", p.week)],
                )
            )
        return out

    def _route_team(
        self,
        name: str,
        groups: dict[str, list[HistoryLead]],
        hops: dict[int, list[str]],
        at: datetime,
        away: frozenset[str],
    ) -> None:
        """The router's ``_pick`` and ``_route_team`` for one team of one batch."""
        st = self.states[name]
        team, group = st.team, groups[name]
        candidates = self._candidates(team, at, away)
        now_reasons = eligibility(candidates, at)
        picks = pick_available(
            [Seat(i, m.weight, st.turns[i], i) for i, m in enumerate(team.members) if m.active],
            {i: r for i, r in now_reasons.items() if r in ("away", "off_shift")},
            {c.member_id: room(c) for c in candidates},
            len(group),
            max_in_a_row=team.max_in_a_row,
            recent=st.recent,
        )
        for i, n in picks.credited.items():
            st.turns[i] += n
        p = periods(at, team.timezone)
        left = []
        for lead, turn in zip(group, picks.turns, strict=True):
            if turn.member_id is None:
                left.append((lead, turn))
                continue
            i = turn.member_id
            uid = team.members[i].crm_user_id
            st.turns[i] += 1
            self.loads[(name, uid, "day", p.day)] += 1
            self.loads[(name, uid, "week", p.week)] += 1
            st.push(i)
            self._done(lead, name, uid, None, hops)
        if not left:
            return
        inactive = tuple((i, "inactive") for i, m in enumerate(team.members) if not m.active)
        reason = unplaced_reason(dict(left[0][1].candidates + inactive))
        for lead, _ in left:
            if team.overflow_team is not None:
                hops[lead.lead_id].append(name)
                groups[team.overflow_team].append(lead)
            else:
                self._done(lead, name, None, reason, hops)

    def _done(
        self,
        lead: HistoryLead,
        team: str,
        owner: str | None,
        reason: str | None,
        hops: Mapping[int, list[str]],
    ) -> None:
        self.result.outcomes.append(
            Replayed(lead, team, owner, reason, tuple(hops.get(lead.lead_id, ())))
        )


def simulate(cfg: OrgConfig, history: History) -> Simulation:
    """Route ``history``'s leads again with ``cfg``; pure (no I/O)."""
    replay = _Replay(cfg, history)
    replay.result.reassigned_in_window = sorted(
        {t for x in history.leads if x.reassigned for t in (x.team, x.current_team) if t}
    )
    replay.result.judged_at_arrival = sum(1 for x in history.leads if x.at is None)
    for batch in replay_batches(history.leads):
        replay.run(batch)
    return replay.result


# --- reading the window (one READ ONLY transaction) ----------------------------------------


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


def _share(n: int, total: int) -> float:
    return round(n / total, 4) if total else 0.0


@dataclass
class _Tally:
    """Before (recorded) and after (proposed) counts for the report."""

    teams: Counter[tuple[str, str]] = field(default_factory=Counter)
    reps: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    why: Counter[tuple[str, str]] = field(default_factory=Counter)
    extra: Counter[tuple[str, str]] = field(default_factory=Counter)

    def add(
        self,
        side: str,
        team: str | None,
        owner: str | None,
        reason: str | None,
        overflowed: bool,
        by_account: bool,
    ) -> None:
        if owner is not None and team is not None:
            self.teams[(side, team)] += 1
            self.reps[(side, team, owner)] += 1
        else:
            self.why[(side, reason or "unassigned")] += 1
        self.extra[(side, "overflowed")] += overflowed
        self.extra[(side, "account_matched")] += by_account and owner is not None

    def by(self, side: str) -> dict[str, int]:
        return dict(sorted((k, n) for (s, k), n in self.why.items() if s == side and n))

    def pair(self, key: str) -> dict[str, int]:
        return {"before": self.extra[("before", key)], "after": self.extra[("after", key)]}


def report(new: OrgConfig, history: History, sim: Simulation, since: datetime) -> dict[str, Any]:
    """The JSON shape of `connector simulate --json` (documented in the README)."""
    names = dict(history.names)
    names.update({m.crm_user_id: m.name for t in new.teams for m in t.members})
    total = len(sim.outcomes)
    tally = _Tally()
    changed_team = changed_rep = 0
    unassigned: list[dict[str, str | None]] = []
    for o in sim.outcomes:
        lead = o.lead
        tally.add(
            "before", lead.team, lead.owner, lead.reason, bool(lead.overflowed), lead.by_account
        )
        tally.add("after", o.team, o.owner, o.reason, bool(o.overflowed), o.by_account)
        if o.owner is None:
            unassigned.append(
                {"crm_id": lead.crm_id, "reason": o.reason or "unassigned", "team": o.team}
            )
        old_team = lead.team if lead.owner is not None else None
        changed_team += old_team != (o.team if o.owner is not None else None)
        changed_rep += lead.owner != o.owner
    teams = sorted({t for _, t in tally.teams} | {t.name for t in new.teams})
    reps = sorted({(t, uid) for _, t, uid in tally.reps})
    return {
        "org": new.org,
        "since": since.isoformat(),
        "leads": total,
        "changed_team": changed_team,
        "changed_team_share": _share(changed_team, total),
        "changed_rep": changed_rep,
        "changed_rep_share": _share(changed_rep, total),
        "teams": [
            {"name": t, "before": tally.teams[("before", t)], "after": tally.teams[("after", t)]}
            for t in teams
        ],
        "reps": [
            {
                "team": t,
                "crm_user_id": uid,
                "name": names.get(uid, uid),
                "before": tally.reps[("before", t, uid)],
                "after": tally.reps[("after", t, uid)],
            }
            for t, uid in reps
        ],
        "unassigned": {
            "before": tally.by("before"),
            "after": tally.by("after"),
            "leads": unassigned,
        },
        "overflowed": tally.pair("overflowed"),
        "account_matched": tally.pair("account_matched"),
        "judged_at_arrival": sim.judged_at_arrival,
        "rotations": dict(sorted(sim.rotations.items())),
        "restarted_in_window": sorted(sim.restarted_in_window),
        "reassigned_in_window": sim.reassigned_in_window,
    }


def format_report(rep: Mapping[str, Any], max_leads: int = 20) -> str:
    """The human-readable table printed by `connector simulate`."""
    lines = [
        f"org {rep['org']}: {rep['leads']} leads since {rep['since']}",
        f"changed team: {rep['changed_team']} ({rep['changed_team_share']:.1%}), "
        f"changed rep: {rep['changed_rep']} ({rep['changed_rep_share']:.1%})",
        "",
        f"{'team':<24}{'before':>8}{'after':>8}{'diff':>8}",
    ]
    for t in rep["teams"]:
        lines.append(
            f"{t['name']:<24}{t['before']:>8}{t['after']:>8}{t['after'] - t['before']:>+8}"
        )
    lines += ["", f"{'team / rep':<40}{'before':>8}{'after':>8}{'diff':>8}"]
    for r in rep["reps"]:
        label = f"{r['team']} / {r['name']}"[:39]
        lines.append(f"{label:<40}{r['before']:>8}{r['after']:>8}{r['after'] - r['before']:>+8}")
    lines.append("")
    for key, label in (
        ("overflowed", "passed on to an overflow team"),
        ("account_matched", "given to their account's owner"),
    ):
        pair = rep[key]
        lines.append(f"{label}: before {pair['before']}, after {pair['after']}")
    un = rep["unassigned"]
    lines.append(f"unassigned before: {un['before'] or 'none'}; after: {un['after'] or 'none'}")
    for item in un["leads"][:max_leads]:
        where = f" (team {item['team']})" if item.get("team") else ""
        lines.append(f"  {item['crm_id']}: {item['reason']}{where}")
    if len(un["leads"]) > max_leads:
        lines.append(f"  ... and {len(un['leads']) - max_leads} more (--json lists them all)")
    lines += _notes(rep)
    return "\n".join(lines)


def _notes(rep: Mapping[str, Any]) -> list[str]:
    lines = []
    if rep.get("judged_at_arrival"):
        lines.append(
            f"note: {rep['judged_at_arrival']} leads were routed before decisions recorded the "
            "instant availability was judged at: they are replayed one by one at their arrival"
        )
    for team in rep.get("reassigned_in_window", []):
        lines.append(
            f"note: team {team} had leads of the window reassigned; recorded counts are "
            "routing's picks, and the replay does not repeat the reassignments' count changes"
        )
    for team in rep["restarted_in_window"]:
        lines.append(
            f"note: team {team}'s rotation changed inside the window; its replay starts from "
            "the counts at the window's start, so it may differ from what was recorded"
        )
    return lines


def plot_svg(rep: Mapping[str, Any]) -> str:
    """Leads per rep under the proposed config (bars), each with its recorded count as the
    marker, for `connector simulate --plot FILE.svg`."""
    bars = [
        Bar(f"{r['team']} / {r['name']}", float(r["after"]), float(r["before"]))
        for r in rep["reps"]
    ]
    return standalone(
        bar_chart(
            bars,
            title=f"org {rep['org']}: leads per rep since {rep['since'][:10]}, "
            "proposed (bars) vs recorded (markers)",
            ident="simulate",
            width=720,
            reference_label="recorded",
        )
    )


def write_plot(rep: Mapping[str, Any], path: Path) -> None:
    path.write_text(plot_svg(rep), encoding="utf-8")
