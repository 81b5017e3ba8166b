"""Migrations: they build exactly db/schema.sql, are idempotent, and safe to run at once."""

from __future__ import annotations

import multiprocessing as mp
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, text

import db
from connector.store import make_engine, migrate, pending_migrations
from tests.pg import DatabaseFactory, with_database

CATALOG = {
    "columns": """
        SELECT table_name, column_name, ordinal_position, data_type, udt_name,
               column_default, is_nullable, character_maximum_length, numeric_precision
        FROM information_schema.columns WHERE table_schema = 'public'
        ORDER BY table_name, ordinal_position
    """,
    "indexes": """
        SELECT tablename, indexname, indexdef FROM pg_indexes WHERE schemaname = 'public'
        ORDER BY tablename, indexname
    """,
    "constraints": """
        SELECT c.conrelid::regclass::text AS tbl, c.conname, c.contype,
               pg_get_constraintdef(c.oid) AS def
        FROM pg_constraint c JOIN pg_namespace n ON n.oid = c.connamespace
        WHERE n.nspname = 'public'
        ORDER BY 1, 2
    """,
    "sequences": """
        SELECT sequence_name, data_type, start_value, increment FROM information_schema.sequences
        WHERE sequence_schema = 'public' ORDER BY sequence_name
    """,
    "relations": """
        SELECT c.relname, c.relkind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = 'public' ORDER BY c.relname
    """,
    "versions": "SELECT version, name FROM schema_migrations ORDER BY version",
}


def blank_database(databases: DatabaseFactory, tag: str) -> str:
    """An empty database (no migrations), dropped with the others at the end of the session."""
    name = f"{databases.prefix}_blank_{tag}"
    with databases.admin.connect() as conn:
        conn.execute(text(f"CREATE DATABASE {name}"))
    databases.created.append(name)
    return with_database(databases.url, name)


@pytest.fixture
def blank(databases: DatabaseFactory, request: pytest.FixtureRequest) -> Iterator[Engine]:
    eng = make_engine(blank_database(databases, request.node.name.lower()[:30]), pool_size=1)
    yield eng
    eng.dispose()


def catalog(engine: Engine) -> dict[str, list[tuple[Any, ...]]]:
    with engine.connect() as conn:
        return {k: [tuple(r) for r in conn.execute(text(q))] for k, q in CATALOG.items()}


def test_migrations_produce_schema_sql(databases: DatabaseFactory, blank: Engine) -> None:
    migrated = blank
    assert migrate(migrated) == [m.version for m in db.migrations()]
    from_file = make_engine(blank_database(databases, "from_schema_sql"), pool_size=1)
    try:
        with from_file.begin() as conn:
            conn.exec_driver_sql(db.schema_sql())
        expected, got = catalog(from_file), catalog(migrated)
        assert pending_migrations(from_file) == []
    finally:
        from_file.dispose()
    for key in CATALOG:
        assert got[key] == expected[key], f"{key} differ between migrations and db/schema.sql"
    # the comparison looks at something: every table and the unique lead constraint
    tables = {r[0] for r in got["relations"] if r[1] == "r"}
    assert {"schema_migrations", "teams", "members", "leads", "assignments", "outbox"} <= tables
    assert ("assignments", "assignments_lead_id_key", "u", "UNIQUE (lead_id)") in got["constraints"]


def test_migrate_is_idempotent(blank: Engine) -> None:
    versions = [m.version for m in db.migrations()]
    assert pending_migrations(blank) == versions
    assert migrate(blank) == versions
    before = catalog(blank)
    assert migrate(blank) == []
    assert pending_migrations(blank) == []
    assert catalog(blank) == before


def _migrate_worker(url: str, barrier: Any, out: Any) -> None:
    try:
        engine = make_engine(url, pool_size=1)
        with engine.connect():
            pass
        barrier.wait(timeout=60)
        out.put(("ok", migrate(engine)))
        engine.dispose()
    except Exception as exc:  # reported to the parent, which fails the test
        out.put(("error", f"{type(exc).__name__}: {exc}"))


@pytest.mark.slow
def test_concurrent_migrate_on_a_blank_database(blank: Engine) -> None:
    url = blank.url.render_as_string(hide_password=False)
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(4)
    out = ctx.Queue()
    procs = [ctx.Process(target=_migrate_worker, args=(url, barrier, out)) for _ in range(4)]
    for p in procs:
        p.start()
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    assert [r for r in results if r[0] == "error"] == []
    versions = [m.version for m in db.migrations()]
    applied = sorted(v for r in results for v in r[1])
    assert applied == versions, "each migration is applied by exactly one process"
    assert pending_migrations(blank) == []
    with blank.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM schema_migrations")).scalar() == len(
            versions
        )
