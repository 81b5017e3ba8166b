"""The single-lead call (migrations 0014 and 0019, connector/routing/single.py) on real Postgres.

* ``rotation_pick`` (plpgsql) picks exactly as ``pick_available`` does (the Python reference),
  checked with Hypothesis over random teams, availability, caps and catch-up, pick by pick;
  ``rotation_pick_plain`` (SQL, for a team with nothing blocked or capped and no catch-up)
  returns exactly what ``rotation_pick`` returns there.
* ``route_lead`` reads the members AFTER it waits for the team lock with a fresh snapshot
  (the function is VOLATILE), so a waiter sees what the lock holder committed.
* A sequence of leads through the single call and through the general path (the Router
  without single teams) leaves the same outcomes, decisions, counts and caps counters.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Connection, Engine, text

import db
from connector.core.config import OrgConfig, parse_config
from connector.routing import assign as assign_module
from connector.routing.assign import Lead, Outcome, Router, RoutingError
from connector.routing.decisions import expand, trace_rules
from connector.routing.reassign import deactivate_rep, reassign_lead
from connector.routing.rotation import Seat, pick_available
from connector.routing.rules import compile_rules
from connector.routing.single import TraceCache, config_blocked, team_inputs
from connector.routing.teams import apply_teams
from connector.shell.reps import resolve_rep, set_away
from connector.shell.store import make_engine
from testbed.pg import DatabaseFactory
from tests.helpers.clocks import WallClock

ENV = {"TOKEN": "unused"}
MONDAY = datetime(2026, 12, 7, 13, 0, tzinfo=UTC)
# every test config's org and CRM
HEADER = """
org: acme
crm:
  kind: salesforce
  instance_url: https://x.my.salesforce.com
  auth: {method: session, access_token: "${TOKEN}"}
