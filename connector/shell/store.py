"""Database access: the database URL, the engine, and the database a command opens.

The database URL comes from ``DATABASE_URL``, else from the org configs' ``database_url``;
when neither is set an embedded PostgreSQL (``connector.shell.embedded_pg``) is started on a
unix socket with its data in a per-user state directory, so nothing has to be installed.
``open_database`` migrates it (``connector.shell.migrations``) and applies the configs.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping, Sequence

from sqlalchemy import Engine, text
from sqlalchemy.engine import make_url

import db
from connector.core.config import ConfigError, OrgConfig
from connector.core.database import create_engine, database_url_problem
from connector.shell.embedded_pg import APP_NAME, embedded_data_dir, start_embedded
from connector.shell.migrations import functions_behind, migrate, pending_migrations

log = logging.getLogger(__name__)


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
