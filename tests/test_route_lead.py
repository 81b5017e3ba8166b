"""The router's server calls (``route_new_lead``, ``route_team``; connector/routing/calls.py) on
real Postgres.

* A call reads the members AFTER it waits for the team lock, with a fresh snapshot (the
  functions are VOLATILE), so a waiter sees what the lock holder committed: counts, members
  added, time off set, a team retired (nothing of its lead is kept).
* A sequence of leads one call at a time (``route_new_lead``) and as batches of one through the
  batch's plan (``route_team``) leaves the same outcomes, decisions, counts and caps
  counters. (tests/test_rotation_sql.py holds the server's picks to ``pick_available``.)
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, text

import db
from connector.core.config import OrgConfig
from connector.core.config_loading import parse_config
from connector.routing.assign import Lead, Outcome, Router, RoutingError
from connector.routing.calls import TraceCache, config_blocked, team_inputs
from connector.routing.decisions import expand, trace_rules
from connector.routing.reassign import deactivate_rep, reassign_lead
from connector.routing.rules import compile_rules
from connector.routing.teams import apply_teams
from connector.shell.reps import resolve_rep, set_away
from connector.shell.store import make_engine
from testbed.pg import DatabaseFactory
from tests.helpers.blocking import in_thread, wait_until_blocked
from tests.helpers.clocks import WallClock
from tests.helpers.routing_state import (
    ENV,
    HEADER,
    MONDAY,
    decisions_by_lead,
    outcome_row,
    routing_state,
)


def org(extra: str = "", p_extra: str = "") -> OrgConfig:
    return parse_config(
        HEADER
        + f"""teams:
  - name: a
    timezone: Europe/Berlin
    caps: {{per_day: 4}}
    sla: {{minutes: 30, status_field: Status, initial: [New]}}
    members:
      - {{crm_user_id: "005A", name: Ada, weight: 2}}
      - {{crm_user_id: "005B", name: Bob, caps: {{per_day: 3, per_week: 5}},
         hours: {{timezone: America/New_York, mon-fri: "09:00-17:30"}}}}
      - {{crm_user_id: "005C", name: Cy,
         time_off: [{{from: "2026-12-07T15:00", until: "2026-12-07T18:00"}}]}}
      - {{crm_user_id: "005D", name: Di, active: false}}
  - name: k
    catch_up: {{max_in_a_row: 2}}
    members:
      - {{crm_user_id: "005E", name: Eve}}
      - {{crm_user_id: "005F", name: Fay, weight: 3}}
      - {{crm_user_id: "005G", name: Gus}}
  - name: p
    sla: {{minutes: 15, status_field: Status, initial: [New]}}
    members:
      - {{crm_user_id: "005H", name: Hal, weight: 2}}
      - {{crm_user_id: "005I", name: Ida}}
      - {{crm_user_id: "005J", name: Jo, active: false}}
      - {{crm_user_id: "005K", name: Kim}}
      - {{crm_user_id: "005L", name: Lou,
         hours: {{timezone: Europe/Berlin, mon-fri: "09:00-17:00"}}}}{p_extra}
{extra}
rules:
  - {{name: catch, team: k, when: {{Country: DE}}}}
  - {{name: plain, team: p, when: {{Country: FR}}}}
  - {{name: rest, team: a}}
""",
        "t.yaml",
        ENV,
    )


def _decision_of(c: Connection, crm_id: str) -> dict[str, Any]:
    """The routing decision recorded for the lead with this CRM id."""
    detail: dict[str, Any] = c.execute(
        text(
            "SELECT d.detail FROM decision_details d JOIN leads l "
            "ON l.id = d.lead_id WHERE l.crm_id = :crm_id"
        ),
        {"crm_id": crm_id},
    ).scalar_one()
    return detail


def _assign_one(
    engine: Engine, r: Router, lead: Lead, in_transaction: bool, got: list[Outcome]
) -> None:
    """Assign ``lead`` as ``Router.assign`` does (autocommit) or inside a transaction of the
    caller's (``assign_in``, as the inbox and the poller do); its outcome goes to ``got``."""
    if in_transaction:
        with engine.begin() as c:
            got.extend(r.assign_in(c, [lead], "api"))
    else:
        got.append(r.assign(lead, "api"))


