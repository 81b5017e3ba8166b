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

This module holds the replay (pure); the window it replays is read by
``connector.routing.replay_read`` into the types of ``connector.routing.replay_history``, and
``connector.routing.replay_report`` reports the outcome.
"""

from __future__ import annotations

import sys
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

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
from connector.routing.domains import lead_domains
from connector.routing.replay_history import History, HistoryLead, LoadKey
from connector.routing.rotation import Seat, pick_available
from connector.routing.rules import match, org_rules
from connector.routing.teams import rotation_fingerprint


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
