"""Reassignment: give a routed lead to another rep, keeping one current owner and the history.

Every path that moves a lead (``connector reassign --rotate`` / ``--to``, rep deactivation,
the SLA re-route) goes through ``reassign_lead``, one short transaction per lead: it locks
the lead's current assignment row (a second reassignment of the same lead waits here and then
sees the first one's result), locks the lead's unsent outbox rows, locks the team row of the
rep who gets the lead (the lock new leads' rotation takes), and in one statement moves the
old owner to ``assignment_history``, updates the current row, counts the lead for the new rep,
supersedes the unsent writes and queues the new write. ``assignments`` keeps UNIQUE (lead_id),
so the database itself refuses two current owners.

How a reassignment counts in the rotation: the lead counts as one more lead for the rep who
gets it (exactly like a new lead, with its caps' counters: ``count_turns``, the one place a
turn is counted); the rep who loses it keeps their count (it does not go down: a lead taken
away is not owed back). ``--rotate`` (and a deactivated rep's leads, and the SLA re-route) is
decided by the router itself, ``route_team`` on the server, with the current owner skipped
(``current_owner``, no credit): the team's rotation as a new lead meets it, with its
availability, caps, catch-up and credits for the reps it passes over. With equal weights and
nobody blocked that is the rep with the fewest turns in the epoch (ties in config order), so
among the reps who lost no lead the counts still differ by at most one.

The new write stays owner-safe: it carries ``replaces_owners`` (the owner we last wrote, and
writes that were in flight), and the dispatcher writes only over those or an intake owner. A
lead a person moved in the CRM (its last write was superseded with the owner found) is not
reassigned.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from sqlalchemy import Connection, Engine, TextClause, text

import db
from connector.core.config import OrgConfig
from connector.core.crm_kinds import crm_kind
from connector.core.errors import UsageError
from connector.routing.availability import Candidate, Periods, eligibility, periods
from connector.routing.availability import member_candidate as candidate_of
from connector.routing.calls import team_inputs, team_params
from connector.routing.decisions import DecisionRecorder
from connector.routing.rep_state import RepState, state_now
from connector.routing.rules import org_rules

log = logging.getLogger(__name__)

_SQL: dict[str, TextClause] = {k: text(v) for k, v in db.queries("reassign").items()}
_TEAMS: dict[str, TextClause] = {k: text(v) for k, v in db.queries("teams").items()}
_ROUTING: dict[str, TextClause] = {k: text(v) for k, v in db.queries("routing").items()}
_REPS: dict[str, TextClause] = {k: text(v) for k, v in db.queries("reps").items()}

Reason = Literal["rotated", "reassigned", "rep_deactivated", "sla_expired"]
REASONS: tuple[str, ...] = ("rotated", "reassigned", "rep_deactivated", "sla_expired")


@dataclass(frozen=True)
class _Member:
    """A team member as a reassignment reads it under the team lock (``team_candidates``);
    ``assigned_in_epoch`` holds its rotation turns (leads plus credited turns)."""

    id: int
    crm_user_id: str
    name: str
    weight: int
    assigned_in_epoch: int
    position: int
    active: bool
    row: Any


class ReassignError(UsageError):
    """A reassignment refused; the message says why, and nothing was stored."""


@dataclass(frozen=True)
class Rep:
    """A configured, active member of the org that a lead can be given to."""

    member_id: int
    team_id: int
    team: str
    crm_user_id: str
    name: str


@dataclass(frozen=True)
class Moved:
    crm_id: str
    old_owner: str
    new_owner: str
    new_name: str
    team: str
    reason: str
    outbox_id: int
    superseded: int
    replaces_owners: tuple[str, ...]


def choose_rep(rows: Sequence[Any], rep: str, org: str, prefer_team_id: int | None) -> Rep:
    """Decide which member ``rep`` names (pure over the rows ``rep_candidates`` returned)."""
    if not rows:
        raise ReassignError(f"rep {rep!r} is not a member of org {org!r}")
    active = [r for r in rows if r.active]
    if not active:
        raise ReassignError(f"rep {rep!r} is inactive in org {org!r}")
    users = sorted({r.crm_user_id for r in active})
    if len(users) > 1:
        raise ReassignError(
            f"rep {rep!r} names several reps of org {org!r} ({', '.join(users)}): "
            "give the crm_user_id"
        )
    chosen = next((r for r in active if r.team_id == prefer_team_id), active[0])
    return Rep(chosen.id, chosen.team_id, chosen.team, chosen.crm_user_id, chosen.name)


def _rep_key(cfg: OrgConfig, rep: str) -> str | None:
    kind = crm_kind(cfg.crm.kind)
    return kind.id_key(rep) if kind.typed_ids and kind.is_id(rep) else None


def resolve_rep(conn: Connection, cfg: OrgConfig, rep: str, prefer_team_id: int | None) -> Rep:
    rows = conn.execute(
        _SQL["rep_candidates"], {"org": cfg.org, "rep": rep, "rep_key": _rep_key(cfg, rep)}
    ).all()
    return choose_rep(rows, rep, cfg.org, prefer_team_id)


def check_rep(engine: Engine, cfg: OrgConfig, rep: str) -> Rep:
    """Validate ``--to REP`` before any lead is touched."""
    with engine.connect() as conn:
        return resolve_rep(conn, cfg, rep, None)


def stored_id(cfg: OrgConfig, crm_id: str) -> str:
    return crm_kind(cfg.crm.kind).id_key(crm_id.strip())


def reassign_lead(
    engine: Engine,
    cfg: OrgConfig,
    crm_id: str,
    *,
    to: str | None = None,
    reason: Reason = "rotated",
    note: str | None = None,
    expect_owner: str | None = None,
    force: bool = False,
) -> Moved:
    """Move one lead (its own transaction): to rep ``to``, or by rotation when None.

    ``expect_owner``: refuse unless the lead's current owner is still this one (another
    reassignment of the same lead that committed first wins; this one changes nothing).
    ``force``: give the lead to ``to`` even when that rep cannot take a lead now (away, off
    shift, capped); without it that is refused.
    """
    if reason not in REASONS:
        raise ValueError(f"unknown reason {reason!r}")
    with engine.begin() as conn:
        return _reassign_in(
            conn, cfg, stored_id(cfg, crm_id), to, reason, note, expect_owner, force
        )


def _lock_current(conn: Connection, cfg: OrgConfig, crm_id: str, expect_owner: str | None) -> Any:
    """Lock the lead's current assignment and its unsent writes; its current owner's row.
    Refused: an unknown or unowned lead, an owner that changed from ``expect_owner``, or an
    owner a person set in the CRM."""
    key = {"org": cfg.org, "crm_object": cfg.crm_object, "crm_id": crm_id}
    locked = conn.execute(_SQL["lock_current"], key).one_or_none()
    if locked is None:
        lead = conn.execute(_SQL["lead_state"], key).one_or_none()
        if lead is None:
            raise ReassignError(f"lead {crm_id} is not known to org {cfg.org!r}")
        raise ReassignError(
            f"lead {crm_id} has no owner ({lead.unassigned_reason or 'unassigned'}): "
            "nothing to reassign"
        )
    cur = conn.execute(_SQL["current_of"], {"assignment_id": locked.id}).one()
    if expect_owner is not None and cur.crm_user_id != expect_owner:
        raise ReassignError(
            f"lead {crm_id} was reassigned meanwhile (now {cur.crm_user_id}); nothing changed"
        )
    conn.execute(_SQL["lock_unsent"], {"lead_id": cur.lead_id}).all()
    last = conn.execute(_SQL["last_write"], {"lead_id": cur.lead_id}).one_or_none()
    if last is not None and last.state == "superseded" and last.found_owner:
        raise ReassignError(
            f"lead {crm_id}: a person set owner {last.found_owner} in the CRM; not ours to reassign"
        )
    return cur


def _team_seats(
    conn: Connection, cfg: OrgConfig, team_name: str, team_id: int, now: datetime
) -> tuple[Periods, list[_Member], dict[int, Candidate]]:
    """(the team's day and week at ``now``, its members, what each one's eligibility
    depends on), read as a routing pick reads them: turns, time off, and the caps' counts."""
    team_cfg = cfg.team(team_name)
    when = periods(now, team_cfg.timezone)
    members = [
        _Member(r.id, r.crm_user_id, r.name, r.weight, r.turns, r.position, r.active, r)
        for r in conn.execute(
            _ROUTING["team_candidates"],
            {"org": cfg.org, "team_id": team_id, "day": when.day, "week": when.week},
        )
    ]
    configured = {m.crm_user_id: m for m in team_cfg.members}
    reasons = {r.crm_user_id: r.reason for r in conn.execute(_REPS["time_off"], {"org": cfg.org})}
    candidates = {
        m.id: candidate_of(
            team_cfg,
            configured.get(m.crm_user_id),
            m.row,
            (m.row.day_count, m.row.week_count),
            reasons.get(m.crm_user_id),
        )
        for m in members
    }
    return when, members, candidates