def _behind_a_holder(
    engine: Engine,
    r: Router,
    held: Lead,
    waiting: Lead,
    function: str,
    meanwhile: Callable[[Connection], object] | None = None,
    in_transaction: bool = False,
) -> tuple[Outcome, Outcome]:
    """``held`` is assigned in a transaction left open, so it holds its team's lock, while
    ``waiting`` is assigned in a thread (``_assign_one``: by ``Router.assign``, or in a
    transaction of its own) until its call of ``function`` waits for that lock; then
    ``meanwhile`` runs on the holder's connection, the holder commits, and both outcomes are
    returned (what the waiter raised is raised here)."""
    got: list[Outcome] = []
    errors: list[BaseException] = []
    with engine.connect() as holder:
        holder.begin()
        first = r.assign_in(holder, [held], "api")[0]
        waiter = in_thread(lambda: _assign_one(engine, r, waiting, in_transaction, got), errors)
        wait_until_blocked(engine, f"%FROM {function}(%")
        if meanwhile is not None:
            meanwhile(holder)
        holder.commit()
        waiter.join(timeout=30)
    if errors:
        raise errors[0]
    return first, got[0]


def test_a_waiter_reads_what_the_lock_holder_committed(engine: Engine) -> None:
    """The first call holds the team lock in an open transaction while a second call waits
    for it. Read with the snapshot the waiter's statement started with, the team would still
    have handed out no lead; with a fresh snapshot the waiter sees the first pick."""
    cfg = org()
    apply_teams(engine, cfg)
    r = Router(engine, cfg, clock=WallClock(MONDAY))
    first, second = _behind_a_holder(
        engine,
        r,
        Lead("00Qw1", {"Country": "DE"}),
        Lead("00Qw2", {"Country": "DE"}),
        "route_new_lead",
    )
    # Fay (weight 3 of 5) is owed both of the first two leads
    assert (first.owner_id, second.status, second.owner_id) == ("005F", "assigned", "005F")
    with engine.connect() as c:
        detail = _decision_of(c, "00Qw2")
        who = {r.id: (r.crm_user_id, r.name) for r in c.execute(text("SELECT * FROM members"))}
        chosen = expand(detail, who)["chosen"]
        counts = dict(c.execute(text("SELECT crm_user_id, assigned_in_epoch FROM members")).all())
    assert (chosen["count_before"], chosen["team_total_before"]) == (1, 1)
    assert counts["005F"] == 2


def _one_lead_batches(r: Router) -> None:
    """Every lead of ``r`` through the batch's plan (``route_team``), never ``route_new_lead``."""
    r._single_params = lambda lead, source: None  # type: ignore[method-assign]


def _run(engine: Engine, path: str) -> tuple[list[tuple[Any, ...]], Any, Any]:
    cfg = org()
    # Max was in team p and is dropped: his row stays (in_config false), never a seat
    apply_teams(engine, org(p_extra='\n      - {crm_user_id: "005M", name: Max}'))
    apply_teams(engine, cfg)
    clock = WallClock(MONDAY)
    r = Router(engine, cfg, clock=clock)
    if path == "batch":
        _one_lead_batches(r)
    outcomes: list[Outcome] = []
    for i in range(70):
        if i == 20:  # time off set from the command line, read under the lock
            for name, hours in (("Ada", 3), ("Eve", 2), ("Hal", 2)):
                set_away(
                    engine,
                    cfg,
                    resolve_rep(cfg, name),
                    clock.at + timedelta(hours=hours),
                    None,
                    clock.at,
                )
        country = ("DE", "FR", "US", "US")[i % 4]
        outcomes.append(r.assign(Lead(f"00Qs{i:03d}", {"Country": country}), "api"))
        if i % 10 == 5:  # a repeat
            outcomes.append(r.assign(Lead(f"00Qs{i - 1:03d}", {"Country": country}), "api"))
        clock.at += timedelta(minutes=23)
    with engine.connect() as c:
        users = dict(c.execute(text("SELECT id, crm_user_id FROM members")).all())
    return (
        [outcome_row(o, users) for o in outcomes],
        decisions_by_lead(engine),
        routing_state(engine),
    )


