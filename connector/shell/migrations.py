"""The schema's migrations: the versioned ones of db/migrations/ and the server code of
db/functions/ applied under one advisory lock, patient with tables another session holds
(``migrate``), and whether a database is behind them (``pending_migrations``,
``functions_behind``).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable

from sqlalchemy import Connection, Engine, text

import db
from connector.core.config import ConfigError
from connector.core.errors import Conflict, DatabaseError

log = logging.getLogger(__name__)

LOCK_NOT_AVAILABLE = "55P03"  # SQLSTATE of a lock_timeout

MIGRATION_LOCK_TIMEOUT_S = 5.0  # each wait of a migration for a table's lock
MIGRATION_LOCK_PATIENCE_S = 300.0  # no attempt starts this long after the first that waited
MIGRATION_RETRY_PAUSE_S = 10.0  # between attempts, the tables are free for everyone else


def migrate(
    engine: Engine,
    *,
    lock_timeout_s: float = MIGRATION_LOCK_TIMEOUT_S,
    patience_s: float = MIGRATION_LOCK_PATIENCE_S,
    pause_s: float = MIGRATION_RETRY_PAUSE_S,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> list[int]:
    """Apply pending migrations, then the server functions; safe to run from several
    processes at once. Returns the versions applied now.

    The schema is the versioned migrations of db/migrations/ (tables, indexes, constraints;
    the first is the baseline) and the files of db/functions/ (functions, views, triggers),
    which `apply_functions` applies on every run, after the migrations. A database recorded
    at a version before the baseline is refused (ConfigError): no release shipped one.

    One session-level advisory lock is held for the whole run, so concurrent callers wait
    for each other and the later ones find nothing left to do; every migration runs in its
    own transaction, and the functions in one more. A step that waits more than
    ``lock_timeout_s`` for a table's lock (a long transaction holds it: a report, a
    forgotten BEGIN) is rolled back and tried again after ``pause_s``, so that the
    statements queued behind its lock request run meanwhile (the other callers keep waiting
    for the advisory lock, rather than taking turns at the table). Once an attempt would
    start more than ``patience_s`` after the first one that failed so, the Conflict
    (SQLSTATE 55P03) is raised.
    """
    if round(lock_timeout_s * 1000) < 1:  # 0 would turn the timeout off
        raise ValueError(f"lock_timeout_s must be at least 1 ms, not {lock_timeout_s!r}")
    q = db.queries("migrate")
    applied_now: list[int] = []
    first_wait: float | None = None

    def patiently(what: str, step: Callable[[], bool]) -> bool:
        """``step()``, tried again after a lock timeout while the run's patience lasts."""
        nonlocal first_wait
        while True:
            try:
                return step()
            except Conflict as exc:
                now = clock()
                first_wait = now - lock_timeout_s if first_wait is None else first_wait
                if exc.sqlstate != LOCK_NOT_AVAILABLE or (now + pause_s - first_wait > patience_s):
                    raise
                log.warning(
                    "%s: a table it changes stayed locked by another session for %gs (a long"
                    " transaction?); trying again in %gs",
                    what,
                    lock_timeout_s,
                    pause_s,
                )
                sleep(pause_s)

    with engine.connect() as conn:
        conn.execute(text(q["lock"]))
        conn.commit()
        try:
            patiently("schema_migrations", functools.partial(_check_version, conn, lock_timeout_s))
            for migration in db.migrations():
                if patiently(
                    f"migration {migration.version:04d}_{migration.name}",
                    functools.partial(_apply, conn, migration, lock_timeout_s),
                ):
                    applied_now.append(migration.version)
            patiently(
                "server functions (db/functions)",
                functools.partial(apply_functions, conn, lock_timeout_s),
            )
        finally:
            _unlock(conn, q["unlock"])
    return applied_now


def _begin(conn: Connection, lock_timeout_s: float) -> None:
    """The start of each of migrate's transactions: its lock timeout, and the version table."""
    q = db.queries("migrate")
    conn.execute(text(q["lock_timeout"]), {"lock_timeout": f"{round(lock_timeout_s * 1000)}ms"})
    conn.execute(text(q["create_version_table"]))


