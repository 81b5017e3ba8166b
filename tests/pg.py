"""Real PostgreSQL for tests: the embedded server by default, TEST_DATABASE_URL when set.

A template database is migrated once per session; each test that needs a clean state gets a
fresh copy of it (CREATE DATABASE ... TEMPLATE), which takes a few milliseconds.
"""

from __future__ import annotations

import itertools
import os
import uuid

from sqlalchemy import text
from sqlalchemy.engine import make_url

from connector.core.errors import create_engine
from connector.shell.store import (
    make_embedded_tempdir,
    make_engine,
    migrate,
    sqlalchemy_url,
    start_embedded,
)

_counter = itertools.count()


def server_url() -> str:
    url = os.environ.get("TEST_DATABASE_URL")
    if url:
        return url
    root = make_embedded_tempdir("lrc-test-")  # as root: 0755, so no existing folder is opened
    return start_embedded(root / "pgdata", cleanup_mode="delete")


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

    def drop_all(self) -> None:
        with self.admin.connect() as conn:
            for name in [*self.created, self.template]:
                conn.execute(text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        self.admin.dispose()
