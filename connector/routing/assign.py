"""Assignment: the one code path every input (webhook, poll, import) goes through.

``Router.assign_in(conn, leads, source)`` runs inside the caller's transaction, so a webhook
can acknowledge only after its commit (``assign_in_deferred`` does the same work and lets a
caller build the outcomes after that commit, without the teams' locks). In that transaction it
inserts the leads (unique per org, object and CRM id: a repeat changes nothing and reports the
existing owner), matches the rules, locks each team row it routes to and the teams they
overflow into (teams in name order, so two batches never deadlock), reads every member with its
time off and its leads of the day and week with a fresh snapshot, judges who can take a lead at
the injected clock's ``now`` (``connector.routing.availability``; every decision records that
instant, the batch and the reps away by `connector rep away`, which `connector simulate`
replays by), picks owners with the rotation in ``connector.routing.rotation`` (leads nobody can
take go to the overflow team, else stay unassigned with the reason), and records the
assignments, the members' counts and credits, the caps' counters, one outbox row per assignment
and the picks' decisions in a single statement. A lead whose rule says ``route_to:
account_owner`` goes to its account's owner when ``connector.routing.accounts`` finds one (that
is not a turn of any rotation: no count moves), else on to the rule's team rotation. For
Salesforce orgs a lead's id (and its parent's) is stored in the 18-character form, so a record
sent by its 15-character id and later by its 18-character id (in any case) is one lead. The
team row lock is what serialises a team's rotation across any number of processes; in a batch
it is held for the read of the members, the pick, one recording statement and the commit, and
never while a CRM is called. A single new lead of a rotation rule (team without an overflow
team) is one call of ``route_lead`` (``connector.routing.single``), or for a plain team
``route_plain``, one call of two statements (a second call, ``route_lead``, when it hands the
lead on): ``assign`` sends it in autocommit, one round trip, so the lock is held for the rest
of that call plus the commit; ``assign_in`` sends it in the caller's transaction, which holds
the lock until it commits. So a caller writes its own rows in that transaction before it calls
``assign_in`` where they are more than a row or two (the inbox's events and skips, an import's
skips: a claim's events took 3.4 ms to mark at 100 events, 10.5 ms at 200), and commits right
after it. A batch whose leads all go to one plain team of equal weights is one call of
``route_plain_batch`` after the leads' insert (``_route_plain_batch``: the lock held for that
call and the commit), which leaves the batch to the general path, having written nothing,
when it must not decide it (a rep of the team away by command, say)."""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, NamedTuple

from sqlalchemy import Connection, Engine, TextClause, text

import db
from connector.core.config import Member, OrgConfig, Team
from connector.core.database import one_statement
from connector.core.errors import DatabaseUnavailable
from connector.routing import accounts
from connector.routing.availability import (
    Candidate,
    Periods,
    Window,
    config_windows,
    eligibility,
    periods,
    room,
    unplaced_reason,
)
from connector.routing.decisions import DecisionRecorder, PickedDecisions
from connector.routing.rotation import Seat, Turn, pick_available
from connector.routing.rules import Match, compile_rules, match
from connector.routing.single import (
    TraceCache,
    call_params,
    plain_batch_at,
    plain_call,
    single_teams,
)
from crm_adapters.salesforce_ids import id_key

log = logging.getLogger(__name__)

SOURCES = ("salesforce_outbound", "hubspot_webhook", "poll", "import", "api")
MAX_ID_LENGTH = 64
MAX_FIELDS_BYTES = 64 * 1024
RECONNECT_ATTEMPTS = 3

_SQL: dict[str, TextClause] = {k: text(v) for k, v in db.queries("routing").items()}
# the single-lead call as the driver takes it (Router.assign sends it without SQLAlchemy)
_ROUTE_LEAD = db.pyformat(db.queries("routing")["route_lead"])
_ROUTE_PLAIN = db.pyformat(db.queries("routing")["route_plain"])

Status = Literal["assigned", "duplicate", "unassigned"]