"""

PICK = text(
    "SELECT member_id, cand_ids, cand_skips, credit_ids, credit_ns FROM rotation_pick("
    "CAST(:ids AS bigint[]), CAST(:weights AS integer[]), CAST(:turns AS bigint[]), "
    "CAST(:positions AS integer[]), CAST(:blocked AS text[]), CAST(:room AS integer[]), "
    "CAST(:k AS integer), CAST(:recent AS bigint[]))"
)


@st.composite
def team_states(draw: st.DrawFn) -> dict[str, Any]:
    n = draw(st.integers(0, 6))
    ids = [100 + i for i in range(n)]
    return {
        "ids": ids,
        "weights": draw(st.lists(st.integers(1, 5), min_size=n, max_size=n)),
        "turns": draw(st.lists(st.integers(0, 12), min_size=n, max_size=n)),
        "positions": draw(st.permutations(list(range(n)))),
        "blocked": draw(
            st.lists(st.sampled_from([None, None, "away", "off_shift"]), min_size=n, max_size=n)
        ),
        "room": draw(st.lists(st.sampled_from([None, None, 0, 1, 2]), min_size=n, max_size=n)),
        "k": draw(st.sampled_from([None, 1, 2, 3])),
        "recent": draw(st.lists(st.sampled_from(ids), max_size=4)) if ids else [],
    }


def python_pick(s: dict[str, Any]) -> tuple[int | None, list[tuple[int, str | None]], dict]:
    seats = [
        Seat(i, w, t, p)
        for i, w, t, p in zip(s["ids"], s["weights"], s["turns"], s["positions"], strict=True)
    ]
    blocked = {i: b for i, b in zip(s["ids"], s["blocked"], strict=True) if b}
    room = dict(zip(s["ids"], s["room"], strict=True))
    picks = pick_available(seats, blocked, room, 1, max_in_a_row=s["k"], recent=s["recent"])
    turn = picks.turns[0]
    return turn.member_id, list(turn.candidates), picks.credited


def sql_pick(conn: Connection, s: dict[str, Any]) -> tuple[int | None, list, dict]:
    r = conn.execute(PICK, s).one()
    return (
        r.member_id,
        list(zip(r.cand_ids, r.cand_skips, strict=True)),
        dict(zip(r.credit_ids, r.credit_ns, strict=True)),
    )


@pytest.fixture
def conn(engine: Engine) -> Iterator[Connection]:
    with engine.connect() as c:
        yield c


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(team_states())
def test_rotation_pick_matches_pick_available(conn: Connection, s: dict[str, Any]) -> None:
    assert sql_pick(conn, s) == python_pick(s)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(team_states(), st.data())
def test_rotation_pick_matches_pick_by_pick(
    conn: Connection, s: dict[str, Any], data: st.DataObject
) -> None:
    """Twenty leads in a row, availability and caps changing between them: the state each
    pick leaves (turns, credits, room, the latest owners) feeds the next, on both sides."""
    for _ in range(20):
        got = sql_pick(conn, s)
        assert got == python_pick(s)
        member, _, credited = got
        turns = dict(zip(s["ids"], s["turns"], strict=True))
        for m, n in credited.items():
            turns[m] += n
        if member is not None:
            turns[member] += 1
            i = s["ids"].index(member)
            if s["room"][i] is not None:
                s["room"][i] -= 1
            s["recent"] = [member, *s["recent"]][:4]
        s["turns"] = [turns[i] for i in s["ids"]]
        n = len(s["ids"])
        s["blocked"] = data.draw(
            st.lists(
                st.sampled_from([None, None, None, "away", "off_shift"]), min_size=n, max_size=n
            )
        )


PICK_ALL = text(
    "SELECT member_id, cand_ids, cand_skips, credit_ids, credit_ns, cand_weights, cand_turns "
    "FROM rotation_pick(CAST(:ids AS bigint[]), CAST(:weights AS integer[]), "
    "CAST(:turns AS bigint[]), CAST(:positions AS integer[]), CAST(:blocked AS text[]), "
    "CAST(:room AS integer[]), CAST(:k AS integer), CAST(:recent AS bigint[]))"
)
PICK_PLAIN = text(
    "SELECT member_id, cand_ids, cand_skips, credit_ids, credit_ns, cand_weights, cand_turns "
    "FROM rotation_pick_plain(CAST(:ids AS bigint[]), CAST(:weights AS integer[]), "
    "CAST(:turns AS bigint[]), CAST(:positions AS integer[]))"
)


@st.composite
def plain_states(draw: st.DrawFn) -> dict[str, Any]:
    """Teams route_lead sends to rotation_pick_plain: nobody blocked or capped, no catch-up
    (room left under a cap is allowed). Turns range wide, so they need not come from one
    history: ties, released and unreleased seats in any mix."""
    n = draw(st.integers(0, 8))
    ids = draw(st.lists(st.integers(1, 10**12), min_size=n, max_size=n, unique=True))
    return {
        "ids": ids,
        "weights": draw(st.lists(st.integers(1, 7), min_size=n, max_size=n)),
        "turns": draw(st.lists(st.integers(0, 60), min_size=n, max_size=n)),
        "positions": draw(st.lists(st.integers(0, 3), min_size=n, max_size=n)),
        "blocked": [None] * n,
        "room": draw(st.lists(st.sampled_from([None, 1, 5]), min_size=n, max_size=n)),
        "k": None,
        "recent": [],
    }


@settings(
    max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(plain_states())
def test_rotation_pick_plain_matches_rotation_pick(conn: Connection, s: dict[str, Any]) -> None:
    """The plain rotation's SQL pick (migration 0019) returns exactly what rotation_pick
    returns for the same seats, every column, and picks as pick_available does. Positions
    may repeat, so the id breaks ties in the seats' order on both sides."""
    plain = tuple(conn.execute(PICK_PLAIN, s).one())
    assert plain == tuple(conn.execute(PICK_ALL, s).one())
    assert plain[0] == python_pick(s)[0]


def plain_team(n: int) -> OrgConfig:
    """One plain team of ``n`` reps (no caps, no catch-up, no hours) that takes every lead."""
    members = "".join(
        f'      - {{crm_user_id: "005P{i:02d}", name: Rep{i:02d}}}\n' for i in range(n)
    )
    return parse_config(
        HEADER
        + f"teams:\n  - name: p\n    members:\n{members}rules:\n  - {{name: all, team: p}}\n",
        "p.yaml",
        ENV,
    )