def test_single_call_and_batch_plan_record_the_same(databases: DatabaseFactory) -> None:
    """The same leads one ``route_new_lead`` call each and as batches of one (insert, then
    ``route_team``): the same outcomes, decisions, counts, caps counters, assignments and
    outbox rows, with every policy of the scenario deciding some lead."""
    engines = [make_engine(databases.new(), pool_size=2) for _ in range(2)]
    try:
        single = _run(engines[0], "single")
        batch = _run(engines[1], "batch")
    finally:
        for e in engines:
            e.dispose()
    assert single[0] == batch[0]
    statuses = {o[1] for o in single[0]}
    assert statuses == {"assigned", "unassigned", "duplicate"}, statuses
    reasons = {o[5] for o in single[0] if o[1] == "unassigned"}
    skips = {r for o in single[0] for _, r in o[6]}
    assert {"away", "off_shift", "capped", "inactive"} <= skips, skips
    assert reasons, "the scenario should leave some lead unassigned"
    assert single[1] == batch[1]
    assert single[2] == batch[2]


@pytest.mark.parametrize("single", [True, False], ids=["single call", "general path"])
def test_a_repeat_is_a_duplicate_even_when_its_team_left_the_database(
    engine: Engine, single: bool
) -> None:
    """A repeat of a stored lead answers with its stored outcome on both paths, even when
    the process's config routes to a team the database no longer has in its config (the
    general path never looks at a known lead's team); a new lead for that team is refused
    with RoutingError and nothing of it is stored."""
    cfg = org()
    apply_teams(engine, cfg)
    r = Router(engine, cfg, clock=WallClock(MONDAY))
    if not single:
        _one_lead_batches(r)
    first = r.assign(Lead("00Qgone01", {"Country": "US"}), "api")
    assert first.status == "assigned"
    with engine.begin() as c:
        c.execute(text("UPDATE teams SET in_config = false WHERE name = 'a'"))
    again = r.assign(Lead("00Qgone01", {"Country": "US"}), "api")
    assert (again.status, again.team, again.owner_id) == ("duplicate", "a", first.owner_id)
    with pytest.raises(RoutingError, match="is not in the database"):
        r.assign(Lead("00Qgone02", {"Country": "US"}), "api")
    with engine.connect() as c:
        assert c.execute(text("SELECT crm_id FROM leads ORDER BY id")).scalars().all() == [
            "00Qgone01"
        ]


CATCH_UP = (
    HEADER
    + """teams:
  - name: j
    catch_up: {max_in_a_row: 1}
    members:
      - {crm_user_id: "005P", name: Pat}
      - {crm_user_id: "005Q", name: Quinn}
      - {crm_user_id: "005R", name: Rae}
rules:
  - {name: all, team: j}
"""
)


def _catch_up_owners(engine: Engine, single: bool) -> list[str | None]:
    cfg = parse_config(CATCH_UP, "j.yaml", ENV)
    apply_teams(engine, cfg)
    clock = WallClock(MONDAY)
    r = Router(engine, cfg, clock=clock)
    if not single:
        _one_lead_batches(r)
    set_away(engine, cfg, resolve_rep(cfg, "Rae"), clock.at + timedelta(hours=1), None, clock.at)
    owners = []
    for i in range(12):
        if i == 6:  # Rae is back, two turns behind
            clock.at += timedelta(hours=1)
        owners.append(r.assign(Lead(f"00Qj{i:03d}", {}), "api").owner_id)
        clock.at += timedelta(minutes=5)
    return owners


def test_the_single_call_reads_catch_ups_latest_owners(databases: DatabaseFactory) -> None:
    """catch_up {max_in_a_row: 1}: Rae comes back two turns behind and makes them up one
    lead at a time, never twice in a row, one call a lead as in batches of one."""
    got = []
    for single in (True, False):
        engine = make_engine(databases.new(), pool_size=2)
        try:
            got.append(_catch_up_owners(engine, single))
        finally:
            engine.dispose()
    assert got[0] == got[1]
    back = got[0][6:]
    assert back == ["005R", "005P", "005R", "005Q", "005R", "005P"], back


def _lead_rows(engine: Engine) -> dict[str, int]:
    with engine.connect() as c:
        return {
            t: c.execute(text(f"SELECT count(*) FROM {t}")).scalar_one()
            for t in ("leads", "assignments", "outbox", "routing_decisions")
        }


