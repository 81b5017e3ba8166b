"""A plain team's batch in one call (``route_plain_batch``, migration 0025) on real Postgres.

* It picks as the rotation does: fewest turns first, then rank (position), from any counts,
  with inactive members in the decisions' seats; Hypothesis checks every pick and every
  decision's seat counts against a lead-by-lead reference.
* A sequence of batches through it and through the general path (the Router without single
  teams) leaves the same outcomes, decisions, counts, caps counters, assignments and outbox
  rows, including batches it leaves to the general path (a rep away by command, a rep away
  by the config, a second team, weighted reps).
* It reads the seats after it waits for the team's lock, with a fresh snapshot; a team
  retired while it waited, or a rep who went away by command meanwhile, is the general
  path's to decide, in the same transaction, with nothing written twice.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, text

from connector.core.config import OrgConfig, parse_config
from connector.routing.assign import Lead, Outcome, Router, RoutingError
from connector.routing.teams import apply_teams
from connector.shell.reps import resolve_rep, set_away
from connector.shell.store import make_engine
from testbed.pg import DatabaseFactory
from tests.helpers.blocking import wait_until_blocked as _wait_until_blocked
from tests.helpers.clocks import WallClock
from tests.helpers.routing_state import ENV, HEADER, MONDAY
from tests.helpers.routing_state import decisions_by_lead as _decisions
from tests.helpers.routing_state import outcome_row as _outcome
from tests.helpers.routing_state import routing_state as _state


def org(q_extra: str = "") -> OrgConfig:
    return parse_config(
        HEADER
        + """  object: Contact
teams:
  - name: q
    sla: {minutes: 20, status_field: Status, initial: [New]}
    members:
      - {crm_user_id: "005Q1", name: Quinn}
      - {crm_user_id: "005Q2", name: Rae}
      - {crm_user_id: "005Q3", name: Sam, active: false}
      - {crm_user_id: "005Q4", name: Tao}
      - {crm_user_id: "005Q5", name: Uma,
         time_off: [{from: "2026-12-07T17:00", until: "2026-12-07T18:00"}]}
      - {crm_user_id: "005Q6", name: Val}"""
        + q_extra
        + """
  - name: w
    members:
      - {crm_user_id: "005W1", name: Wes, weight: 2}
      - {crm_user_id: "005W2", name: Xia}
rules:
  - {name: q, team: q, when: {Country: FR}}
  - {name: w, team: w, when: {Country: DE}}