def _team_candidates(
    conn: Connection, cfg: OrgConfig, team_name: str, team_id: int, current_member_id: int
) -> tuple[Periods, list[_Member], list[tuple[int, str | None]], dict[int, RepState]]:
    """(the team's day and week now, its members, each member with why it cannot take a lead
    now or None, each member's state now), read under the team lock as a routing pick reads
    them."""
    now = datetime.now(UTC)
    when, members, seats = _team_seats(conn, cfg, team_name, team_id, now)
    available = eligibility(seats.values(), now)
    candidates: list[tuple[int, str | None]] = [
        (m.id, "current_owner" if m.id == current_member_id else available[m.id]) for m in members
    ]
    zone = cfg.team(team_name).timezone
    states = {mid: state_now(c, now, zone) for mid, c in seats.items()}
    return when, members, candidates, states


def unavailable(rep: Rep, state: RepState, crm_id: str) -> ReassignError:
    """The refusal of ``--to`` a rep who cannot take a lead now (without ``--force``)."""
    return ReassignError(
        f"lead {crm_id}: rep {rep.name} ({rep.crm_user_id}) is {state.text()} in team "
        f"{rep.team}; --force gives it the lead anyway; nothing changed"
    )


def check_target(
    engine: Engine, cfg: OrgConfig, crm_ids: Sequence[str], to: str, now: datetime
) -> None:
    """Refuse ``--to`` before any lead moves when the rep cannot take a lead now in the team
    it would get each lead in (the lead's team when the rep is in it); leads that cannot be
    reassigned anyway are refused one by one later."""
    states: dict[int | None, tuple[Rep, RepState]] = {}  # by the lead's team
    with engine.connect() as conn:
        for crm_id in crm_ids:
            key = {"org": cfg.org, "crm_object": cfg.crm_object, "crm_id": stored_id(cfg, crm_id)}
            team_id = conn.execute(_SQL["current_team"], key).scalar_one_or_none()
            if team_id is None:
                continue
            if team_id not in states:
                rep = resolve_rep(conn, cfg, to, team_id)
                seats = _team_seats(conn, cfg, rep.team, rep.team_id, now)[2]
                zone = cfg.team(rep.team).timezone
                states[team_id] = (rep, state_now(seats[rep.member_id], now, zone))
            rep, state = states[team_id]
            if not state.available:
                raise unavailable(rep, state, key["crm_id"])


