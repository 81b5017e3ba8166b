"""The database error boundary (connector.core.errors and connector.core.database): the
SQLSTATE table, and each class of failure provoked on a real PostgreSQL and seen as the
connector's own error."""

from __future__ import annotations

import ast
import logging
import threading
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import Connection, Engine, text
from sqlalchemy.engine import make_url

from connector.core.config import OrgConfig
from connector.core.database import (
    StatementPool,
    create_engine,
    is_boundary_engine,
    one_statement,
    statement_pool,
)
from connector.core.errors import Conflict, DatabaseError, DatabaseUnavailable, error_class
from connector.routing import assign
from connector.routing.assign import Lead, Router
from connector.routing.teams import apply_teams
from connector.shell.store import make_engine, sqlalchemy_url
from testbed.pg import DatabaseFactory
from testbed.waiting import wait_until

ROOT = Path(__file__).resolve().parent.parent
EMAIL = "ada.lovelace@example.com"

# --- the pure table ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sqlstate", "lost", "connecting", "expected"),
    [
        ("23505", False, False, Conflict),  # unique_violation
        ("40001", False, False, Conflict),  # serialization_failure
        ("40P01", False, False, Conflict),  # deadlock_detected
        ("55P03", False, False, Conflict),  # lock_not_available (NOWAIT, lock_timeout)
        ("08000", False, False, DatabaseUnavailable),  # connection_exception
        ("08006", False, False, DatabaseUnavailable),  # connection_failure
        ("08P01", False, False, DatabaseUnavailable),  # protocol_violation
        ("57P01", False, False, DatabaseUnavailable),  # admin_shutdown (terminated backend)
        ("57P02", False, False, DatabaseUnavailable),  # crash_shutdown
        ("57P03", False, False, DatabaseUnavailable),  # cannot_connect_now (starting up)
        ("53300", False, False, DatabaseUnavailable),  # too_many_connections
        ("53100", False, False, DatabaseUnavailable),  # disk_full
        ("57014", False, False, DatabaseError),  # query_canceled (statement_timeout)
        ("23503", False, False, DatabaseError),  # foreign_key_violation: a bug, not a race
        ("22P02", False, False, DatabaseError),  # invalid_text_representation
        ("42P01", False, False, DatabaseError),  # undefined_table
        ("25P02", False, False, DatabaseError),  # in_failed_sql_transaction
        (None, False, False, DatabaseError),  # a driver-side error (bad parameters)
        (None, False, True, DatabaseUnavailable),  # refused, unknown host, FATAL at connect
        (None, True, False, DatabaseUnavailable),  # the connection broke mid-statement
        ("23505", True, False, DatabaseUnavailable),  # a lost connection outranks the code
        ("42P01", True, False, DatabaseUnavailable),
    ],
)
def test_error_class_table(
    sqlstate: str | None, lost: bool, connecting: bool, expected: type[DatabaseError]
) -> None:
    assert error_class(sqlstate, connection_lost=lost, connecting=connecting) is expected


def test_hierarchy() -> None:
    assert issubclass(Conflict, DatabaseError) and issubclass(DatabaseUnavailable, DatabaseError)
    assert not issubclass(Conflict, DatabaseUnavailable)
    assert not issubclass(DatabaseUnavailable, Conflict)