""",
        "q.yaml",
        ENV,
    )


def _spy(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """What each ``Router._route_plain_batch`` call answered: True when it decided."""
    answered: list[bool] = []
    real = Router._route_plain_batch

    def spy(self: Router, *args: Any) -> bool:
        ok = real(self, *args)
        answered.append(ok)
        return ok

    monkeypatch.setattr(Router, "_route_plain_batch", spy)
    return answered


def _rows(engine: Engine) -> dict[str, list[tuple[Any, ...]]]:
    """Every assignment and outbox row, in id order, by what they name (ids differ between
    databases): the lead, the member, the team, the rule; the parent, the assignment's lead,
    and whether the outbox row's received_at is its lead's."""
    with engine.connect() as c:

        def rows(sql: str) -> list[tuple[Any, ...]]:
            return [tuple(r) for r in c.execute(text(sql))]

        return {
            "assignments": rows(
                "SELECT l.crm_id, m.crm_user_id, a.crm_user_id, t.name, a.rule_index "
                "FROM assignments a JOIN leads l ON l.id = a.lead_id "
                "JOIN members m ON m.id = a.member_id JOIN teams t ON t.id = a.team_id "
                "ORDER BY a.id"
            ),
            "outbox": rows(
                "SELECT l.crm_id, o.crm_object, o.owner_id, o.parent_id, al.crm_id, "
                "o.lead_received_at = l.received_at FROM outbox o "
                "JOIN leads l ON l.id = o.lead_id JOIN assignments a ON a.id = o.assignment_id "
                "JOIN leads al ON al.id = a.lead_id ORDER BY o.id"
            ),
        }


def _run(
    engine: Engine, general: bool
) -> tuple[list[tuple[Any, ...]], Any, Any, dict[str, list[tuple[Any, ...]]]]:
    apply_teams(engine, org())
    clock = WallClock(MONDAY)
    r = Router(engine, org(), clock=clock)
    if general:
        r.single = {}  # every lead through the general path
    outcomes: list[Outcome] = []
    sizes = [2, 3, 7, 1, 12, 25, 4, 9, 16, 5, 3, 11, 2, 6, 30, 8, 3, 13, 4, 7]
    n = 0
    for i, size in enumerate(sizes):
        if i == 6:  # Rae away by command for two hours (read under the lock)
            set_away(
                engine,
                r.cfg,
                resolve_rep(r.cfg, "Rae"),
                clock.at + timedelta(hours=2),
                None,
                clock.at,
            )
        if i == 12:  # a member added: a new epoch
            apply_teams(engine, org('\n      - {crm_user_id: "005Q7", name: Yan}'))
            r = Router(engine, org('\n      - {crm_user_id: "005Q7", name: Yan}'), clock=clock)
            if general:
                r.single = {}
        leads = [
            Lead(f"003q{n + j:04d}", {"Country": "FR", "AccountId": f"001a{(n + j) % 7}"})
            for j in range(size)
        ]
        n += size
        if i % 3 == 1:  # a lead no rule matches, and a repeat of an earlier batch's lead
            leads += [Lead(f"003u{i:04d}", {"Country": "US"}), Lead("003q0000", {"Country": "FR"})]
        if i % 5 == 2:  # a repeat inside the batch
            leads.append(Lead(leads[0].crm_id.lower(), {"Country": "FR"}))
        if i in (9, 17):  # two teams: the general path
            leads.append(Lead(f"003w{i:04d}", {"Country": "DE"}))
        outcomes += r.assign_many(leads, "import")
        outcomes += r.assign_many(
            [Lead(f"003d{i:04d}a", {"Country": "DE"}), Lead(f"003d{i:04d}b", {"Country": "DE"})],
            "import",
        )  # weighted reps: the general path
        clock.at += timedelta(minutes=23)
    with engine.connect() as c:
        users = dict(c.execute(text("SELECT id, crm_user_id FROM members")).all())
    return (
        [_outcome(o, users) for o in outcomes],
        _decisions(engine),
        _state(engine),
        _rows(engine),
    )


def test_plain_batches_and_the_general_path_record_the_same(
    databases: DatabaseFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same batches through route_plain_batch and through the general path: the same
    outcomes, decisions, counts, caps counters, assignments (in id order) and outbox rows."""
    answered = _spy(monkeypatch)
    engines = [make_engine(databases.new(), pool_size=2) for _ in range(2)]
    try:
        plain = _run(engines[0], general=False)
        took = list(answered)
        general = _run(engines[1], general=True)
    finally:
        for e in engines:
            e.dispose()
    # 20 batches of team q, one every 23 minutes from Monday 13:00 UTC. It decided 0-2 and
    # 4-5 (3 is a single lead: route_plain) and left 6-8 and 10 to the general path before
    # taking the lock (Rae away by command from batch 6 until 17:18 UTC); 9 and 17 hold a
    # lead of team w too and 11-13 come in Uma's time off in the config (17:00-18:00 UTC), so
    # those never called it; it decided 14-16, 18 and 19, in a new epoch (Yan joined at 12).
    # The weighted team's batches never call it.
    assert took == [True] * 5 + [False] * 4 + [True] * 5, str(took)
    assert answered == took  # the general run never called it
    assert plain[0] == general[0]
    assert plain[1] == general[1]
    assert plain[2] == general[2]
    assert plain[3] == general[3]
    assert {r[3] for r in plain[3]["outbox"]} > {None}  # parents
    statuses = {o[1] for o in plain[0]}
    assert statuses == {"assigned", "unassigned", "duplicate"}, statuses