class LeadError(ValueError):
    """A lead that cannot be stored; ``reason`` is short and safe to log (no field values)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Lead:
    crm_id: str
    fields: Mapping[str, Any]


@dataclass(frozen=True)
class Outcome:
    crm_id: str
    status: Status
    team: str | None = None
    owner_id: str | None = None
    owner_name: str | None = None
    reason: str | None = None
    account_id: str | None = None  # set when the lead went to this account's owner
    # Every configured rep of the team that decided, with why it was skipped (None: it could
    # take the lead): (member id, reason) pairs, for a decision recorder.
    candidates: tuple[tuple[int, str | None], ...] = field(default=(), compare=False, repr=False)


def _has_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, Mapping):
        return any(_has_nul(k) or _has_nul(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_nul(v) for v in value)
    return False


def validate_lead(crm_id: object, fields: object) -> Lead:
    """Check one lead's shape before anything is stored; raise LeadError saying why not."""
    if isinstance(crm_id, int) and not isinstance(crm_id, bool):
        crm_id = str(crm_id)
    if not isinstance(crm_id, str) or not crm_id.strip():
        raise LeadError("missing CRM id")
    crm_id = crm_id.strip()
    if len(crm_id) > MAX_ID_LENGTH:
        raise LeadError(f"CRM id longer than {MAX_ID_LENGTH} characters")
    if not crm_id.isprintable():
        raise LeadError("CRM id contains control characters")
    if not isinstance(fields, Mapping):
        raise LeadError("fields must be an object")
    if not all(isinstance(k, str) and k for k in fields):
        raise LeadError("field names must be non-empty text")
    if _has_nul(fields):
        raise LeadError("a field contains a NUL character")
    try:  # NaN and Infinity are not JSON: Postgres' jsonb refuses them
        encoded = json.dumps(fields, allow_nan=False)
    except (TypeError, ValueError):
        raise LeadError("fields must be JSON values") from None
    if len(encoded) > MAX_FIELDS_BYTES:
        raise LeadError(f"fields larger than {MAX_FIELDS_BYTES} bytes")
    return Lead(crm_id, dict(fields))


@dataclass
class _Placed:
    rows: list[tuple[tuple[int, str, Match], Turn, Any]]
    credited: dict[int, int]
    periods: Periods


def member_candidate(
    team: Team, member: Member | None, row: Any, load: tuple[int, int]
) -> Candidate:
    """What the eligibility of one member row depends on: the config and its database row."""
    away = config_windows(team, member) if member else ()
    if row.away_until is not None:
        away += (Window(row.away_from, row.away_until),)
    caps = team.caps_of(member) if member else team.caps
    return Candidate(
        member_id=row.id,
        active=row.active,
        hours=member.hours if member else None,
        away=away,
        per_day=caps.per_day,
        per_week=caps.per_week,
        day_count=load[0],
        week_count=load[1],
    )


def away_by_command(rows: Sequence[Any], now: datetime) -> list[str]:
    """The members away at ``now`` by `connector rep away` (table rep_time_off)."""
    return [
        r.crm_user_id
        for r in rows
        if r.away_until is not None and Window(r.away_from, r.away_until).covers(now)
    ]


@dataclass(frozen=True)
class _Standing:
    """A member as a decision records it: its rotation turns at the moment of one pick."""

    id: int
    crm_user_id: str
    name: str
    weight: int
    assigned_in_epoch: int


class _StandingViews:
    """The team's members with their turns as they stand (``turns``, advanced pick by pick
    through one batch)."""

    def __init__(self, rows: Sequence[Any], turns: Mapping[int, int]) -> None:
        self._rows = rows
        self._turns = turns

    def rows(self) -> list[_Standing]:
        return [
            _Standing(r.id, r.crm_user_id, r.name, r.weight, self._turns[r.id]) for r in self._rows
        ]


class _SeatColumns:
    """The seats of one team's picks as ``record_assignments`` takes them (migration 0022):
    distinct candidate sets, flat, and each pick's set and counts (every candidate's turns
    before the pick, which advance pick by pick from ``turns``)."""

    def __init__(self, turns: Mapping[int, int], weight: Mapping[int, int]) -> None:
        self.turns = dict(turns)
        self.weight = weight
        self.set_ids: list[int] = []
        self.set_weights: list[int] = []
        self.set_skips: list[str | None] = []
        self.set_starts: list[int] = []
        self.set_lens: list[int] = []
        self.seat_sets: list[int] = []
        self.count_starts: list[int] = []
        self.seat_counts: list[int] = []
        self._numbers: dict[tuple[tuple[int, str | None], ...], int] = {}
        self._last: tuple[tuple[int, str | None], ...] | None = None
        self._number = 0
        self._at: dict[int, int] = {}  # the current set's member ids -> their place in it
        self._counts: list[int] = []  # the current set's counts, in its order

    def pick(self, candidates: tuple[tuple[int, str | None], ...], member_id: int) -> None:
        """The next pick: ``member_id`` among ``candidates`` (in the rotation's order). The
        turns of a batch share their candidates until a rep is blocked or capped on the way:
        each distinct tuple is one set, sent once (the same object is the common case)."""
        if candidates is not self._last:
            number = self._numbers.get(candidates)
            if number is None:
                number = self._numbers[candidates] = self._add_set(candidates)
            if number != self._number:
                self._number = number
                start = self.set_starts[number - 1] - 1
                ids = self.set_ids[start : start + self.set_lens[number - 1]]
                self._at = {mid: i for i, mid in enumerate(ids)}
                self._counts = [self.turns[mid] for mid in ids]
            self._last = candidates
        self.seat_sets.append(self._number)
        self.count_starts.append(len(self.seat_counts) + 1)
        self.seat_counts += self._counts
        self.turns[member_id] += 1
        i = self._at.get(member_id)
        if i is not None:
            self._counts[i] += 1

    def _add_set(self, candidates: tuple[tuple[int, str | None], ...]) -> int:
        """A new set of candidates: its number, 1-based."""
        self.set_starts.append(len(self.set_ids) + 1)
        self.set_lens.append(len(candidates))
        for mid, why in candidates:
            self.set_ids.append(mid)
            self.set_weights.append(self.weight[mid])
            self.set_skips.append(why)
        return len(self.set_starts)

    def params(self, batch: int | None) -> dict[str, Any]:
        return {
            "batch": batch,
            "seat_sets": self.seat_sets,
            "count_starts": self.count_starts,
            "seat_counts": self.seat_counts,
            "set_starts": self.set_starts,
            "set_lens": self.set_lens,
            "set_ids": self.set_ids,
            "set_weights": self.set_weights,
            "set_skips": self.set_skips,
        }