@st.composite
def plain_seats(draw: st.DrawFn) -> list[tuple[int, int, int, bool, int]]:
    """Eight reps' (weight, turns, position, active, credited turns): ties, repeated
    positions, released and unreleased seats, inactive reps and credits an earlier
    route_lead gave in any mix."""
    seat = st.tuples(
        st.integers(1, 7), st.integers(0, 60), st.integers(0, 3), st.booleans(), st.integers(0, 4)
    )
    return draw(st.lists(seat, min_size=8, max_size=8))


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(plain_seats())
def test_route_plain_picks_and_records_as_rotation_pick_plain(
    engine: Engine, seats: list[tuple[int, int, int, bool, int]]
) -> None:
    """route_plain (migration 0021) reads the seats in one pass and orders the pick itself;
    for any team it picks the rep rotation_pick_plain picks over the active seats (None:
    it hands the lead to route_lead), and records the seats as route_lead does: the
    rotation's seats in its order, then the inactive reps by position."""
    cfg = plain_team(8)
    apply_teams(engine, cfg)
    params = Router(engine, cfg, clock=WallClock(MONDAY))._single_params(Lead("00Qh1", {}), "api")
    assert params is not None
    with engine.connect() as c:
        c.begin()
        ids = c.execute(text("SELECT id FROM members ORDER BY crm_user_id")).scalars().all()
        for member_id, (weight, turns, position, active, credited) in zip(ids, seats, strict=True):
            c.execute(
                text(
                    "UPDATE members SET weight = :w, assigned_in_epoch = :t, position = :p, "
                    "active = :a, credited_in_epoch = :c WHERE id = :id"
                ),
                {
                    "w": weight,
                    "t": turns,
                    "p": position,
                    "a": active,
                    "c": credited,
                    "id": member_id,
                },
            )
        on = [(i, s) for i, s in zip(ids, seats, strict=True) if s[3]]
        state = {
            "ids": [i for i, _ in on],
            "weights": [s[0] for _, s in on],
            "turns": [s[1] + s[4] for _, s in on],  # a seat's turns count its credits
            "positions": [s[2] for _, s in on],
        }
        want = c.execute(PICK_PLAIN, state).one()
        row = c.execute(assign_module._SQL["route_plain"], params).one()
        if want.member_id is None:  # no active rep: route_lead records the lead unassigned
            assert row.status == "route_lead"
            return
        assert row.status == "assigned"
        owner = c.execute(
            text("SELECT member_id FROM assignments WHERE lead_id = :l"), {"l": row.lead_id}
        ).scalar_one()
        assert owner == want.member_id
        inactive = sorted(
            ((s[2], i) for i, s in zip(ids, seats, strict=True) if not s[3]), key=lambda x: x
        )
        assert row.cand_ids == list(want.cand_ids) + [i for _, i in inactive]
        assert row.cand_skips == [None] * len(on) + ["inactive"] * len(inactive)
        seats_recorded = _decision_of(c, "00Qh1")["seats"]
        by_id = dict(zip(ids, seats, strict=True))
        assert seats_recorded["weights"] == [by_id[i][0] for i in row.cand_ids]
        assert seats_recorded["counts"] == [by_id[i][1] + by_id[i][4] for i in row.cand_ids]
        c.rollback()


def test_rotation_pick_plain_follows_the_weighted_schedule(conn: Connection) -> None:
    """Weights 3, 1, 1 from zero turns: 25 picks in a row give each seat its share of every
    prefix within one turn, and the heavy seat 15 of 25."""
    s: dict[str, Any] = {
        "ids": [7, 8, 9],
        "weights": [1, 3, 1],
        "turns": [0, 0, 0],
        "positions": [0, 1, 2],
    }
    got = []
    for _ in range(25):
        pick = conn.execute(PICK_PLAIN, s).one().member_id
        got.append(pick)
        s["turns"][s["ids"].index(pick)] += 1
        done = len(got)
        for i, w in zip(s["ids"], s["weights"], strict=True):
            assert abs(got.count(i) - done * w / 5) < 1, (done, got)
    assert s["turns"] == [5, 15, 5]


def test_rotation_pick_lets_a_heavy_rep_run_like_pick_available(conn: Connection) -> None:
    """Weights 1, 1, 5 with K = 1 after the light rep's time away (migration 0016): the
    heavy rep gets its runs, the returning rep at most one in a row, on both sides."""
    s: dict[str, Any] = {
        "ids": [100, 101, 102],
        "weights": [1, 1, 5],
        "turns": [0, 2, 11],
        "positions": [0, 1, 2],
        "blocked": [None, None, None],
        "room": [None, None, None],
        "k": 1,
        "recent": [102, 102, 102, 101],
    }
    picks = []
    for _ in range(24):
        member, _, credited = got = sql_pick(conn, s)
        assert got == python_pick(s) and not credited and member is not None
        picks.append(member)
        s["turns"][s["ids"].index(member)] += 1
        s["recent"] = [member, *s["recent"]][:4]
    assert s["turns"] == [5, 5, 27]  # everyone within one of 37 * w / 7
    pairs = list(itertools.pairwise(picks))
    assert (102, 102) in pairs and (100, 100) not in pairs


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