SIX = (
    HEADER
    + """teams:
  - name: q
    members:
"""
    + "".join(f'      - {{crm_user_id: "005R{i}", name: Rep {i}}}\n' for i in range(6))
    + """
rules:
  - {name: all, team: q}
"""
)


@pytest.fixture(scope="module")
def six(databases: DatabaseFactory) -> Iterator[tuple[Engine, Router]]:
    """Team q of six reps of equal weight, in a database of this module's."""
    engine = make_engine(databases.new(), pool_size=2)
    cfg = parse_config(SIX, "six.yaml", ENV)
    apply_teams(engine, cfg)
    yield engine, Router(engine, cfg, clock=WallClock(MONDAY))
    engine.dispose()


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    turns=st.lists(st.integers(0, 9), min_size=6, max_size=6),
    credited=st.lists(st.integers(0, 3), min_size=6, max_size=6),
    active=st.lists(st.booleans(), min_size=6, max_size=6),
    positions=st.permutations(list(range(6))),
    count=st.integers(2, 40),
)
@example(
    turns=[3, 0, 5, 0, 2, 9],
    credited=[0, 2, 0, 1, 0, 0],
    active=[True, True, False, True, True, False],
    positions=[5, 3, 4, 0, 1, 2],
    count=40,
)
@example(turns=[0] * 6, credited=[0] * 6, active=[False] * 6, positions=list(range(6)), count=3)
def test_route_plain_batch_picks_as_the_rotation_from_any_counts(
    six: tuple[Engine, Router],
    turns: list[int],
    credited: list[int],
    active: list[bool],
    positions: list[int],
    count: int,
) -> None:
    """From any counts (leads and credited turns) and any set of active reps in any order
    of positions (not the order of their ids), every pick is the active rep with the fewest
    turns, then the first in position (plain round robin), and each decision records every
    rep's turns before its pick: the active reps in position order, then the inactive ones.
    With no active rep the batch is the general path's: every lead unassigned. Each example
    runs in a transaction that is rolled back."""
    engine, router = six
    with pytest.MonkeyPatch.context() as mp, engine.connect() as c:
        answered = _spy(mp)
        c.begin()
        by_id = c.execute(text("SELECT id FROM members ORDER BY id")).scalars().all()
        for mid, t, cr, a, pos in zip(by_id, turns, credited, active, positions, strict=True):
            c.execute(
                text(
                    "UPDATE members SET assigned_in_epoch = :t, credited_in_epoch = :c, "
                    "active = :a, position = :p WHERE id = :id"
                ),
                {"t": t, "c": cr, "a": a, "p": pos, "id": mid},
            )
        out = router.assign_in(c, [Lead(f"00Qh{i:03d}", {}) for i in range(count)], "import")
        picks = c.execute(text("SELECT member_id FROM assignments ORDER BY id")).scalars().all()
        seats = (
            c.execute(
                text(
                    "SELECT d.detail -> 'seats' FROM decision_details d JOIN leads l "
                    "ON l.id = d.lead_id ORDER BY l.crm_id"
                )
            )
            .scalars()
            .all()
        )
        c.rollback()
    ids = sorted(by_id, key=lambda m: positions[by_id.index(m)])  # in position order
    on = dict(zip(by_id, active, strict=True))
    rank = [m for m in ids if on[m]]
    order = rank + [m for m in ids if not on[m]]
    # it decided the batch exactly when some rep was active
    assert answered[-1] is bool(rank)
    if not rank:
        assert {(o.status, o.reason) for o in out} == {("unassigned", "no_active_member")}
        assert picks == []
        return
    now = {m: t + cr for m, t, cr in zip(by_id, turns, credited, strict=True)}
    expected_picks, expected_counts = [], []
    for _ in range(count):
        expected_counts.append([now[m] for m in order])
        best = min(rank, key=lambda m: (now[m], rank.index(m)))
        expected_picks.append(best)
        now[best] += 1
    assert picks == expected_picks
    assert [s["counts"] for s in seats] == expected_counts
    assert all(s["ids"] == order for s in seats)
    assert all(s["skips"] == [None] * len(rank) + ["inactive"] * (6 - len(rank)) for s in seats)
    assert [o.owner_id for o in out] == [f"005R{by_id.index(m)}" for m in expected_picks]