def test_a_batch_waiting_for_the_lock_reads_what_the_holder_committed(engine: Engine) -> None:
    """A batch's ``route_team`` call waits for the team lock, then reads the members in a new
    statement, with a snapshot taken under the lock. The holder's pick (Hal, weight 2 of 4)
    is committed while the batch waits: read with a snapshot from before the wait, Hal would
    be owed the first lead again; read after it, Ida and Kim are owed the batch's two."""
    cfg = org()
    apply_teams(engine, cfg)
    r = Router(engine, cfg, clock=WallClock(MONDAY))
    got: list[list[Outcome]] = []
    errors: list[BaseException] = []
    with engine.connect() as holder:
        holder.begin()
        first = r.assign_in(holder, [Lead("00Qpw1", {"Country": "FR"})], "api")[0]
        batch = [Lead("00Qpw2", {"Country": "FR"}), Lead("00Qpw3", {"Country": "FR"})]
        waiter = in_thread(lambda: got.append(r.assign_many(batch, "api")), errors)
        wait_until_blocked(engine, "%FROM route_team(%")
        holder.commit()
        waiter.join(timeout=30)
    assert errors == []
    assert first.owner_id == "005H"
    # Hal (2), Ida, Kim and Lou (1 each): after Hal's first lead, Ida's turn, then Hal's
    assert [o.owner_id for o in got[0]] == ["005I", "005H"]
    with engine.connect() as c:
        counts = dict(c.execute(text("SELECT crm_user_id, assigned_in_epoch FROM members")).all())
        detail = _decision_of(c, "00Qpw2")
    assert (counts["005H"], counts["005I"], counts["005K"]) == (2, 1, 0)
    assert detail["seats"]["counts"][:3] == [1, 0, 0]  # Hal, Ida, Kim as the batch saw them


@pytest.mark.parametrize("in_transaction", [False, True], ids=["autocommit", "in a transaction"])
def test_a_call_reads_a_team_that_changed_while_it_waited(
    engine: Engine, in_transaction: bool
) -> None:
    """A config apply may add members while a lead waits for its team's lock, which a
    snapshot taken before the wait cannot see. route_team reads the members in a statement
    of its own, with a fresh snapshot taken under the lock, so it decides
    among every member: the new one (Lee) is a candidate, and the lead is stored once. In
    the caller's transaction (the inbox's, the poller's) that transaction goes on and
    commits."""
    cfg = org()
    apply_teams(engine, cfg)
    r = Router(engine, cfg, clock=WallClock(MONDAY))
    got: list[Outcome] = []
    with engine.connect() as holder:
        holder.begin()
        team_id = holder.execute(
            text("UPDATE teams SET in_config = true WHERE name = 'p' RETURNING id")
        ).scalar_one()
        holder.execute(
            text(
                "INSERT INTO members (team_id, crm_user_id, name, weight, active, position) "
                "VALUES (:t, '005N', 'Lee', 5, true, 9)"
            ),
            {"t": team_id},
        )
        lead = Lead("00Qpc1", {"Country": "FR"})
        waiter = threading.Thread(target=_assign_one, args=(engine, r, lead, in_transaction, got))
        waiter.start()
        wait_until_blocked(engine, "%FROM route_new_lead(%")
        holder.commit()
        waiter.join(timeout=30)
    with engine.connect() as c:
        users = dict(c.execute(text("SELECT id, crm_user_id FROM members")).all())
    # Lee (weight 5 of 9) is owed the first lead of the rotation
    assert (got[0].status, got[0].owner_id) == ("assigned", "005N")
    assert "005N" in {users[m] for m, _ in got[0].candidates}
    assert _lead_rows(engine) == {
        "leads": 1,
        "assignments": 1,
        "outbox": 1,
        "routing_decisions": 1,
    }


@pytest.mark.parametrize("in_transaction", [False, True], ids=["autocommit", "in a transaction"])
def test_a_call_sees_a_rep_who_went_away_while_it_waited(
    engine: Engine, in_transaction: bool
) -> None:
    """Time off stored while the lead waits for its team's lock (here by a writer that does
    not take the team's lock, as `connector rep away` does): the call reads it under the
    lock and decides the lead with Ida away: Hal again (weight 2), not Ida, who was owed it.
    The lead is stored once, in autocommit and in the caller's transaction."""
    cfg = org()
    apply_teams(engine, cfg)
    r = Router(engine, cfg, clock=WallClock(MONDAY))
    time_off = text(
        "INSERT INTO rep_time_off (org, crm_user_id, starts_at, until) "
        "VALUES ('acme', '005I', :start, :until)"
    )
    first, second = _behind_a_holder(
        engine,
        r,
        Lead("00Qpt1", {"Country": "FR"}),
        Lead("00Qpt2", {"Country": "FR"}),
        "route_new_lead",
        lambda holder: holder.execute(
            time_off, {"start": MONDAY - timedelta(hours=1), "until": MONDAY + timedelta(hours=1)}
        ),
        in_transaction,
    )
    assert first.owner_id == "005H"
    assert (second.status, second.owner_id) == ("assigned", "005H")
    assert _lead_rows(engine) == {
        "leads": 2,
        "assignments": 2,
        "outbox": 2,
        "routing_decisions": 2,
    }