@dataclass(frozen=True)
class _Choice:
    """Who gets a moved lead, with what its decision records: the seats as the pick saw them
    (member ids, weights, turns, skip reasons, in the rotation's order) and the turns the pick
    credited to reps it passed over."""

    member_id: int
    crm_user_id: str
    name: str
    seats: tuple[list[int], list[int], list[int], list[str | None]]
    credit_ids: list[int]
    credit_ns: list[int]
    when: Periods


def _by_rotation(
    conn: Connection, cfg: OrgConfig, crm_id: str, team: Any, cur: Any, now: datetime
) -> _Choice:
    """--rotate: the router's pick (``route_team`` on the server, not recorded) among the
    team's reps other than the current owner, as a new lead would meet the rotation now."""
    inputs = team_inputs(cfg.team(team.name))
    params = team_params(inputs, now)
    row = conn.execute(
        _SQL["rotate_pick"],
        {
            **params,
            "org": cfg.org,
            "crm_object": cfg.crm_object,
            "lead_id": cur.lead_id,
            "exclude": cur.member_id,
        },
    ).one()
    if row.member_id is None:
        raise ReassignError(
            f"lead {crm_id}: no other rep of team {team.name!r} can take a lead now; "
            "nothing changed"
        )
    k = len(row.seat_ids)
    i = row.seat_ids.index(row.member_id)
    return _Choice(
        row.member_id,
        row.seat_users[i],
        row.seat_names[i],
        (row.seat_ids, row.seat_weights, row.seat_counts[:k], row.seat_skips[:k]),
        row.credit_ids,
        row.credit_ns,
        Periods(params["day"], params["week"]),
    )