def _wait_until_blocked(engine: Engine, like: str = "%", sessions: int = 1) -> None:
    """Until ``sessions`` sessions of this database whose query is LIKE ``like`` wait for a
    lock (on a shared server other tests' sessions wait for locks too)."""
    with engine.connect() as watch:
        for _ in range(200):
            waiting = watch.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND datname = current_database() AND query LIKE :q"
                ),
                {"q": like},
            ).scalar_one()
            watch.rollback()  # pg_stat_activity is read once per transaction
            if waiting >= sessions:
                return
            threading.Event().wait(0.05)
    raise AssertionError(f"fewer than {sessions} sessions LIKE {like!r} waited for a lock")


def _in_thread(fn: Callable[[], object], errors: list[BaseException]) -> threading.Thread:
    """``fn`` started in a thread; whatever it raises goes to ``errors``."""

    def guarded() -> None:
        try:
            fn()
        except BaseException as exc:  # the test reports it
            errors.append(exc)

    t = threading.Thread(target=guarded)
    t.start()
    return t


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
        waiter = _in_thread(lambda: _assign_one(engine, r, waiting, in_transaction, got), errors)
        _wait_until_blocked(engine, f"%FROM {function}(%")
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
        engine, r, Lead("00Qw1", {"Country": "DE"}), Lead("00Qw2", {"Country": "DE"}), "route_lead"
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


def _decisions(engine: Engine) -> list[tuple[str, dict[str, Any]]]:
    """Each lead's decision with member ids replaced by CRM user ids (two databases)."""
    with engine.connect() as c:
        users = dict(c.execute(text("SELECT id, crm_user_id FROM members")).all())
        rows = c.execute(
            text(
                "SELECT l.crm_id, d.detail FROM decision_details d JOIN leads l "
                "ON l.id = d.lead_id ORDER BY l.crm_id"
            )
        ).all()
        leads = dict(c.execute(text("SELECT id, crm_id FROM leads")).all())
    out = []
    for crm_id, detail in rows:
        # the lead's own id (a lead id is drawn even for an insert that conflicts or is
        # rolled back, so ids differ between paths that try the insert a different number
        # of times)
        if "batch" in detail:
            detail["batch"] = leads[detail["batch"]]
        if "seats" in detail:
            detail["seats"]["ids"] = [users[i] for i in detail["seats"]["ids"]]
        if "chosen_id" in detail:
            detail["chosen_id"] = users[detail["chosen_id"]]
        out.append((crm_id, detail))
    return out


def _state(engine: Engine) -> dict[str, Any]:
    with engine.connect() as c:

        def rows(sql: str) -> list[tuple[Any, ...]]:
            return [tuple(r) for r in c.execute(text(sql))]

        return {
            "members": rows(
                "SELECT crm_user_id, assigned_in_epoch, credited_in_epoch FROM members ORDER BY 1"
            ),
            "load": rows(
                "SELECT m.crm_user_id, l.period, l.starts_on, l.assigned FROM member_load l "
                "JOIN members m ON m.id = l.member_id ORDER BY 1, 2, 3"
            ),
            "assignments": rows(
                "SELECT l.crm_id, a.crm_user_id, a.rule_name, a.epoch, a.source, "
                "a.sla_due_at - a.assigned_at FROM assignments a JOIN leads l ON l.id = a.lead_id "
                "ORDER BY a.id"
            ),
            "outbox": rows("SELECT crm_id, owner_id, state FROM outbox ORDER BY id"),
            "leads": rows("SELECT crm_id, unassigned_reason, source FROM leads ORDER BY crm_id"),
        }


def _outcome(o: Outcome, users: dict[int, str]) -> tuple[Any, ...]:
    cands = tuple((users[m], r) for m, r in o.candidates)
    return (o.crm_id, o.status, o.team, o.owner_id, o.owner_name, o.reason, cands)