def overflow_order(cfg: OrgConfig, teams: set[str]) -> list[str]:
    """``teams`` so that every team comes before the team it overflows into (then by name)."""
    depth = dict.fromkeys(teams, 0)
    for name in teams:
        for i, t in enumerate(cfg.overflow_chain(name)):
            if t in depth:
                depth[t] = max(depth[t], i)
    return sorted(teams, key=lambda t: (depth[t], t))


class RoutingError(RuntimeError):
    """The routing state does not match the config (e.g. a team was never applied)."""


@dataclass
class _Batch:
    """One assign_in call's working state (its transaction, outcomes and decisions)."""

    conn: Connection
    source: str
    recorder: DecisionRecorder
    parents: dict[str, str | None] = field(default_factory=dict)  # stored CRM id -> parent
    results: dict[str, Outcome] = field(default_factory=dict)
    # a rotation's picks (stored CRM id -> team, member row, candidates): their outcomes are
    # built once the outcomes are asked for (``Router.assign_in_deferred``)
    picked: dict[str, tuple[str, Any, tuple[tuple[int, str | None], ...]]] = field(
        default_factory=dict
    )
    first: int | None = None  # the batch: its first new lead's id (decisions record it)
    unassigned: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    by_team: dict[str, list[tuple[int, str, Match]]] = field(
        default_factory=lambda: defaultdict(list)
    )
    # each team's record parameters that do not depend on its picks, built before its lock
    ready: dict[str, _Ready] = field(default_factory=dict)
    # the seats read with a team's lock (``lock_team_seats``): the day and week they were read
    # for, and the member rows
    seats: dict[str, tuple[Periods, list[Any]]] = field(default_factory=dict)


class _Owner(NamedTuple):
    """A picked member as its outcome names it."""

    crm_user_id: str
    name: str


@dataclass(frozen=True)
class _TeamRow:
    """A locked team row: its id and epoch."""

    id: int
    epoch: int


@dataclass
class _Ready:
    """What ``record_assignments`` takes for a team's leads that does not depend on the picks
    (the leads, their rules, their grouped decisions), built before the team's lock for the
    common case: every lead of ``group`` placed, in order, and nothing added to their
    decisions under the lock but the batch's instant. Otherwise it is built again there."""

    group: list[tuple[int, str, Match]]
    size: int
    decisions: PickedDecisions
    fixed: dict[str, Any]
    changes: int  # the recorder's change count when it was built

    def holds_for(self, group: list[tuple[int, str, Match]], placed: int, changes: int) -> bool:
        """Whether it is still right: the same leads, all placed, and no decision changed
        since but by the batch's instant (``DecisionRecorder.changes``)."""
        return changes == self.changes and group is self.group and len(group) == self.size == placed


_new = object.__new__


def _assigned(
    crm_id: str,
    team: str,
    owner_id: str,
    owner_name: str,
    candidates: tuple[tuple[int, str | None], ...],
) -> Outcome:
    """``Outcome(crm_id, "assigned", team, owner_id, owner_name, candidates=candidates)``,
    built without the frozen dataclass's ``__init__`` (one ``object.__setattr__`` a field:
    about 1 µs, and a batch builds one a lead); ``test_routing`` checks it equals the one
    ``__init__`` builds, field for field."""
    o = _new(Outcome)
    o.__dict__.update(
        crm_id=crm_id,
        status="assigned",
        team=team,
        owner_id=owner_id,
        owner_name=owner_name,
        reason=None,
        account_id=None,
        candidates=candidates,
    )
    return o


def _in_input_order(keys: Sequence[str], batch: _Batch) -> list[Outcome]:
    """One outcome per input lead; a repeat inside the batch (perhaps by its other id form)
    is a duplicate of the first."""
    out: list[Outcome] = []
    seen: set[str] = set()
    results = batch.results
    picked = batch.picked
    for key in keys:
        o = results.get(key)
        if o is None:
            team, seat, candidates = picked[key]
            o = _assigned(key, team, seat.crm_user_id, seat.name, candidates)
        if key in seen:
            o = Outcome(o.crm_id, "duplicate", o.team, o.owner_id, o.owner_name, o.reason)
        seen.add(key)
        out.append(o)
    return out