FOUR = (
    HEADER
    + """teams:
  - name: q
    members:
      - {crm_user_id: "005Q1", name: Quinn}
      - {crm_user_id: "005Q2", name: Rae}
      - {crm_user_id: "005Q3", name: Tao}
      - {crm_user_id: "005Q4", name: Val}
rules:
  - {name: all, team: q}
"""
)


def _behind_a_batch(
    engine: Engine,
    meanwhile: str | None = None,
    queued_first: Callable[[OrgConfig], object] | None = None,
    queued_like: str = "%",
    clock: Callable[[], datetime] | None = None,
) -> tuple[list[Outcome], list[Outcome] | BaseException, list[bool]]:
    """A batch of three leads is assigned in a transaction left open, so it holds team q's
    lock, while a batch of three more waits for it in route_plain_batch (in a thread), after
    ``queued_first`` (in a thread of its own, waiting for the lock first, when given: its
    statement is LIKE ``queued_like``); the router reads ``clock`` (a fixed Monday when None); then
    ``meanwhile`` runs on the holder's connection, the holder commits, and both batches'
    outcomes (or what the waiter raised) are returned with what route_plain_batch answered
    each time."""
    cfg = parse_config(FOUR, "four.yaml", ENV)
    apply_teams(engine, cfg)
    r = Router(engine, cfg, clock=clock or WallClock(MONDAY))
    got: list[list[Outcome] | BaseException] = []
    with pytest.MonkeyPatch.context() as mp, engine.connect() as holder:
        answered = _spy(mp)
        holder.begin()
        first = r.assign_in(holder, [Lead(f"00Qh{i}", {}) for i in range(3)], "import")
        before = None
        if queued_first is not None:
            before = threading.Thread(target=queued_first, args=(cfg,))
            before.start()
            _wait_until_blocked(engine, queued_like)

        def wait() -> None:
            try:
                got.append(r.assign_many([Lead(f"00Qw{i}", {}) for i in range(3)], "import"))
            except BaseException as exc:  # the test reports it
                got.append(exc)

        waiter = threading.Thread(target=wait)
        waiter.start()
        _wait_until_blocked(engine, "%FROM route_plain_batch(%")
        if meanwhile is not None:
            holder.execute(text(meanwhile))
        holder.commit()
        waiter.join(timeout=30)
        if before is not None:
            before.join(timeout=30)
    return first, got[0], answered


def _owners(engine: Engine) -> list[tuple[str, str]]:
    with engine.connect() as c:
        return [
            (r.crm_id, r.crm_user_id)
            for r in c.execute(
                text(
                    "SELECT l.crm_id, a.crm_user_id FROM assignments a "
                    "JOIN leads l ON l.id = a.lead_id ORDER BY a.id"
                )
            )
        ]