def _run(engine: Engine, path: str) -> tuple[list[tuple[Any, ...]], Any, Any]:
    cfg = org()
    # Max was in team p and is dropped: his row stays (in_config false), never a seat
    apply_teams(engine, org(p_extra='\n      - {crm_user_id: "005M", name: Max}'))
    apply_teams(engine, cfg)
    clock = WallClock(MONDAY)
    r = Router(engine, cfg, clock=clock)
    if path == "route_lead":  # no lead of a plain team takes route_plain
        r.single = {k: dataclasses.replace(v, plain=False) for k, v in r.single.items()}
    elif path == "general":
        r.single = {}  # every lead through the general path
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
    return [_outcome(o, users) for o in outcomes], _decisions(engine), _state(engine)


def test_single_call_and_general_path_record_the_same(
    databases: DatabaseFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same leads through route_plain (team p's leads, while none of its reps is away),
    through route_lead only, and through the general path: the same outcomes, decisions,
    counts, caps counters, assignments and outbox rows."""
    plain: list[str] = []  # what each route_plain call answered
    real = assign_module.one_statement

    def spy(engine: Engine, sql: str, params: Any) -> Any:
        if sql is not assign_module._ROUTE_PLAIN:
            return real(engine, sql, params)
        try:
            row = real(engine, sql, params)
        except Exception:
            plain.append("error")
            raise
        plain.append(row[0] if row else "none")
        return row

    monkeypatch.setattr(assign_module, "one_statement", spy)
    engines = [make_engine(databases.new(), pool_size=2) for _ in range(3)]
    try:
        single = _run(engines[0], "route_plain")
        answered = list(plain)
        by_function = _run(engines[1], "route_lead")
        general = _run(engines[2], "general")
    finally:
        for e in engines:
            e.dispose()
    # team p's 18 new leads and 4 repeats sent as FR (a lead every 23 minutes from Monday
    # 13:00 UTC): route_lead took those that came while Lou was off shift (before 08:00 or
    # after 16:00 UTC: blocked by the config, so never sent to route_plain), which include
    # the 2 that came while Hal was away by command; route_plain assigned the other 7 new
    # ones and handed on the 2 repeats it was sent, having written nothing for them
    assert (answered.count("assigned"), answered.count("route_lead")) == (7, 2), answered
    assert plain == answered  # the other two runs never took route_plain
    assert by_function == single
    assert single[0] == general[0]
    statuses = {o[1] for o in single[0]}
    assert statuses == {"assigned", "unassigned", "duplicate"}, statuses
    reasons = {o[5] for o in single[0] if o[1] == "unassigned"}
    skips = {r for o in single[0] for _, r in o[6]}
    assert {"away", "off_shift", "capped", "inactive"} <= skips, skips
    assert reasons, "the scenario should leave some lead unassigned"
    assert single[1] == general[1]
    assert single[2] == general[2]


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
        r.single = {}
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
    assert set(r.single) == {"j"}
    if not single:
        r.single = {}
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
    lead at a time, never twice in a row, on the single call (which reads the team's latest
    owners by a loop of their own, migration 0019) as on the general path."""
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


def _spy_plain(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """What each route_plain call in autocommit (``Router.assign``) answered: its status."""
    answered: list[str] = []
    real = assign_module.one_statement

    def spy(engine: Engine, sql: str, params: Any) -> Any:
        if sql is not assign_module._ROUTE_PLAIN:
            return real(engine, sql, params)
        row = real(engine, sql, params)
        answered.append(row[0] if row else "none")
        return row

    monkeypatch.setattr(assign_module, "one_statement", spy)
    return answered


def _lead_rows(engine: Engine) -> dict[str, int]:
    with engine.connect() as c:
        return {
            t: c.execute(text(f"SELECT count(*) FROM {t}")).scalar_one()
            for t in ("leads", "assignments", "outbox", "routing_decisions")
        }


def test_route_plain_waiter_reads_what_the_lock_holder_committed(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """route_plain's first statement takes its snapshot before it waits for the team lock;
    it reads the members in a second statement, whose snapshot is taken under the lock
    (migration 0021). The holder's pick (Hal, weight 2 of 4) is committed while the waiter
    waits: read with the first snapshot Hal would be owed the lead again; read with the
    second, Ida is."""
    answered = _spy_plain(monkeypatch)
    cfg = org()
    apply_teams(engine, cfg)
    r = Router(engine, cfg, clock=WallClock(MONDAY))
    held, waiting = Lead("00Qpw1", {"Country": "FR"}), Lead("00Qpw2", {"Country": "FR"})
    first, second = _behind_a_holder(engine, r, held, waiting, "route_plain")
    assert answered == ["assigned"]
    assert (first.owner_id, second.status, second.owner_id) == ("005H", "assigned", "005I")
    with engine.connect() as c:
        counts = dict(c.execute(text("SELECT crm_user_id, assigned_in_epoch FROM members")).all())
        detail = _decision_of(c, "00Qpw2")
    assert (counts["005H"], counts["005I"], counts["005K"]) == (1, 1, 0)
    assert detail["seats"]["counts"][:3] == [1, 0, 0]  # Hal, Ida, Kim as the waiter saw them


@pytest.mark.parametrize("in_transaction", [False, True], ids=["autocommit", "in a transaction"])
def test_route_plain_reads_a_team_that_changed_while_it_waited(
    engine: Engine, monkeypatch: pytest.MonkeyPatch, in_transaction: bool
) -> None:
    """A config apply may add members while a lead waits for its team's lock, which a
    snapshot taken before the wait cannot see. route_plain reads the members in a second
    statement, with a fresh snapshot taken under the lock (migration 0021), so it decides
    among every member: the new one (Lee) is a candidate, and the lead is stored once. In
    the caller's transaction (the inbox's, the poller's) that transaction goes on and
    commits."""
    answered = _spy_plain(monkeypatch)
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
        _wait_until_blocked(engine, "%FROM route_plain(%")
        holder.commit()
        waiter.join(timeout=30)
    assert answered == ([] if in_transaction else ["assigned"])
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
def test_route_plain_hands_a_lead_to_route_lead_when_a_rep_went_away_while_it_waited(
    engine: Engine, monkeypatch: pytest.MonkeyPatch, in_transaction: bool
) -> None:
    """Time off stored while the lead waits for its team's lock (here by a writer that does
    not take the team's lock, as `connector rep away` does): route_plain's second statement
    sees it, writes nothing, takes its lead row back and answers 'route_lead', which
    decides the lead with Ida away: Hal again (weight 2), not Ida, who was owed it. The lead
    is stored once, in autocommit and in the caller's transaction."""
    answered = _spy_plain(monkeypatch)
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
        "route_plain",
        lambda holder: holder.execute(
            time_off, {"start": MONDAY - timedelta(hours=1), "until": MONDAY + timedelta(hours=1)}
        ),
        in_transaction,
    )
    assert answered == ([] if in_transaction else ["route_lead"])
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
    engine: Engine, monkeypatch: pytest.MonkeyPatch, in_transaction: bool
) -> None:
    """A config apply retires the team (in_config false) while a lead waits for its lock:
    route_plain's lock finds no team, so its second statement writes nothing and it deletes
    the lead row it stored; route_lead then finds no team and the Router says so. Nothing
    of the lead is left, in autocommit and in the caller's transaction."""
    answered = _spy_plain(monkeypatch)
    cfg = org()
    apply_teams(engine, cfg)
    r = Router(engine, cfg, clock=WallClock(MONDAY))
    with pytest.raises(RoutingError, match="not in the database"):
        _behind_a_holder(
            engine,
            r,
            Lead("00Qpr1", {"Country": "FR"}),
            Lead("00Qpr2", {"Country": "FR"}),
            "route_plain",
            lambda holder: holder.execute(
                text("UPDATE teams SET in_config = false WHERE name = 'p'")
            ),
            in_transaction,
        )
    assert answered == ([] if in_transaction else ["route_lead"])
    assert _lead_rows(engine) == {
        "leads": 1,
        "assignments": 1,
        "outbox": 1,
        "routing_decisions": 1,
    }


def test_route_plain_hands_a_team_without_active_members_to_route_lead(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No active member: route_plain writes nothing and answers 'route_lead', which records
    the lead as unassigned with its reason, once."""
    answered = _spy_plain(monkeypatch)
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
    assert answered == ["route_lead"]
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
    deactivation waits for the team lock first, and both finish. (At 20:00 UTC Lou is off
    shift, so the leads take route_lead, which reads no member row before it updates one:
    route_plain, which updates one member row only, would do as well.)"""
    cfg = org()
    apply_teams(engine, cfg)
    r = Router(engine, cfg, clock=WallClock(MONDAY + timedelta(hours=7)))
    errors: list[BaseException] = []
    with engine.connect() as holder:
        holder.begin()
        first = r.assign_in(holder, [Lead("00Qpd1", {"Country": "FR"})], "api")[0]
        worker = _in_thread(lambda: deactivate_rep(engine, cfg, "Ida", reroute=False), errors)
        _wait_until_blocked(engine)  # the deactivation waits for a lock
        # Ida is owed the next lead: this updates her row, which the old order had locked
        second = r.assign_in(holder, [Lead("00Qpd2", {"Country": "FR"})], "api")[0]
        holder.commit()
        worker.join(timeout=30)
    assert errors == []
    assert (first.owner_id, second.owner_id) == ("005H", "005I")
    with engine.connect() as c:
        active = c.execute(text("SELECT active FROM members WHERE crm_user_id = '005I'")).scalar()
    assert active is False


def test_rep_away_waits_for_the_leads_already_waiting_for_its_team(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`connector rep away` writes the rep's team rows before the time off, so it commits
    only after the leads already waiting for the team lock, never while one of them waits
    with a snapshot that cannot see it (route_plain's is taken before its wait). Once it has
    returned, no lead goes to the rep."""
    answered = _spy_plain(monkeypatch)
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
    first, second = _behind_a_holder(engine, r, held, waiting, "route_plain", meanwhile)
    setter.join(timeout=30)
    assert done.is_set()
    # the waiting lead was decided before the time off, as its place in the queue says
    assert (first.owner_id, second.owner_id) == ("005H", "005I")
    later = [r.assign(Lead(f"00Qpa{i}", {"Country": "FR"}), "api") for i in range(3, 7)]
    assert "005I" not in {o.owner_id for o in later}
    assert answered == ["assigned"] + ["route_lead"] * 4


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
    ("members", "team_keys", "plain"),
    [
        ('{crm_user_id: "005A", name: Ada}', "", True),
        ('{crm_user_id: "005A", name: Ada, caps: {per_week: 9}}', "", False),
        ('{crm_user_id: "005A", name: Ada}', "caps: {per_day: 3}", False),
        ('{crm_user_id: "005A", name: Ada}', "catch_up: {max_in_a_row: 1}", False),
        # hours and time off block at some instants only: plain_call checks each call
        (
            '{crm_user_id: "005A", name: Ada, hours: {timezone: UTC, mon-fri: "09:00-17:00"}}',
            "",
            True,
        ),
    ],
    ids=["plain", "member caps", "team caps", "catch-up", "hours"],
)
def test_which_teams_are_plain(members: str, team_keys: str, plain: bool) -> None:
    assert team_inputs(team_of_two(members, team_keys).teams[0]).plain is plain


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
            want = {"source": source, "rules": tried, "values": values, "at": MONDAY.isoformat()}
            assert cache.detail(source, f, MONDAY) == json.dumps(want)
    assert len(cache._text) <= 3  # bounded
    long = {"Country": "x" * 5000}  # a trace this long is written, not kept
    cache._text.clear()
    tried, values = trace_rules(rules, long)
    want = {"source": "api", "rules": tried, "values": values, "at": MONDAY.isoformat()}
    assert cache.detail("api", long, MONDAY) == json.dumps(want) and not cache._text


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
        worker = _in_thread(run, errors)
        _wait_until_blocked(engine)
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
        worker = _in_thread(
            lambda: set_away(engine, cfg, ada, MONDAY + timedelta(hours=1), None, MONDAY), errors
        )
        _wait_until_blocked(engine)
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
        mover = _in_thread(
            lambda: reassign_lead(engine, cfg, "00Qrr1", to="Oz", reason="reassigned"), errors
        )
        _wait_until_blocked(engine)
        ada = resolve_rep(cfg, "Ada")
        away = _in_thread(
            lambda: set_away(engine, cfg, ada, MONDAY + timedelta(hours=9), None, MONDAY), errors
        )
        _wait_until_blocked(engine, sessions=2)
        holder.commit()
        mover.join(timeout=30)
        away.join(timeout=30)
    assert errors == []
    with engine.connect() as c:
        owner = c.execute(text("SELECT crm_user_id FROM assignments")).scalar_one()
    assert owner == "005O"