class Router:
    """Assigns one org's leads; safe to share between threads (it holds no connection)."""

    def __init__(
        self, engine: Engine, cfg: OrgConfig, clock: Callable[[], datetime] | None = None
    ) -> None:
        self.engine = engine
        self.cfg = cfg
        # The time the caps, working hours and time off are judged at (tests inject one).
        self.clock = clock or (lambda: datetime.now(UTC))
        # the last time a batch read (under its locks, or before a route_plain_batch call): a
        # batch reads its teams' seats with their locks for that day and week (``_lock_teams``),
        # checked against its own time
        self._last_now: datetime | None = None
        self.rules = compile_rules(cfg.rules)
        self.parent_key = cfg.crm.parent_key
        # One record, one lead: Salesforce ids are stored in their 18-character form.
        self.salesforce_ids = cfg.crm.kind == "salesforce"
        # Teams whose single leads are assigned in one call (connector.routing.single).
        self.single = single_teams(cfg)
        self.traces = TraceCache(self.rules)

    def stored_crm_id(self, value: str) -> str:
        """The stored form of a CRM id: 18-character for well-formed Salesforce ids."""
        return id_key(value) if self.salesforce_ids else value

    def assign(self, lead: Lead, source: str) -> Outcome:
        """Store and assign one lead in its own short transaction.

        A lead of a rotation rule is one call in autocommit (the call is the transaction: one
        round trip, the team row locked for that statement only); any other goes through
        ``assign_many``.
        """
        if source not in SOURCES:
            raise ValueError(f"unknown source {source!r}")
        params = self._single_params(lead, source)
        if params is None:
            return self.assign_many([lead], source)[0]
        for attempt in range(RECONNECT_ATTEMPTS):
            try:
                return self._single_outcome(self._call_single(params), params)
            except DatabaseUnavailable as exc:
                if not exc.connection_invalidated or attempt == RECONNECT_ATTEMPTS - 1:
                    raise
                log.warning("database connection lost; retrying (attempt %d)", attempt + 2)
        raise AssertionError("unreachable")

    def _call_single(self, params: Mapping[str, Any]) -> tuple[Any, ...] | None:
        """The single-lead call's row, in autocommit: ``route_plain`` (one call) for a
        plain call, ``route_lead`` for the others and for what ``route_plain`` hands on."""
        if plain_call(self.single[params["team"]], params):
            row = one_statement(self.engine, _ROUTE_PLAIN, params)
            if row is None or row[0] != "route_lead":
                return row
            log.debug("lead %s of team %s: route_lead decides", params["crm_id"], params["team"])
        return one_statement(self.engine, _ROUTE_LEAD, params)

    def _single_params(self, lead: Lead, source: str) -> dict[str, Any] | None:
        """The ``route_lead`` call for a lead that can take it (a rotation rule matched and
        its team has no overflow team), else None: the general path decides it."""
        m = match(self.rules, lead.fields)
        if m is None or self.cfg.rules[m.rule_index].route_to != "team":
            return None
        inputs = self.single.get(m.team)
        if inputs is None:
            return None
        key = (self.stored_crm_id(lead.crm_id), lead.fields, self._parent(lead))
        return call_params(self.cfg, self.traces, inputs, key, m, source, self.clock())

    def _route_single(self, conn: Connection, params: Mapping[str, Any]) -> Outcome:
        """The single-lead call in the caller's transaction: ``route_plain`` for a plain call
        (a lead it hands on leaves nothing behind), else or then ``route_lead``."""
        if plain_call(self.single[params["team"]], params):
            row = tuple(conn.execute(_SQL["route_plain"], params).one())
            if row[0] != "route_lead":
                return self._single_outcome(row, params)
        return self._single_outcome(tuple(conn.execute(_SQL["route_lead"], params).one()), params)

    def _single_outcome(self, row: Sequence[Any] | None, params: Mapping[str, Any]) -> Outcome:
        """The outcome a ``route_lead`` row says: (status, lead id, team, owner id, owner
        name, reason, candidate ids, their skip reasons)."""
        if row is None:
            raise AssertionError("route_lead returned no row")
        status, _, team, owner_id, owner_name, reason, cand_ids, cand_skips = row
        cid = params["crm_id"]
        if status == "no_team":
            raise RoutingError(
                f"team {params['team']!r} of org {self.cfg.org!r} is not in the database: "
                "run `connector migrate` with this config"
            )
        if status == "duplicate":
            return Outcome(cid, "duplicate", team, owner_id, owner_name, reason)
        candidates = tuple(zip(cand_ids, cand_skips, strict=True))
        if status == "unassigned":
            return Outcome(cid, "unassigned", team, reason=reason, candidates=candidates)
        return _assigned(cid, team, owner_id, owner_name, candidates)

    def assign_many(self, leads: Sequence[Lead], source: str) -> list[Outcome]:
        """Store and assign a batch in one transaction, with the same guarantees.

        A connection lost mid-transaction (server restart, network) is retried on a fresh
        connection. That is safe even when the commit's fate is unknown: a lead that did get
        stored comes back as a duplicate with its owner, never with a second one.
        """
        if not leads:
            return []
        for attempt in range(RECONNECT_ATTEMPTS):
            try:
                with self.engine.begin() as conn:
                    outcomes = self.assign_in_deferred(conn, leads, source)
                return outcomes()  # after the commit: the team's lock is no longer held
            except DatabaseUnavailable as exc:
                if not exc.connection_invalidated or attempt == RECONNECT_ATTEMPTS - 1:
                    raise
                log.warning("database connection lost; retrying (attempt %d)", attempt + 2)
        raise AssertionError("unreachable")

    def assign_in(self, conn: Connection, leads: Sequence[Lead], source: str) -> list[Outcome]:
        """Assign ``leads`` inside the caller's open transaction; outcomes in input order."""
        return self.assign_in_deferred(conn, leads, source)()

    def assign_in_deferred(
        self, conn: Connection, leads: Sequence[Lead], source: str
    ) -> Callable[[], list[Outcome]]:
        """``assign_in``, returning what builds the outcomes: a caller that needs them only
        after its commit (``assign_many``, the inbox, the poller, an import) builds them then,
        without the teams' locks (building a batch's took 0.7 ms for 500 leads, and every
        batch queued for the lock waited that much longer). It reads nothing from the
        database."""
        if source not in SOURCES:
            raise ValueError(f"unknown source {source!r}")
        if not leads:
            return lambda: []
        if len(leads) == 1:
            params = self._single_params(leads[0], source)
            if params is not None:
                single = self._route_single(conn, params)
                return lambda: [single]
        keys = [self.stored_crm_id(lead.crm_id) for lead in leads]
        first: dict[str, Lead] = {}
        for key, lead in zip(keys, leads, strict=True):
            first.setdefault(key, lead)
        batch = _Batch(conn, source, DecisionRecorder(self.cfg, self.rules))
        batch.parents = {cid: self._parent(lead) for cid, lead in first.items()}
        new_ids = self._insert(batch, first)
        picked = self._match_rules(batch, first, new_ids)
        matched, fallbacks = self._route_accounts(batch, picked, first)
        for lead_id, cid, m in picked:
            if cid not in batch.results:  # not given to its account's owner: the rotation
                batch.by_team[m.team].append((lead_id, cid, m))
        needed = {t for name in batch.by_team for t in self.cfg.overflow_chain(name)}
        for team_name, group in batch.by_team.items():  # before the locks
            batch.ready[team_name] = self._ready(batch, team_name, group)
        self._route(batch, needed, matched, new_ids)
        for reason, ids in batch.unassigned.items():
            conn.execute(_SQL["mark_unassigned"], {"reason": reason, "lead_ids": ids})
        accounts.note_fallbacks(conn, fallbacks)
        batch.recorder.flush(conn)  # the decisions, in the same transaction
        missing = [k for k in keys if k not in batch.results and k not in batch.picked]
        if missing:  # raised here, so the caller's transaction rolls back, not after it
            raise RoutingError(f"{len(missing)} leads of the batch got no outcome")
        return lambda: _in_input_order(keys, batch)

    def _route(
        self,
        batch: _Batch,
        needed: set[str],
        matched: Mapping[str, Sequence[accounts.Matched]],
        new_ids: Mapping[str, int],
    ) -> None:
        """Pick owners for the rotation's leads and record them: one plain team's batch in
        one call when it may (``_route_plain_batch``), else under the locks of every team
        they may go to, overflow teams included, in overflow order."""
        plain = self._plain_batch_team(batch, needed, matched)
        if plain is None:
            locked = self._lock_teams(batch, needed, matched)
            now = self._judged(batch, new_ids, self.clock())
        else:
            # one plain team: the clock is read before its lock, as for route_plain (one call
            # for the lock, the picks and the records; module single says what that changes)
            if self._route_plain_batch(batch, plain[0], self._judged(batch, new_ids, plain[1])):
                return
            # left to this path: judged again at the time read under the lock, as any batch
            locked = self._lock_teams(batch, needed, matched)
            now = self._judged(batch, new_ids, self.clock())
        for team_name in overflow_order(self.cfg, needed):
            if batch.by_team.get(team_name):
                self._route_team(batch, team_name, locked[team_name], now)

    def _judged(self, batch: _Batch, new_ids: Mapping[str, int], now: datetime) -> datetime:
        """The batch's instant, read once: its leads were judged at ``now``."""
        self._last_now = now
        if new_ids:
            batch.first = min(new_ids.values())
            batch.recorder.judged_at(list(new_ids.values()), now, batch.first)
        return now

    def _plain_batch_team(
        self,
        batch: _Batch,
        needed: set[str],
        matched: Mapping[str, Sequence[accounts.Matched]],
    ) -> tuple[str, datetime] | None:
        """The team and the batch's instant when every lead of the rotation goes to one plain
        team (every active member of one weight, no caps, no catch-up, no overflow team,
        nobody blocked by the config at that instant) and none to an account's owner:
        ``route_plain_batch`` may decide them."""
        if matched or len(batch.by_team) != 1:
            return None
        (team_name,) = batch.by_team
        inputs = self.single.get(team_name)
        if inputs is None or not (inputs.plain and inputs.equal_weights) or needed != {team_name}:
            return None
        now = self.clock()
        return (team_name, now) if plain_batch_at(inputs, now) else None

    def _route_plain_batch(self, batch: _Batch, team_name: str, now: datetime) -> bool:
        """The team's leads in one call (``route_plain_batch``): the lock, the picks and the
        records; False when it left them to the general path (a rep of the team away by
        command, weights not all equal, no active member, or no such team), having written
        nothing: with the team's lock held when that was found only under the lock, else
        without taking it."""
        group = batch.by_team[team_name]
        ready = batch.ready[team_name]
        if not ready.holds_for(group, len(group), batch.recorder.changes):
            ready = self._ready(batch, team_name, group)
        p = periods(now, self.cfg.team(team_name).timezone)
        row = batch.conn.execute(
            _SQL["route_plain_batch"],
            {
                **ready.fixed,
                "team": team_name,
                "now": now,
                "day": p.day,
                "week": p.week,
                "batch": batch.first,
                "details": batch.recorder.shared(ready.decisions),
            },
        ).one()
        if row.status != "assigned":
            log.debug("batch %s of team %s: the general path decides", batch.first, team_name)
            return False
        batch.recorder.forget(ready.decisions)
        owners = {
            mid: _Owner(user, name)
            for mid, user, name in zip(row.seat_ids, row.seat_users, row.seat_names, strict=True)
        }
        candidates = tuple(zip(row.seat_ids, row.seat_skips, strict=True))
        picked = batch.picked
        for (_, cid, _), member_id in zip(group, row.member_ids, strict=True):
            picked[cid] = (team_name, owners[member_id], candidates)
        return True

    def _insert(self, batch: _Batch, first: Mapping[str, Lead]) -> dict[str, int]:
        """Insert the new leads (crm_id -> lead id); a repeat gets its existing outcome."""
        org, obj = self.cfg.org, self.cfg.crm_object
        unique = list(first.items())
        rows = batch.conn.execute(
            _SQL["insert_leads"],
            {
                "org": org,
                "crm_object": obj,
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
                _SQL["existing_leads"], {"org": org, "crm_object": obj, "crm_ids": old}
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

    def _match_rules(
        self, batch: _Batch, first: Mapping[str, Lead], new_ids: Mapping[str, int]
    ) -> list[tuple[int, str, Match]]:
        """The new leads' rule matches, in input order (the earliest lead gets the next rep);
        a lead no rule matches is unassigned."""
        picked: list[tuple[int, str, Match]] = []
        for cid, lead in first.items():
            if cid not in new_ids:
                continue
            lead_id = new_ids[cid]
            batch.recorder.started(lead_id, batch.source, lead.fields)
            m = match(self.rules, lead.fields)
            if m is None:
                batch.recorder.unassigned(lead_id, "no_rule_matched")
                batch.unassigned["no_rule_matched"].append(lead_id)
                batch.results[cid] = Outcome(cid, "unassigned", reason="no_rule_matched")
            else:
                picked.append((lead_id, cid, m))
        return picked

    def _route_accounts(
        self,
        batch: _Batch,
        picked: Sequence[tuple[int, str, Match]],
        first: Mapping[str, Lead],
    ) -> tuple[dict[str, list[accounts.Matched]], dict[int, accounts.AccountDecision]]:
        """Account matching for ``route_to: account_owner`` rules, with its decisions."""
        matched, fallbacks = self._match_accounts(batch.conn, picked, first, batch.results)
        for hits in matched.values():
            for hit in hits:
                batch.recorder.account(hit.candidate.lead_id, hit.decision.as_json())
                batch.recorder.detail(hit.candidate.lead_id).update(
                    {
                        "team": hit.seat.team,
                        "epoch": hit.seat.epoch,
                        "outcome": "assigned",
                        "chosen": {
                            "member_id": hit.seat.member_id,
                            "crm_user_id": hit.seat.crm_user_id,
                            "name": hit.seat.name,
                            "by": "account_owner",
                        },
                    }
                )
        for lead_id, decision in fallbacks.items():
            batch.recorder.account(lead_id, decision.as_json())
        return matched, fallbacks

    def _lock_teams(
        self,
        batch: _Batch,
        needed: set[str],
        matched: Mapping[str, Sequence[accounts.Matched]],
    ) -> dict[str, Any]:
        """Lock every team these leads may go to, overflow teams included, in name order (so
        two batches never deadlock). Account-matched leads are recorded in the same name order:
        a team that only receives them is not locked FOR UPDATE (its rotation does not move; the
        insert's foreign key check takes FOR KEY SHARE on it), one that is locked records them
        under its lock. A team with catch-up is locked for them too: its picks read its latest
        owners by assignment id, account owners' leads included, and an assignment inserted
        before the lock wait (the foreign key check waits at the end of the insert) would hold
        an id from before the lock holder's, out of the order the team's picks saw and
        `connector simulate` replays."""
        org = self.cfg.org
        locked: dict[str, Any] = {}
        # the seats read with a lock are read for the day and week of the router's last time
        # read (the previous batch's, read under its locks, or this batch's own, read before
        # a route_plain_batch call that left it to this path); ``_pick`` checks it against the
        # time read under the locks (leads come day after day)
        before = self._last_now
        for team_name in sorted(needed | set(matched)):
            if team_name not in needed and self.cfg.team(team_name).max_in_a_row is None:
                accounts.record_matched(batch.conn, self.cfg, batch.source, matched[team_name])
                continue
            team: Any
            if before is not None and batch.by_team.get(team_name) and not matched.get(team_name):
                team = self._lock_with_seats(batch, team_name, before)
            else:
                # a router's first batch has no day to read the seats for yet, an overflow
                # team with no lead of its own may never read its seats, and a team's account
                # owners' leads are recorded before its seats are read
                team = batch.conn.execute(
                    _SQL["lock_team"], {"org": org, "name": team_name}
                ).one_or_none()
            if team is None:
                raise RoutingError(
                    f"team {team_name!r} of org {org!r} is not in the database: "
                    "run `connector migrate` with this config"
                )
            if team_name in needed:
                locked[team_name] = team
            accounts.record_matched(batch.conn, self.cfg, batch.source, matched.get(team_name, []))
        return locked

    def _lock_with_seats(self, batch: _Batch, team_name: str, before: datetime) -> _TeamRow | None:
        """Lock the team and read its seats in one round trip (``lock_team_seats``), for the
        day and week of ``before``, the router's last time read (``_pick`` reads them again if
        the time read under the lock falls on another day or week); None: no such team."""
        p = periods(before, self.cfg.team(team_name).timezone)
        rows = batch.conn.execute(
            _SQL["lock_team_seats"],
            {"org": self.cfg.org, "name": team_name, "day": p.day, "week": p.week},
        ).all()
        if not rows:
            return None
        batch.seats[team_name] = (p, [r for r in rows if r.id is not None])
        return _TeamRow(rows[0].team_id, rows[0].epoch)

    def _route_team(self, batch: _Batch, team_name: str, team: Any, now: datetime) -> None:
        """Pick owners for the team's leads under its lock and record them; leads nobody can
        take go on to the overflow team (teams are visited in overflow order), else stay
        unassigned with the reason."""
        group = batch.by_team[team_name]
        placed, left, reason, members = self._pick(
            batch.conn, team_name, team.id, group, now, batch.seats.pop(team_name, None)
        )
        away = away_by_command(members, now)
        for lead_id, _, _ in group:
            batch.recorder.away_by_command(lead_id, away)
        ready = batch.ready.get(team_name)
        if ready is None or not ready.holds_for(group, len(placed.rows), batch.recorder.changes):
            ready = self._ready(batch, team_name, [item for item, _, _ in placed.rows])
        # Each pick's seats (the candidates in the rotation's order, their weights, counts
        # and skip reasons) go in columns of its decision (record_assignments).
        seats = _SeatColumns({r.id: r.turns for r in members}, {r.id: r.weight for r in members})
        views = _StandingViews(members, seats.turns)
        pick = seats.pick
        picked = batch.picked
        for (_, cid, _), turn, seat in placed.rows:
            pick(turn.candidates, seat.id)
            picked[cid] = (team_name, seat, turn.candidates)
        if placed.rows:  # the assignments and their decisions, in one statement
            params = self._record_params(team, placed, batch, ready) | seats.params(batch.first)
            batch.conn.execute(_SQL["record_assignments"], params)
        overflow = self.cfg.team(team_name).overflow_team
        for item, turn in left:
            if overflow is not None:
                batch.recorder.overflowed(item[0], team_name, views.rows(), turn.candidates)
                batch.by_team[overflow].append(item)
                continue
            lead_id, cid, _ = item
            batch.recorder.unassigned(lead_id, reason, team_name, views.rows(), turn.candidates)
            batch.unassigned[reason].append(lead_id)
            batch.results[cid] = Outcome(
                cid, "unassigned", team_name, reason=reason, candidates=turn.candidates
            )

    def _match_accounts(
        self,
        conn: Connection,
        picked: Sequence[tuple[int, str, Match]],
        leads: Mapping[str, Lead],
        results: dict[str, Outcome],
    ) -> tuple[dict[str, list[accounts.Matched]], dict[int, accounts.AccountDecision]]:
        """Leads of ``route_to: account_owner`` rules that go to their account's owner, by the
        team of the owner's seat (their outcomes set in ``results``), and the decisions of
        those that fall back to their rule's team rotation, by lead id."""
        candidates = [
            accounts.Candidate(
                lead_id,
                cid,
                leads[cid].fields,
                self._parent(leads[cid]),
                m.team,
                m.rule_index,
                m.rule_name,
            )
            for lead_id, cid, m in picked
            if self.cfg.rules[m.rule_index].route_to == "account_owner"
        ]
        found, fallbacks = accounts.match_accounts(conn, self.cfg, candidates)
        matched: dict[str, list[accounts.Matched]] = defaultdict(list)
        for hit in found:
            c, seat = hit.candidate, hit.seat
            matched[seat.team].append(hit)
            results[c.crm_id] = Outcome(
                c.crm_id,
                "assigned",
                seat.team,
                seat.crm_user_id,
                seat.name,
                account_id=hit.decision.account_id,
            )
        return dict(matched), fallbacks

    def _pick(
        self,
        conn: Connection,
        team_name: str,
        team_id: int,
        group: list[tuple[int, str, Match]],
        now: datetime,
        read: tuple[Periods, list[Any]] | None = None,
    ) -> tuple[_Placed, list[tuple[tuple[int, str, Match], Turn]], str, Sequence[Any]]:
        """Pick owners for ``group`` under the team's lock: (placed, left over, why left, the
        member rows read under the lock). ``read``: the rows read with the lock and the
        periods they were read for, used when ``now`` falls in the same day and week."""
        team_cfg = self.cfg.team(team_name)
        p = periods(now, team_cfg.timezone)
        if read is not None and (read[0].day, read[0].week) == (p.day, p.week):
            rows: Sequence[Any] = read[1]
        else:
            rows = conn.execute(
                _SQL["team_candidates"],
                {"org": self.cfg.org, "team_id": team_id, "day": p.day, "week": p.week},
            ).all()
        configured = {m.crm_user_id: m for m in team_cfg.members}
        loads = self._loads(team_id, rows)
        candidates = [
            member_candidate(team_cfg, configured.get(r.crm_user_id), r, loads[r.id]) for r in rows
        ]
        now_reasons = eligibility(candidates, now)
        k = team_cfg.max_in_a_row
        recent = (
            [r.member_id for r in conn.execute(_SQL["recent_owners"], {"team_id": team_id, "k": k})]
            if k
            else []
        )
        picks = pick_available(
            [Seat(r.id, r.weight, r.turns, r.position) for r in rows if r.active],
            {m: r for m, r in now_reasons.items() if r in ("away", "off_shift")},
            {c.member_id: room(c) for c in candidates},
            len(group),
            max_in_a_row=k,
            recent=recent,
        )
        inactive = tuple((r.id, "inactive") for r in rows if not r.active)
        by_id = {r.id: r for r in rows}
        placed = _Placed([], picks.credited, p)
        left: list[tuple[tuple[int, str, Match], Turn]] = []
        for item, turn in zip(group, picks.turns, strict=True):
            if inactive:
                turn = Turn(turn.member_id, turn.candidates + inactive)
            if turn.member_id is None:
                left.append((item, turn))
            else:
                placed.rows.append((item, turn, by_id[turn.member_id]))
        reason = unplaced_reason(dict(left[0][1].candidates)) if left else ""
        return placed, left, reason, rows

    def _loads(self, team_id: int, rows: Sequence[Any]) -> dict[int, tuple[int, int]]:
        """Each member's leads in this day and week, as read under the team lock."""
        return {r.id: (r.day_count, r.week_count) for r in rows}

    def _ready(self, batch: _Batch, team_name: str, group: list[tuple[int, str, Match]]) -> _Ready:
        decisions = batch.recorder.group_picked(
            team_name, [(lead_id, m.rule_index) for lead_id, _, m in group]
        )
        fixed = {
            "org": self.cfg.org,
            "source": batch.source,
            "crm_object": self.cfg.crm_object,
            "lead_ids": decisions.lead_ids,
            "crm_ids": [cid for _, cid, _ in group],
            "parent_ids": [batch.parents.get(cid) for _, cid, _ in group],
            "sla_minutes": decisions.slas,
            "detail_of": decisions.positions,
            "rule_indexes": [m.rule_index for _, _, m in group],
            "rule_names": [m.rule_name for _, _, m in group],
        }
        return _Ready(group, len(group), decisions, fixed, batch.recorder.changes)

    def _record_params(
        self, team: Any, placed: _Placed, batch: _Batch, ready: _Ready
    ) -> dict[str, Any]:
        return {
            **ready.fixed,
            "team_id": team.id,
            "epoch": team.epoch,
            "details": batch.recorder.take(ready.decisions),
            "member_ids": [turn.member_id for _, turn, _ in placed.rows],
            "credit_ids": list(placed.credited),
            "credit_ns": list(placed.credited.values()),
            "day": placed.periods.day,
            "week": placed.periods.week,
        }

    def _parent(self, lead: Lead) -> str | None:
        if not self.parent_key:
            return None
        value = lead.fields.get(self.parent_key)
        return self.stored_crm_id(str(value)) if value not in (None, "") else None
