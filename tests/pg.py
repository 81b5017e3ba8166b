"""Real PostgreSQL for tests: the embedded server by default, TEST_DATABASE_URL when set.

A template database is migrated once per session; each test that needs a clean state gets a
fresh copy of it (CREATE DATABASE ... TEMPLATE), which takes a few milliseconds. Each
pytest-xdist worker starts its own embedded server (its own temp data dir, a Unix socket: no
port to share).

The embedded test server runs without durability (fsync, synchronous_commit and
full_page_writes off): its data dir is thrown away, and a commit no longer waits for the disk
(measured on the shared 2-core machine: 2,000 one-row commits took 22.6 s with fsync, 9.7 s
without). Visibility, locking and isolation
are unchanged, so no guarantee a test checks depends on it; the scenario that crashes
PostgreSQL (tests/test_fault_postgres.py) runs its own server with the defaults. A server given
by TEST_DATABASE_URL is never reconfigured.
"""

from __future__ import annotations

import itertools
import os
import uuid

from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from connector.core.errors import create_engine
from connector.shell.store import (
    make_embedded_tempdir,
    make_engine,
    migrate,
    sqlalchemy_url,
    start_embedded,
)
from tests.waiting import wait_until

_counter = itertools.count()


def server_url() -> str:
    url = os.environ.get("TEST_DATABASE_URL")
    if url:
        return url
    root = make_embedded_tempdir("lrc-test-")  # as root: 0755, so no existing folder is opened
    url = start_embedded(root / "pgdata", cleanup_mode="delete")
    _without_durability(url)
    return url


NON_DURABLE = {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}


def _without_durability(url: str) -> None:
    """Turn the throw-away server's durability off (a reload, no restart)."""
    engine = create_engine(sqlalchemy_url(url), isolation_level="AUTOCOMMIT", poolclass=NullPool)
    try:
        with engine.connect() as conn:
            for name, value in NON_DURABLE.items():
                conn.execute(text(f"ALTER SYSTEM SET {name} = {value}"))
            conn.execute(text("SELECT pg_reload_conf()"))

        def applied() -> bool:  # the reload is asynchronous: a new session shows it
            with engine.connect() as conn:
                return all(
                    conn.execute(text(f"SHOW {name}")).scalar_one() == value
                    for name, value in NON_DURABLE.items()
                )

        wait_until(applied, 30, "the test server's settings to be reloaded")
    finally:
        engine.dispose()


def with_database(url: str, name: str) -> str:
    return make_url(sqlalchemy_url(url)).set(database=name).render_as_string(hide_password=False)


class DatabaseFactory:
    def __init__(self, url: str) -> None:
        self.url = url
        self.admin = create_engine(sqlalchemy_url(url), isolation_level="AUTOCOMMIT", pool_size=1)
        self.prefix = f"lrc_{uuid.uuid4().hex[:8]}"
        self.template = f"{self.prefix}_tpl"
        self._create(self.template, None)
        engine = make_engine(with_database(url, self.template), pool_size=1)
        migrate(engine)
        engine.dispose()
        self.created: list[str] = []

    def _create(self, name: str, template: str | None) -> None:
        with self.admin.connect() as conn:
            suffix = f" TEMPLATE {template}" if template else ""
            conn.execute(text(f"CREATE DATABASE {name}{suffix}"))

    def new(self) -> str:
        name = f"{self.prefix}_{next(_counter)}"
        self._create(name, self.template)
        self.created.append(name)
        return with_database(self.url, name)

    def close(self) -> None:
        """Let go of the server without dropping anything (it is about to be thrown away)."""
        self.admin.dispose()

    def drop_all(self) -> None:
        with self.admin.connect() as conn:
            for name in [*self.created, self.template]:
                conn.execute(text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        self.admin.dispose()