# --- the boundary is the only place -----------------------------------------------------------


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def test_driver_errors_are_imported_by_the_boundary_only() -> None:
    forbidden = ("sqlalchemy.exc", "sqlalchemy.pool", "psycopg", "sqlalchemy.create_engine")
    offenders = {
        str(path.relative_to(ROOT)): sorted(
            n for n in _imports(path) if n == "psycopg" or n.startswith(forbidden)
        )
        for path in (ROOT / "connector").rglob("*.py")
        # arrays.py holds the driver's list dumper (psycopg's adaptation API, no errors)
        if path.relative_to(ROOT / "connector").as_posix()
        not in ("core/errors.py", "core/database.py", "core/arrays.py")
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_make_engine_goes_through_the_boundary(db_url: str) -> None:
    engine = make_engine(db_url)
    try:
        assert is_boundary_engine(engine)
        engine.dispose()  # a recreated pool keeps its class
        assert is_boundary_engine(engine)
    finally:
        engine.dispose()


# --- each class, provoked on the real server ---------------------------------------------------


@pytest.fixture
def boundary_engine(db_url: str) -> Iterator[Engine]:
    eng = make_engine(db_url, pool_size=2)
    yield eng
    eng.dispose()


def _scratch(conn: Connection) -> None:
    conn.execute(text("CREATE TABLE IF NOT EXISTS scratch (email text PRIMARY KEY, n int)"))


def test_unique_violation_is_a_conflict_without_the_value(boundary_engine: Engine) -> None:
    with boundary_engine.begin() as conn:
        _scratch(conn)
        conn.execute(text("INSERT INTO scratch VALUES (:e, 1)"), {"e": EMAIL})
    with pytest.raises(Conflict) as info, boundary_engine.begin() as conn:
        conn.execute(text("INSERT INTO scratch VALUES (:e, 2)"), {"e": "other@example.com"})
        conn.execute(text("INSERT INTO scratch VALUES (:e, 3)"), {"e": EMAIL})
    err = info.value
    assert str(err) == (
        "database conflict: UniqueViolation (SQLSTATE 23505) on constraint scratch_pkey"
    )
    assert (err.sqlstate, err.constraint, err.connection_invalidated) == (
        "23505",
        "scratch_pkey",
        False,
    )
    assert isinstance(err.__cause__, psycopg.errors.UniqueViolation)
    assert EMAIL in str(err.__cause__)  # the driver's text has it; ours does not
    assert "example.com" not in str(err)
    with boundary_engine.connect() as conn:  # rolled back: nothing of it was stored
        rows = conn.execute(text("SELECT email, n FROM scratch ORDER BY n")).all()
    assert [tuple(r) for r in rows] == [(EMAIL, 1)]


@pytest.mark.parametrize("how", ["nowait", "lock_timeout"])
def test_a_row_lock_not_granted_is_a_conflict(boundary_engine: Engine, how: str) -> None:
    with boundary_engine.begin() as conn:
        _scratch(conn)
        conn.execute(text("INSERT INTO scratch VALUES (:e, 1)"), {"e": EMAIL})
    with boundary_engine.begin() as holder:
        holder.execute(text("SELECT 1 FROM scratch FOR UPDATE")).all()
        with pytest.raises(Conflict) as info, boundary_engine.begin() as waiter:
            if how == "nowait":
                waiter.execute(text("SELECT 1 FROM scratch FOR UPDATE NOWAIT")).all()
            else:
                waiter.execute(text("SET LOCAL lock_timeout = '20ms'"))
                waiter.execute(text("UPDATE scratch SET n = 2"))
    assert info.value.sqlstate == "55P03"
    assert str(info.value) == "database conflict: LockNotAvailable (SQLSTATE 55P03)"
    with boundary_engine.connect() as conn:
        assert conn.execute(text("SELECT n FROM scratch")).scalar_one() == 1


def test_a_serialization_failure_is_a_conflict(boundary_engine: Engine) -> None:
    with boundary_engine.begin() as conn:
        _scratch(conn)
        conn.execute(text("INSERT INTO scratch VALUES (:e, 1)"), {"e": EMAIL})
    first = boundary_engine.connect().execution_options(isolation_level="REPEATABLE READ")
    with pytest.raises(Conflict) as info, first, first.begin():
        first.execute(text("SELECT n FROM scratch")).all()  # the snapshot is taken
        with boundary_engine.begin() as second:
            second.execute(text("UPDATE scratch SET n = 2"))
        first.execute(text("UPDATE scratch SET n = 3"))
    assert info.value.sqlstate == "40001"
    with boundary_engine.connect() as conn:
        assert conn.execute(text("SELECT n FROM scratch")).scalar_one() == 2


def test_other_errors_are_plain_database_errors(boundary_engine: Engine) -> None:
    with pytest.raises(DatabaseError) as info, boundary_engine.connect() as conn:
        conn.execute(text("SELECT * FROM no_such_table WHERE x = :x"), {"x": EMAIL})
    assert type(info.value) is DatabaseError
    assert str(info.value) == "database error: UndefinedTable (SQLSTATE 42P01)"
    assert not info.value.connection_invalidated


def _backend_pid(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT pg_backend_pid()")).scalar_one())


def _terminate(databases: DatabaseFactory, pid: int) -> None:
    """Terminate a backend from another connection and wait until it is gone."""
    with databases.admin.connect() as conn:
        done = conn.execute(text("SELECT pg_terminate_backend(:pid, 10000)"), {"pid": pid})
        assert done.scalar_one() is True


def test_a_terminated_backend_is_unavailable_with_an_invalidated_connection(
    databases: DatabaseFactory, db_url: str
) -> None:
    engine = make_engine(db_url, pool_size=1)
    try:
        pid = _backend_pid(engine)  # that connection now waits in the pool
        _terminate(databases, pid)
        with pytest.raises(DatabaseUnavailable) as info, engine.begin() as conn:
            conn.execute(text("SELECT 1"))
        assert info.value.connection_invalidated
        assert isinstance(info.value.__cause__, psycopg.OperationalError)
        assert str(info.value).startswith("database unavailable: ")
        assert _backend_pid(engine) != pid  # the next checkout is a fresh connection
    finally:
        engine.dispose()


def test_pre_ping_still_reconnects_quietly(databases: DatabaseFactory, db_url: str) -> None:
    """The hook leaves pre-ping failures to the pool, which replaces the connection."""
    engine = create_engine(sqlalchemy_url(db_url), pool_size=1, pool_pre_ping=True)
    try:
        pid = _backend_pid(engine)
        _terminate(databases, pid)
        assert _backend_pid(engine) != pid
    finally:
        engine.dispose()


def test_a_refused_connection_is_unavailable() -> None:
    engine = make_engine("postgresql://postgres@127.0.0.1:1/nowhere")
    try:
        with pytest.raises(DatabaseUnavailable) as info:
            engine.connect()
    finally:
        engine.dispose()
    err = info.value
    assert not err.connection_invalidated and err.sqlstate is None
    assert str(err).startswith("database unavailable: connection failed: ")
    assert "port 1 failed: Connection refused" in str(err)
    assert "\n" not in str(err)
    assert isinstance(err.__cause__, psycopg.OperationalError)


def test_a_pool_timeout_is_unavailable(db_url: str) -> None:
    engine = create_engine(sqlalchemy_url(db_url), pool_size=1, max_overflow=0, pool_timeout=0.01)
    try:
        with engine.connect(), pytest.raises(DatabaseUnavailable) as info:
            engine.connect()
        assert str(info.value) == "database unavailable: no pooled connection became free in time"
        assert not info.value.connection_invalidated
        with engine.connect() as conn:  # freed: the pool works again
            assert conn.execute(text("SELECT 1")).scalar_one() == 1
    finally:
        engine.dispose()


# --- assign_many's retry on a fresh connection ------------------------------------------------


def _owners(engine: Engine) -> list[tuple[str, int, int]]:
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT l.crm_id, "
                "(SELECT count(*) FROM assignments a WHERE a.lead_id = l.id), "
                "(SELECT count(*) FROM outbox o WHERE o.lead_id = l.id) FROM leads l"
            )
        ).all()
    return [(r[0], int(r[1]), int(r[2])) for r in rows]