def _check_version(conn: Connection, lock_timeout_s: float) -> bool:
    """Refuse a database recorded at a version before the baseline; a database at the
    baseline keeps only the baseline's row of schema_migrations."""
    q = db.queries("migrate")
    with conn.begin():
        _begin(conn, lock_timeout_s)
        done = {row[0] for row in conn.execute(text(q["applied"]))}
        if done and db.BASELINE not in done:
            raise ConfigError(
                f"this database's schema is at version {max(done)}, before the baseline"
                f" {db.BASELINE:04d} (no release shipped it): build a new database"
            )
        if min(done, default=db.BASELINE) < db.BASELINE:
            baseline = db.migrations()[0]
            conn.execute(text(q["tidy_baseline"]), {"baseline": baseline.version})
            conn.execute(
                text(q["name_baseline"]), {"baseline": baseline.version, "name": baseline.name}
            )
    return True


def run_script(conn: Connection, sql: str) -> None:
    """Run a file of SQL statements as written. The driver reads ``%`` as the start of a
    placeholder in every statement sent through it (``format('%s', x)`` would reach the
    server as ``format('$1', x)``, and ``RAISE NOTICE '%'`` would be refused), so each is
    doubled."""
    conn.exec_driver_sql(sql.replace("%", "%%"))


def _apply(conn: Connection, migration: db.Migration, lock_timeout_s: float) -> bool:
    """Apply one migration in a transaction of its own, unless it is applied already;
    whether it was applied now."""
    q = db.queries("migrate")
    with conn.begin():
        _begin(conn, lock_timeout_s)
        done = {row[0] for row in conn.execute(text(q["applied"]))}
        if migration.version in done:
            return False
        run_script(conn, migration.sql)
        conn.execute(text(q["record"]), {"version": migration.version, "name": migration.name})
    log.info("applied migration %04d_%s", migration.version, migration.name)
    return True


def apply_functions(conn: Connection, lock_timeout_s: float) -> bool:
    """Make the schema's functions, views and triggers exactly those of db/functions/, in
    one transaction (migrate runs it under its advisory lock, after the migrations).

    The files are run in file-name order; each defines its objects with CREATE OR REPLACE,
    which rewrites the object's catalog row (pg_proc, pg_class, pg_trigger) even when
    nothing in it changed, so that row's xmin becomes this transaction's id. Every other
    function, view or trigger of the schema (current_schema()) is then one the files no
    longer define, and is dropped (db/migrate.sql obsolete_server_code): deleting a function
    from its file deletes it from every database at the next migrate. Objects that belong to
    an extension, and functions another object requires (a type's), are left alone. No
    DROP cascades: an obsolete object that a defined one still uses stops the migrate.

    The files' digest is recorded in schema_functions, for `functions_behind`.

    CREATE OR REPLACE cannot change a function's result type or parameter names, nor drop a
    view's column: a file that does so puts ``DROP ... IF EXISTS`` before its CREATE.
    CREATE OR REPLACE TRIGGER takes the table's SHARE ROW EXCLUSIVE lock, which waits for
    the table's writers (bounded by the lock timeout, like a migration).
    """
    q = db.queries("migrate")
    files = db.functions()
    with conn.begin():
        _begin(conn, lock_timeout_s)
        for f in files:
            run_script(conn, f.sql)
        for statement in conn.execute(text(q["obsolete_server_code"])).scalars().all():
            log.info("dropping %s: db/functions/ no longer defines it", statement[5:])
            conn.exec_driver_sql(statement)
        conn.execute(text(q["create_functions_table"]))
        conn.execute(text(q["clear_functions_digest"]))
        conn.execute(text(q["record_functions_digest"]), {"digest": db.functions_digest(files)})
    return True


def _unlock(conn: Connection, sql: str) -> None:
    """Release the run's advisory lock. When that fails, the connection is closed instead
    (which releases it too), so that no pooled connection keeps it."""
    try:
        if conn.in_transaction():
            conn.rollback()
        conn.execute(text(sql))
        conn.commit()
    except DatabaseError as exc:
        log.debug("migration lock released by closing its connection: %s", exc)
        conn.invalidate()


def pending_migrations(engine: Engine) -> list[int]:
    q = db.queries("migrate")
    with engine.connect() as conn:
        exists = conn.execute(text("SELECT to_regclass('schema_migrations')")).scalar()
        done = {r[0] for r in conn.execute(text(q["applied"]))} if exists else set()
    return [m.version for m in db.migrations() if m.version not in done]


def functions_behind(engine: Engine) -> bool:
    """Whether the database's server code is not the one db/functions/ holds now (the
    functions step has not run since the files changed)."""
    q = db.queries("migrate")
    with engine.connect() as conn:
        if conn.execute(text("SELECT to_regclass('schema_functions')")).scalar() is None:
            return True
        stored = conn.execute(text(q["functions_digest"])).scalars().all()
    return stored != [db.functions_digest(db.functions())]