def test_a_waiting_batch_reads_what_the_lock_holder_committed(engine: Engine) -> None:
    """The waiter's call took its first snapshot before it waited for the team's lock, when
    the holder's three picks were not committed; it reads the seats in a second statement,
    with a snapshot taken under the lock, so it goes on where the holder stopped (Val, then
    Quinn and Rae), and its decisions show the holder's picks."""
    first, second, answered = _behind_a_batch(engine)
    assert answered == [True, True]
    assert [o.owner_id for o in first] == ["005Q1", "005Q2", "005Q3"]
    assert not isinstance(second, BaseException)
    assert [o.owner_id for o in second] == ["005Q4", "005Q1", "005Q2"]
    with engine.connect() as c:
        counts = (
            c.execute(
                text(
                    "SELECT d.detail -> 'seats' -> 'counts' FROM decision_details d "
                    "JOIN leads l ON l.id = d.lead_id WHERE l.crm_id LIKE '00Qw%' "
                    "ORDER BY l.crm_id"
                )
            )
            .scalars()
            .all()
        )
        turns = c.execute(text("SELECT assigned_in_epoch FROM members ORDER BY position"))
        assert turns.scalars().all() == [2, 2, 1, 1]
    assert counts == [[1, 1, 1, 0], [1, 1, 1, 1], [2, 1, 1, 1]]


def test_a_batch_whose_team_was_retired_while_it_waited_is_refused(engine: Engine) -> None:
    """A config apply retired team q while the batch waited for its lock: the call does not
    lock it (in_config is checked again on the row's newest version) and leaves the batch to
    the general path, which refuses it with RoutingError; the waiter's transaction rolls back
    and none of its leads is stored."""
    first, second, answered = _behind_a_batch(engine, "UPDATE teams SET in_config = false")
    assert answered == [True, False]
    assert isinstance(second, RoutingError), second
    assert "is not in the database" in str(second)
    assert [o.status for o in first] == ["assigned"] * 3
    assert _owners(engine) == [("00Qh0", "005Q1"), ("00Qh1", "005Q2"), ("00Qh2", "005Q3")]
    with engine.connect() as c:
        assert c.execute(text("SELECT count(*) FROM leads WHERE crm_id LIKE '00Qw%'")).scalar() == 0


def test_a_rep_away_by_command_while_the_batch_waited_is_skipped(engine: Engine) -> None:
    """`connector rep away` (``set_away``) for Val queues for team q's lock before the batch
    does: it writes the team row, then the time off. The batch's first statement took its
    snapshot before that commit, so its checks before the lock pass and it locks the team;
    its second statement sees the time off under the lock, writes nothing and leaves the
    batch to the general path in the same transaction, with the lock held, which judges it
    at the time it reads under the lock (the router's clock moves a minute at each read:
    the holder's batch read it once, the waiter before its call and again under the lock).
    Val, who was owed the next lead, is skipped; each lead is stored once, and its decision
    names Val as away by command and the time read under the lock."""
    reads = iter(MONDAY + timedelta(minutes=i) for i in range(10))

    def away(cfg: OrgConfig) -> None:
        set_away(engine, cfg, resolve_rep(cfg, "Val"), MONDAY + timedelta(hours=2), None, MONDAY)

    first, second, answered = _behind_a_batch(
        engine,
        queued_first=away,
        queued_like="%UPDATE teams SET updated_at%",
        clock=lambda: next(reads),
    )
    assert answered == [True, False]
    assert not isinstance(second, BaseException)
    assert [o.owner_id for o in second] == ["005Q1", "005Q2", "005Q3"]
    assert [o.candidates[3][1] for o in second] == ["away"] * 3
    assert [o.owner_id for o in first] == ["005Q1", "005Q2", "005Q3"]
    with engine.connect() as c:
        rows = c.execute(
            text(
                "SELECT l.crm_id, count(a.id) AS n, "
                "(SELECT d.detail -> 'away_by_command' FROM decision_details d "
                " WHERE d.lead_id = l.id) AS away, "
                "(SELECT d.detail ->> 'at' FROM decision_details d WHERE d.lead_id = l.id) AS at "
                "FROM leads l LEFT JOIN assignments a ON a.lead_id = l.id "
                "WHERE l.crm_id LIKE '00Qw%' GROUP BY l.id ORDER BY l.crm_id"
            )
        ).all()
    at = (MONDAY + timedelta(minutes=2)).isoformat()
    assert [(r.n, r.away, r.at) for r in rows] == [(1, ["005Q4"], at)] * 3