@pytest.mark.parametrize("in_transaction", [False, True], ids=["autocommit", "in a transaction"])
def test_a_lead_whose_team_was_retired_while_it_waited_is_not_stored(
    engine: Engine, in_transaction: bool
) -> None:
    """A config apply retires the team (in_config false) while a lead waits for its lock:
    route_team's lock finds no team and writes nothing, route_new_lead deletes the lead row it
    stored, and the Router says so. Nothing of the lead is left, in autocommit and in the
    caller's transaction."""
    cfg = org()
    apply_teams(engine, cfg)
    r = Router(engine, cfg, clock=WallClock(MONDAY))
    with pytest.raises(RoutingError, match="not in the database"):
        _behind_a_holder(
            engine,
            r,
            Lead("00Qpr1", {"Country": "FR"}),
            Lead("00Qpr2", {"Country": "FR"}),
            "route_new_lead",
            lambda holder: holder.execute(
                text("UPDATE teams SET in_config = false WHERE name = 'p'")
            ),
            in_transaction,
        )
    assert _lead_rows(engine) == {
        "leads": 1,
        "assignments": 1,
        "outbox": 1,
        "routing_decisions": 1,
    }


def test_a_team_without_active_members_leaves_its_lead_unassigned(engine: Engine) -> None:
    """No active member: the lead is recorded unassigned with its reason, once."""
    cfg = org()
    apply_teams(engine, cfg)
    with engine.begin() as c:
        c.execute(
            text(
                "UPDATE members SET active = false "
                "WHERE team_id = (SELECT id FROM teams WHERE name = 'p')"
            )
        )
    r = Router(engine, cfg, clock=WallClock(MONDAY))
    got = r.assign(Lead("00Qpn1", {"Country": "FR"}), "api")
    assert (got.status, got.reason) == ("unassigned", "no_active_member")
    assert _lead_rows(engine) == {
        "leads": 1,
        "assignments": 0,
        "outbox": 0,
        "routing_decisions": 1,
    }
    with engine.connect() as c:
        reason = c.execute(text("SELECT unassigned_reason FROM leads")).scalar_one()
    assert reason == "no_active_member"


def test_a_deactivation_takes_the_team_lock_before_the_members(engine: Engine) -> None:
    """A lead being assigned holds its team's lock, then updates a member. `connector rep
    deactivate` used to update the member row first and take the team lock after: with a
    lead in between, each waited for the other (a deadlock, one of them aborted). Now the
    deactivation waits for the team lock first, and both finish."""
    cfg = org()
    apply_teams(engine, cfg)
    r = Router(engine, cfg, clock=WallClock(MONDAY + timedelta(hours=7)))
    errors: list[BaseException] = []
    with engine.connect() as holder:
        holder.begin()
        first = r.assign_in(holder, [Lead("00Qpd1", {"Country": "FR"})], "api")[0]
        worker = in_thread(lambda: deactivate_rep(engine, cfg, "Ida", reroute=False), errors)
        wait_until_blocked(engine)  # the deactivation waits for a lock
        # Ida is owed the next lead: this updates her row, which the old order had locked
        second = r.assign_in(holder, [Lead("00Qpd2", {"Country": "FR"})], "api")[0]
        holder.commit()
        worker.join(timeout=30)
    assert errors == []
    assert (first.owner_id, second.owner_id) == ("005H", "005I")
    with engine.connect() as c:
        active = c.execute(text("SELECT active FROM members WHERE crm_user_id = '005I'")).scalar()
    assert active is False