def _to_rep(
    conn: Connection, cfg: OrgConfig, crm_id: str, team: Any, cur: Any, rep: Rep, force: bool
) -> _Choice:
    """--to: the named rep, refused when it cannot take a lead now unless ``force``; its
    decision lists the team's reps with the named one eligible whatever the rotation says."""
    when, members, candidates, states = _team_candidates(
        conn, cfg, team.name, team.id, cur.member_id
    )
    if not force and not states[rep.member_id].available:
        raise unavailable(rep, states[rep.member_id], crm_id)
    by_id = {m.id: m for m in members}
    ids = [mid for mid, _ in candidates]
    skips = [None if mid == rep.member_id else r for mid, r in candidates]
    seats = (ids, [by_id[m].weight for m in ids], [by_id[m].assigned_in_epoch for m in ids], skips)
    return _Choice(rep.member_id, rep.crm_user_id, rep.name, seats, [], [], when)


def _record_decision(
    conn: Connection,
    cfg: OrgConfig,
    cur: Any,
    team: Any,
    choice: _Choice,
    row: Any,
    detail: Mapping[str, Any],
) -> None:
    """The reassignment's decision: the team pick, and what moved from whom."""
    recorder = DecisionRecorder(cfg, org_rules(cfg), kind="reassign")
    recorder.seat_pick(cur.lead_id, team.name, team.epoch, choice.seats)
    recorder.picked(cur.lead_id, team.name, choice.member_id, None)
    recorder.detail(cur.lead_id).update(
        {
            **detail,
            "from": {
                "member_id": cur.member_id,
                "crm_user_id": cur.crm_user_id,
                "name": cur.owner_name,
                "team": cur.team,
            },
            "superseded_writes": int(row.superseded),
            "outbox_id": int(row.id),
            "replaces_owners": list(row.replaces_owners),
        }
    )
    recorder.flush(conn)


def _reassign_in(
    conn: Connection,
    cfg: OrgConfig,
    crm_id: str,
    to: str | None,
    reason: Reason,
    note: str | None,
    expect_owner: str | None,
    force: bool,
) -> Moved:
    cur = _lock_current(conn, cfg, crm_id, expect_owner)
    rep: Rep | None = None
    if to is not None:
        rep = resolve_rep(conn, cfg, to, cur.team_id)
        if rep.crm_user_id == cur.crm_user_id:
            raise ReassignError(f"lead {crm_id} is already owned by {rep.crm_user_id}")
    team_id = rep.team_id if rep is not None else cur.team_id
    locked_teams = conn.execute(
        _SQL["lock_teams_by_id"], {"team_ids": sorted({team_id, cur.team_id})}
    ).all()
    team = next(t for t in locked_teams if t.id == team_id)
    if rep is None:
        choice = _by_rotation(conn, cfg, crm_id, team, cur, datetime.now(UTC))
    else:
        choice = _to_rep(conn, cfg, crm_id, team, cur, rep, force)
    row = conn.execute(
        _SQL["move_assignment"],
        {
            "assignment_id": cur.id,
            "lead_id": cur.lead_id,
            "team_id": team_id,
            "member_id": choice.member_id,
            "epoch": team.epoch,
            "reason": reason,
            "note": note,
            "old_owner": cur.crm_user_id,
        },
    ).one()
    conn.execute(
        _SQL["count_turns"],
        {
            "member_id": choice.member_id,
            "credit_ids": choice.credit_ids,
            "credit_ns": choice.credit_ns,
            "day": choice.when.day,
            "week": choice.when.week,
        },
    )
    detail = {"reason": reason, "note": note, "mode": "to" if rep is not None else "rotate"}
    _record_decision(conn, cfg, cur, team, choice, row, detail)
    log.info(
        "org %s: lead %s reassigned (%s) from member %d to member %d",
        cfg.org,
        crm_id,
        reason,
        cur.member_id,
        choice.member_id,
    )
    return Moved(
        crm_id,
        cur.crm_user_id,
        choice.crm_user_id,
        choice.name,
        team.name,
        reason,
        int(row.id),
        int(row.superseded),
        tuple(row.replaces_owners),
    )