def test_assign_many_retries_once_on_a_terminated_backend(
    databases: DatabaseFactory,
    db_url: str,
    sample_cfg: OrgConfig,
    caplog: pytest.LogCaptureFixture,
) -> None:
    engine = make_engine(db_url, pool_size=1)
    try:
        apply_teams(engine, sample_cfg)
        _terminate(databases, _backend_pid(engine))
        with caplog.at_level(logging.WARNING, logger="connector.routing.assign"):
            outcomes = Router(engine, sample_cfg).assign_many(
                [Lead("00Q5g00000Retry1", {"Country": "US"})], "api"
            )
        retries = [r.getMessage() for r in caplog.records if "retrying" in r.getMessage()]
        assert retries == ["database connection lost; retrying (attempt 2)"]
        assert [(o.status, o.team) for o in outcomes] == [("assigned", "na_ae")]
        assert outcomes[0].owner_id is not None
        assert _owners(engine) == [(outcomes[0].crm_id, 1, 1)]  # exactly one owner
    finally:
        engine.dispose()


def test_without_the_retry_the_same_scenario_fails(
    databases: DatabaseFactory,
    db_url: str,
    sample_cfg: OrgConfig,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The scenario above really hits a dead connection: one attempt is not enough."""
    monkeypatch.setattr(assign, "RECONNECT_ATTEMPTS", 1)
    engine = make_engine(db_url, pool_size=1)
    try:
        apply_teams(engine, sample_cfg)
        _terminate(databases, _backend_pid(engine))
        with pytest.raises(DatabaseUnavailable):
            Router(engine, sample_cfg).assign_many(
                [Lead("00Q5g00000Retry1", {"Country": "US"})], "api"
            )
        assert _owners(engine) == []
    finally:
        engine.dispose()


def test_a_conflict_is_not_retried_by_assign_many(
    databases: DatabaseFactory,
    db_url: str,
    sample_cfg: OrgConfig,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Only a lost connection is retried: a team lock not granted surfaces at once."""
    name = make_url(db_url).database
    with databases.admin.connect() as conn:
        conn.execute(text(f"ALTER DATABASE {name} SET lock_timeout = '20ms'"))
    engine = make_engine(db_url, pool_size=2)
    try:
        apply_teams(engine, sample_cfg)
        with engine.begin() as holder:
            holder.execute(text("SELECT 1 FROM teams FOR UPDATE")).all()
            with (
                caplog.at_level(logging.WARNING, logger="connector.routing.assign"),
                pytest.raises(Conflict) as info,
            ):
                Router(engine, sample_cfg).assign_many(
                    [Lead("00Q5g00000Lockd1", {"Country": "US"})], "api"
                )
        assert info.value.sqlstate == "55P03"
        assert not [r for r in caplog.records if "retrying" in r.getMessage()]
        assert _owners(engine) == []
    finally:
        engine.dispose()


# --- the single-lead call: one statement straight through the driver ---------------------------


def test_assign_single_call_retries_once_on_a_terminated_backend(
    databases: DatabaseFactory,
    db_url: str,
    sample_cfg: OrgConfig,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Router.assign sends one statement through the driver, on a connection of the engine's
    statement pool (one_statement); a dead one is translated, dropped and retried, as
    assign_many's pooled connection is."""
    engine = make_engine(db_url, pool_size=1)
    try:
        apply_teams(engine, sample_cfg)
        router = Router(engine, sample_cfg)
        router.assign(Lead("00Q5g00000First1", {"Country": "US"}), "api")
        (pid,) = one_statement(engine, "SELECT pg_backend_pid()", {}) or ()
        assert statement_pool(engine).idle() == 1  # the call's connection, the same one
        _terminate(databases, pid)
        with caplog.at_level(logging.WARNING, logger="connector.routing.assign"):
            outcome = router.assign(Lead("00Q5g00000Retry2", {"Country": "US"}), "api")
        retries = [r.getMessage() for r in caplog.records if "retrying" in r.getMessage()]
        assert retries == ["database connection lost; retrying (attempt 2)"]
        assert (outcome.status, outcome.team) == ("assigned", "na_ae")
        assert [o[1:] for o in _owners(engine)] == [(1, 1), (1, 1)]
        assert one_statement(engine, "SELECT pg_backend_pid()", {}) != (pid,)
    finally:
        engine.dispose()


def _statement_connections(engine: Engine, n: int) -> list[int]:
    """Make the statement pool of ``engine`` open ``n`` connections (n calls at once, each
    held on an advisory lock until all n are waiting) and return their backends' pids."""
    pids: list[int] = []
    sql = "SELECT pg_backend_pid() FROM (SELECT pg_advisory_xact_lock_shared(4244)) x"
    with engine.connect() as blocker:  # advisory locks are the database's: this one's
        blocker.execute(text("SELECT pg_advisory_lock(4244)"))
        threads = [
            threading.Thread(
                target=lambda: pids.append(int((one_statement(engine, sql, {}) or (0,))[0]))
            )
            for _ in range(n)
        ]
        for t in threads:
            t.start()
        wait_until(
            lambda: (
                blocker.execute(
                    text(
                        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                        "AND objid = 4244 AND NOT granted"
                    )
                ).scalar_one()
                == n
            ),
            10,
            f"{n} calls to wait on the advisory lock",
        )
        blocker.execute(text("SELECT pg_advisory_unlock(4244)"))
        blocker.commit()
        for t in threads:
            t.join()
    assert len(set(pids)) == n and statement_pool(engine).idle() == n
    return pids


def test_single_call_after_every_pooled_connection_died_retries_only_once(
    databases: DatabaseFactory,
    db_url: str,
    sample_cfg: OrgConfig,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A server restart kills every idle connection at once: the statement pool's and the
    engine pool's. The first dead one the single call meets marks every connection opened
    before then stale, in both pools (as SQLAlchemy invalidates its pool on a disconnect),
    so the retry opens a fresh connection instead of taking the next dead one: idle dead
    connections and three attempts would otherwise end in DatabaseUnavailable."""
    engine = make_engine(db_url, pool_size=4)
    try:
        apply_teams(engine, sample_cfg)
        pids = _statement_connections(engine, 2)
        conns = [engine.connect() for _ in range(4)]  # the engine pool: four idle ones
        pids += [int(c.execute(text("SELECT pg_backend_pid()")).scalar_one()) for c in conns]
        for c in conns:
            c.close()
        for pid in pids:
            _terminate(databases, pid)
        with caplog.at_level(logging.WARNING, logger="connector.routing.assign"):
            outcome = Router(engine, sample_cfg).assign(
                Lead("00Q5g00000Restart", {"Country": "US"}), "api"
            )
        retries = [r.getMessage() for r in caplog.records if "retrying" in r.getMessage()]
        assert retries == ["database connection lost; retrying (attempt 2)"]
        assert (outcome.status, outcome.team) == ("assigned", "na_ae")
        assert _owners(engine) == [(outcome.crm_id, 1, 1)]
        assert statement_pool(engine).idle() == 1  # the fresh one; the dead ones are closed
        with engine.connect() as conn:  # and the engine pool hands out a live one
            assert int(conn.execute(text("SELECT pg_backend_pid()")).scalar_one()) not in pids
    finally:
        engine.dispose()


def test_a_pinging_engines_statement_pool_pings_before_reuse(
    databases: DatabaseFactory, db_url: str
) -> None:
    """An engine made with pool_pre_ping: its statement pool replaces a connection that
    died while idle before using it, so the call succeeds without a retry."""
    url = sqlalchemy_url(db_url)
    engine = create_engine(url, pool_pre_ping=True, pool_size=1)
    try:
        (pid,) = one_statement(engine, "SELECT pg_backend_pid()", {}) or ()
        _terminate(databases, pid)
        assert one_statement(engine, "SELECT pg_backend_pid()", {}) not in (None, (pid,))
    finally:
        engine.dispose()


def test_the_statement_pool_is_bounded_and_closed_by_dispose(db_url: str) -> None:
    """The statement pool opens at most the engine pool's size plus overflow: a caller past
    that waits for a connection to come back (here longer than the timeout:
    DatabaseUnavailable, nothing run). engine.dispose() closes its idle connections; the
    next call opens one."""
    engine = make_engine(db_url, pool_size=2)
    try:
        pool = statement_pool(engine)
        assert (pool.size, pool.timeout) == (4, 30.0)
        small = StatementPool(engine, 1, 0.2, 1800.0)
        with engine.connect() as blocker:
            blocker.execute(text("SELECT pg_advisory_lock(4242)"))
            holder = threading.Thread(target=small.run, args=("SELECT pg_advisory_lock(4242)", {}))
            holder.start()  # takes the only slot, then waits for the advisory lock
            wait_until(
                lambda: blocker.execute(
                    text(
                        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
                    )
                ).scalar_one(),
                10,
                "the holder to wait for the advisory lock",
            )
            with pytest.raises(DatabaseUnavailable) as info:
                small.run("SELECT 1 / 0", {})
            assert str(info.value) == (
                "database unavailable: no pooled connection became free in time"
            )
            blocker.execute(text("SELECT pg_advisory_unlock(4242)"))
            blocker.commit()
            holder.join()
        assert small.idle() == 1
        small.close()
        assert small.idle() == 0
        assert one_statement(engine, "SELECT 1", {}) == (1,) and pool.idle() == 1
        engine.dispose()
        assert pool.idle() == 0
        assert one_statement(engine, "SELECT 2", {}) == (2,) and pool.idle() == 1
    finally:
        engine.dispose()


def test_a_statement_pool_connection_older_than_recycle_is_replaced(db_url: str) -> None:
    engine = make_engine(db_url, pool_size=1)
    try:
        keep = StatementPool(engine, 1, 5.0, 1800.0)
        (first,) = keep.run("SELECT pg_backend_pid()", {}) or ()
        assert keep.run("SELECT pg_backend_pid()", {}) == (first,)  # reused
        renew = StatementPool(engine, 1, 5.0, 0.0)  # every connection is too old when reused
        (second,) = renew.run("SELECT pg_backend_pid()", {}) or ()
        assert renew.run("SELECT pg_backend_pid()", {}) != (second,)
        assert renew.idle() == 1
        keep.close()
        renew.close()
    finally:
        engine.dispose()


def test_one_statement_translates_errors_and_leaves_the_engines_pool_alone(
    boundary_engine: Engine,
) -> None:
    with pytest.raises(DatabaseError) as info:
        one_statement(boundary_engine, "SELECT 1 / %(zero)s", {"zero": 0})
    assert type(info.value) is DatabaseError and info.value.sqlstate == "22012"
    assert str(info.value) == "database error: DivisionByZero (SQLSTATE 22012)"
    # the connection stays in the statement pool after a statement error, and is reused
    assert statement_pool(boundary_engine).idle() == 1
    assert one_statement(boundary_engine, "SELECT %(x)s::int + 1", {"x": 41}) == (42,)
    assert statement_pool(boundary_engine).idle() == 1
    # the engine's own pool still hands out transactions, not autocommit
    with boundary_engine.connect() as conn:
        conn.execute(text("SELECT 1"))
        assert conn.connection.driver_connection.autocommit is False  # type: ignore[union-attr]
        conn.rollback()