def test_rep_away_waits_for_the_leads_already_waiting_for_its_team(engine: Engine) -> None:
    """`connector rep away` writes the rep's team rows before the time off, so it commits
    only after the leads already waiting for the team lock, never while one of them waits
    with a snapshot that cannot see it. Once it has returned, no lead goes to the rep."""
    cfg = org()
    apply_teams(engine, cfg)
    clock = WallClock(MONDAY)
    r = Router(engine, cfg, clock=clock)
    done = threading.Event()

    def away() -> None:
        set_away(
            engine, cfg, resolve_rep(cfg, "Ida"), clock.at + timedelta(hours=1), None, clock.at
        )
        done.set()

    setter = threading.Thread(target=away)

    def meanwhile(_holder: Connection) -> None:
        setter.start()
        # the time off is not stored while the lead waits for the team lock
        assert not done.wait(1.0)

    held, waiting = Lead("00Qpa1", {"Country": "FR"}), Lead("00Qpa2", {"Country": "FR"})
    first, second = _behind_a_holder(engine, r, held, waiting, "route_new_lead", meanwhile)
    setter.join(timeout=30)
    assert done.is_set()
    # the waiting lead was decided before the time off, as its place in the queue says
    assert (first.owner_id, second.owner_id) == ("005H", "005I")
    later = [r.assign(Lead(f"00Qpa{i}", {"Country": "FR"}), "api") for i in range(3, 7)]
    assert "005I" not in {o.owner_id for o in later}


def team_of_two(member: str, team_keys: str = "") -> OrgConfig:
    """An org whose one team t has ``member`` (YAML) and Bo, with ``team_keys`` added."""
    return parse_config(
        HEADER
        + f"""teams:
  - name: t
    {team_keys}
    members:
      - {member}
      - {{crm_user_id: "005B", name: Bo}}
rules:
  - {{name: all, team: t}}
""",
        "t.yaml",
        ENV,
    )


@pytest.mark.parametrize(
    ("member", "unscheduled"),
    [
        ('{crm_user_id: "005A", name: Ada}', True),
        ('{crm_user_id: "005A", name: Ada, hours: {timezone: UTC, mon-fri: "09:00-17:00"}}', False),
        (
            '{crm_user_id: "005A", name: Ada, time_off: [{from: 2026-12-07, until: 2026-12-09}]}',
            False,
        ),
    ],
    ids=["neither", "hours", "time off"],
)
def test_only_a_team_without_hours_or_time_off_skips_judging_them(
    member: str, unscheduled: bool
) -> None:
    """A team whose members have no working hours and no time off in the config is never
    blocked by it (config_blocked answers without looking); any other is judged at ``now``."""
    inputs = team_inputs(team_of_two(member).teams[0])
    assert inputs.unscheduled is unscheduled
    evening = MONDAY.replace(hour=20)  # after 17:00, inside the time off
    ada = None if unscheduled else "off_shift" if "hours" in member else "away"
    assert config_blocked(inputs, evening) == [ada, None]


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"Country": "US"},
        {"Country": "DE", "Other": "x"},
        {"Country": ["US"]},  # not hashable: built each time
        {"Country": True},
        {"Country": 1},
        {"Country": 'Zürich \u2028 "q"'},
    ],
    ids=["none", "US", "DE", "list", "true", "one", "escapes"],
)
def test_a_single_leads_decision_starts_as_json_dumps_would_write_it(
    fields: dict[str, Any],
) -> None:
    """TraceCache keeps the start of the decision's JSON text by source and the values the
    rules look at, and adds the instant: the text is json.dumps' own, byte for byte, for
    every lead (1 and True are equal dict keys, not equal traces)."""
    cfg = parse_config(
        HEADER
        + """teams:
  - name: t
    members:
      - {crm_user_id: "005A", name: Ada}
rules:
  - {name: us, team: t, when: {Country: [US, "1"]}}
  - {name: all, team: t}
""",
        "t.yaml",
        ENV,
    )
    rules = compile_rules(cfg.rules)
    cache = TraceCache(rules, size=3)
    for f in ({"Country": 1}, {"Country": True}, fields, {"Country": "US"}, fields):
        for source in ("api", "poll"):
            tried, values = trace_rules(rules, f)
            want = {
                "source": source,
                "rules": tried,
                "values": values,
                "at": MONDAY.isoformat(),
                "team": "t",
            }
            assert cache.detail(source, f, MONDAY, '"team": "t"') == json.dumps(want)
    assert len(cache._text) <= 3  # bounded
    long = {"Country": "x" * 5000}  # a trace this long is written, not kept
    cache._text.clear()
    tried, values = trace_rules(rules, long)
    want = {"source": "api", "rules": tried, "values": values, "at": MONDAY.isoformat(), "n": 1}
    assert cache.detail("api", long, MONDAY, '"n": 1') == json.dumps(want) and not cache._text