@dataclass
class Deactivation:
    rep: str
    teams: list[str]
    moved: list[Moved]
    left: list[tuple[str, str]]  # (crm_id, why it was not re-routed)


def deactivate_rep(engine: Engine, cfg: OrgConfig, rep: str, reroute: bool) -> Deactivation:
    """Make ``rep`` inactive in every team of the org (a new epoch for each, as a config edit
    would); with ``reroute``, re-route their leads whose owner write was not sent yet."""
    with engine.begin() as conn:
        conn.execute(_TEAMS["lock_org"], {"org": cfg.org})
        rows = conn.execute(
            _SQL["rep_candidates"], {"org": cfg.org, "rep": rep, "rep_key": _rep_key(cfg, rep)}
        ).all()
        if not rows:
            raise ReassignError(f"rep {rep!r} is not a member of org {cfg.org!r}")
        users = sorted({r.crm_user_id for r in rows})
        if len(users) > 1:
            raise ReassignError(
                f"rep {rep!r} names several reps of org {cfg.org!r} ({', '.join(users)}): "
                "give the crm_user_id"
            )
        # the teams' locks before their members' rows, in name order as routers and config
        # applies take them: a lead being assigned holds its team's lock and then updates
        # the members, so the other order could deadlock
        conn.execute(
            _SQL["lock_teams_by_id"],
            {"team_ids": sorted({r.team_id for r in rows if r.crm_user_id == users[0]})},
        ).all()
        changed = conn.execute(
            _SQL["deactivate_member"], {"org": cfg.org, "crm_user_id": users[0]}
        ).all()
        was_active = {r.team_id for r in rows if r.active}
        for r in changed:
            if r.team_id in was_active:
                conn.execute(_SQL["restart_epoch_edited"], {"team_id": r.team_id})
    result = Deactivation(users[0], sorted({r.team for r in changed}), [], [])
    if reroute:
        moved, left = reroute_inactive(engine, cfg, users[0])
        result.moved, result.left = moved, left
    return result


def reroute_inactive(
    engine: Engine, cfg: OrgConfig, crm_user_id: str | None = None
) -> tuple[list[Moved], list[tuple[str, str]]]:
    """Re-route leads owned by inactive reps (or one of them) whose write was not sent."""
    with engine.connect() as conn:
        rows = conn.execute(
            _SQL["unsent_of_inactive"], {"org": cfg.org, "crm_user_id": crm_user_id}
        ).all()
    moved: list[Moved] = []
    left: list[tuple[str, str]] = []
    for r in rows:
        try:
            moved.append(
                reassign_lead(
                    engine, cfg, r.crm_id, reason="rep_deactivated", expect_owner=r.crm_user_id
                )
            )
        except ReassignError as exc:
            left.append((r.crm_id, str(exc)))
    return moved, left


MAX_NOTE = 500


def check_reassign_args(
    engine: Engine,
    cfg: OrgConfig,
    crm_ids: Sequence[str],
    to: str | None,
    note: str | None,
    force: bool = False,
) -> None:
    """Refuse bad input before any lead is touched (ReassignError says why), and ``--to`` a
    rep who cannot take a lead now unless ``force``."""
    if note is not None and (len(note) > MAX_NOTE or not note.isprintable()):
        raise ReassignError(f"--reason must be printable text of at most {MAX_NOTE} characters")
    for crm_id in crm_ids:
        if not crm_id.strip() or len(crm_id) > 64 or not crm_id.isprintable():
            raise ReassignError(f"{crm_id!r} is not a CRM id")
    if to is not None:
        check_rep(engine, cfg, to)
        if not force:
            check_target(engine, cfg, crm_ids, to, datetime.now(UTC))