OVERFLOW = """
  - name: b
    overflow_team: a
    members:
      - {crm_user_id: "005A", name: Ada}
      - {crm_user_id: "005O", name: Oz}
"""


@pytest.mark.parametrize("command", ["rep away", "rep deactivate"])
def test_rep_commands_lock_the_reps_teams_in_name_order(engine: Engine, command: str) -> None:
    """Ada is in teams a and b, and b overflows into a. Routers and config applies lock
    teams in name order: a router holding a's lock may go on to lock b. A command that
    locked b first (a team before the one it overflows into) and then waited for a would
    deadlock with it; in name order it waits for a, holding nothing, and both finish."""
    cfg = org(extra=OVERFLOW)
    apply_teams(engine, cfg)
    errors: list[BaseException] = []

    def run() -> None:
        if command == "rep away":
            ada = resolve_rep(cfg, "Ada")
            set_away(engine, cfg, ada, MONDAY + timedelta(hours=1), None, MONDAY)
        else:
            deactivate_rep(engine, cfg, "Ada", reroute=False)

    lock = text("SELECT id FROM teams WHERE org = 'acme' AND name = :name FOR UPDATE")
    with engine.connect() as holder:
        holder.begin()
        holder.execute(lock, {"name": "a"}).one()
        worker = in_thread(run, errors)
        wait_until_blocked(engine)
        holder.execute(lock, {"name": "b"}).one()
        holder.commit()
        worker.join(timeout=30)
    assert errors == []


def test_rep_away_waits_for_a_config_apply(engine: Engine) -> None:
    """A config apply holds the org's lock, locks its teams in name order and then the teams
    it retires (here a, after b). `rep away` for Ada (in a and b) takes the org's lock first:
    had it locked a and waited for b, the apply's lock of a would deadlock with it."""
    cfg = org(extra=OVERFLOW)
    apply_teams(engine, cfg)
    errors: list[BaseException] = []
    ada = resolve_rep(cfg, "Ada")
    lock = text("SELECT id FROM teams WHERE org = 'acme' AND name = :name FOR UPDATE")
    with engine.connect() as apply:
        apply.begin()
        apply.execute(text(db.queries("teams")["lock_org"]), {"org": "acme"})
        apply.execute(lock, {"name": "b"}).one()
        worker = in_thread(
            lambda: set_away(engine, cfg, ada, MONDAY + timedelta(hours=1), None, MONDAY), errors
        )
        wait_until_blocked(engine)
        apply.execute(lock, {"name": "a"}).one()  # as retire_teams would
        apply.commit()
        worker.join(timeout=30)
    assert errors == []


def test_a_reassignment_to_another_team_locks_both_teams_in_name_order(engine: Engine) -> None:
    """`connector reassign --to` a rep of another team locks the new team, and the history
    insert's foreign key share-locks the lead's current team. New team b after current team
    a, against `rep away` for Ada (in a and b, locked in name order), was a deadlock: the
    reassignment held b and waited for a, the rep command held a and waited for b. Both
    teams are now locked in name order first."""
    cfg = org(extra=OVERFLOW)
    apply_teams(engine, cfg)
    r = Router(engine, cfg, clock=WallClock(MONDAY + timedelta(hours=7)))
    assert r.assign(Lead("00Qrr1", {"Country": "US"}), "api").team == "a"
    errors: list[BaseException] = []
    lock = text("SELECT id FROM teams WHERE org = 'acme' AND name = 'b' FOR UPDATE")
    with engine.connect() as holder:  # b is busy: the reassignment queues for it first
        holder.begin()
        holder.execute(lock).one()
        mover = in_thread(
            lambda: reassign_lead(engine, cfg, "00Qrr1", to="Oz", reason="reassigned"), errors
        )
        wait_until_blocked(engine)
        ada = resolve_rep(cfg, "Ada")
        away = in_thread(
            lambda: set_away(engine, cfg, ada, MONDAY + timedelta(hours=9), None, MONDAY), errors
        )
        wait_until_blocked(engine, sessions=2)
        holder.commit()
        mover.join(timeout=30)
        away.join(timeout=30)
    assert errors == []
    with engine.connect() as c:
        owner = c.execute(text("SELECT crm_user_id FROM assignments")).scalar_one()
    assert owner == "005O"
