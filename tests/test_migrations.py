"""Migrations: they build exactly db/schema.sql, are idempotent, and safe to run at once."""

from __future__ import annotations

import logging
import multiprocessing as mp
import random
import string
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, text

import db
from connector.core.errors import Conflict, DatabaseUnavailable
from connector.shell.store import (
    make_engine,
    migrate,
    pending_migrations,
    vacuum_warning,
    vacuum_warning_for,
)
from crm_adapters.salesforce_ids import id_key, to_18
from testbed.pg import DatabaseFactory, blank_database
from tests.helpers.blocking import wait_until_blocked

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
        SELECT c.relname, c.relkind, c.reloptions
        FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = 'public' ORDER BY c.relname
    """,
    "versions": "SELECT version, name FROM schema_migrations ORDER BY version",
    "views": """
        SELECT c.relname, pg_get_viewdef(c.oid)
        FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = 'public' AND c.relkind = 'v' ORDER BY 1
    """,
    "triggers": """
        SELECT c.relname, t.tgname, pg_get_triggerdef(t.oid)
        FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = 'public' AND NOT t.tgisinternal ORDER BY 1, 2
    """,
    # a function replaced by a migration must read the same in db/schema.sql
    "functions": """
        SELECT p.proname, pg_get_function_arguments(p.oid),
               pg_get_function_result(p.oid), l.lanname, p.provolatile, p.proisstrict,
               p.proparallel, p.prosecdef, p.proconfig, md5(p.prosrc)
        FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
        JOIN pg_language l ON l.oid = p.prolang
        WHERE n.nspname = 'public' ORDER BY 1, 2
    """,
}


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
    assert {"route_lead", "rotation_pick", "rotation_pick_plain"} <= {
        r[0] for r in got["functions"]
    }
    assert "decision_details" in {r[0] for r in got["views"]}
    assert ("members", "members_add_key") in {r[:2] for r in got["triggers"]}


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


# --- 0006: canonical Salesforce ids -----------------------------------------------------------

ID15 = "00Q5g00000LmAbC"
ID18 = "00Q5g00000LmAbCEAV"
OTHER15, OTHER18 = "00Q5g00000LmXyZ", "00Q5g00000LmXyZEAV"
ACCOUNT15, ACCOUNT18 = "0015g00000AcMeQ", "0015g00000AcMeQAAV"
MERGE_REASON = "merged into lead 2: same record by its 15- and 18-character ids"


def migrate_below(engine: Engine, version: int) -> None:
    """Apply, and record, only the migrations numbered below ``version``."""
    q = db.queries("migrate")
    with engine.begin() as conn:
        conn.execute(text(q["create_version_table"]))
        for m in db.migrations():
            if m.version < version:
                conn.exec_driver_sql(m.sql)
                conn.execute(text(q["record"]), {"version": m.version, "name": m.name})


SEED_BEFORE_0006 = """
INSERT INTO teams (id, org, name, epoch) VALUES (1, 'acme', 't', 2);
INSERT INTO members (id, team_id, crm_user_id, name, weight, position, assigned_in_epoch) VALUES
    (1, 1, '005A', 'Ada', 1, 0, 1),
    (2, 1, '005B', 'Alan', 1, 1, 2);
INSERT INTO leads (id, org, crm_object, crm_id, fields, parent_id, source) VALUES
    -- lead 1, by its 18-character id, was assigned AFTER lead 2 (its 15-character id)
    (1, 'acme', 'Lead', :id18, '{}', NULL, 'salesforce_outbound'),
    (2, 'acme', 'Lead', :id15, '{}', :account15, 'import'),
    -- the same record again, case-folded, assigned in an earlier epoch
    (3, 'acme', 'Lead', upper(:id18), '{}', NULL, 'poll'),
    -- another record, twice, never assigned
    (4, 'acme', 'Lead', :other15, '{}', NULL, 'import'),
    (5, 'acme', 'Lead', '00Q1', '{}', NULL, 'api'),
    (6, 'acme', 'Lead', :other18, '{}', NULL, 'poll'),
    -- HubSpot: a 15-digit id looks like a Salesforce id, and must stay as it is
    (7, 'globex', 'contacts', '000000000000001', '{}', '000000000000002', 'hubspot_webhook');
INSERT INTO assignments (id, lead_id, org, team_id, member_id, crm_user_id, epoch, rule_index,
                         rule_name, source, assigned_at) VALUES
    (1, 1, 'acme', 1, 2, '005B', 2, 0, 'r', 'salesforce_outbound', '2024-01-01T10:00:05Z'),
    (2, 2, 'acme', 1, 1, '005A', 2, 0, 'r', 'import', '2024-01-01T10:00:00Z'),
    (3, 3, 'acme', 1, 2, '005B', 1, 0, 'r', 'poll', '2024-01-01T10:00:09Z'),
    (5, 5, 'acme', 1, 2, '005B', 2, 0, 'r', 'api', '2024-01-01T10:00:07Z');
INSERT INTO outbox (id, org, lead_id, assignment_id, crm_object, crm_id, owner_id, parent_id,
                    state) VALUES
    (1, 'acme', 1, 1, 'Lead', :id18, '005B', NULL, 'pending'),
    (2, 'acme', 2, 2, 'Lead', :id15, '005A', :account15, 'pending'),
    (3, 'acme', 3, 3, 'Lead', upper(:id18), '005B', NULL, 'sent'),
    (5, 'acme', 5, 5, 'Lead', '00Q1', '005B', NULL, 'pending');
"""


def test_0006_converts_salesforce_ids_and_merges_duplicates(blank: Engine) -> None:
    migrate_below(blank, 6)
    params = {
        "id15": ID15,
        "id18": ID18,
        "other15": OTHER15,
        "other18": OTHER18,
        "account15": ACCOUNT15,
    }
    with blank.begin() as conn:
        for statement in SEED_BEFORE_0006.split(";"):
            if statement.strip():
                conn.execute(text(statement), params)

    assert migrate(blank) == [m.version for m in db.migrations() if m.version >= 6]

    with blank.connect() as conn:
        leads = {
            r.id: (r.crm_id, r.parent_id, r.merged_into)
            for r in conn.execute(text("SELECT * FROM leads"))
        }
        outbox = {
            r.id: (r.crm_id, r.parent_id, r.state, r.last_error, r.finished_at is not None)
            for r in conn.execute(text("SELECT * FROM outbox"))
        }
        members = {
            r[0]: r[1]
            for r in conn.execute(text("SELECT crm_user_id, assigned_in_epoch FROM members"))
        }
        live = conn.execute(
            text("SELECT id FROM leads WHERE org = 'acme' AND merged_into IS NULL ORDER BY id")
        ).scalars()
        live_ids = list(live)
    assert leads == {
        1: (ID18, None, 2),  # assigned after lead 2: merged into it
        2: (ID18, ACCOUNT18, None),  # the earliest assignment wins
        3: (ID18, None, 2),
        4: (OTHER18, None, None),  # none assigned: the lowest id wins
        5: ("00Q1", None, None),  # not a Salesforce id: as it was
        6: (OTHER18, None, 4),
        7: ("000000000000001", "000000000000002", None),  # HubSpot: untouched
    }
    assert live_ids == [2, 4, 5]
    assert outbox == {
        1: (ID18, None, "superseded", MERGE_REASON, True),
        2: (ID18, ACCOUNT18, "pending", None, False),
        3: (ID18, None, "sent", None, False),  # already written: history stays
        5: ("00Q1", None, "pending", None, False),
    }
    # lead 1's assignment (epoch 2, the current one) no longer counts for 005B; lead 3's was
    # made in epoch 1 and was never in the count
    assert members == {"005A": 1, "005B": 1}

    with blank.begin() as conn:
        # one live lead per record: a repeat is a no-op, as routing expects
        insert = text(
            "INSERT INTO leads (org, crm_object, crm_id, fields, source) "
            "VALUES ('acme', 'Lead', :crm_id, '{}', 'api') "
            "ON CONFLICT (org, crm_object, crm_id) WHERE merged_into IS NULL DO NOTHING "
            "RETURNING id"
        )
        assert conn.execute(insert, {"crm_id": ID18}).all() == []


def test_sql_salesforce_id_18_matches_python(engine: Engine) -> None:
    rng = random.Random(18)
    alphabet = string.ascii_letters + string.digits
    samples = ["", "00Q1", "00Q5g00000LmAb!", "000000000000000BAA", "00D000000000062EA9"]
    for _ in range(300):
        id15 = "".join(rng.choice(alphabet) for _ in range(15))
        id18 = to_18(id15)
        samples += [id15, id18, id18.lower(), id18.upper(), id15 + "".join(rng.sample(alphabet, 3))]
    with engine.connect() as conn:
        got = conn.execute(
            text(
                "SELECT salesforce_id_18(x) "
                "FROM unnest(CAST(:xs AS text[])) WITH ORDINALITY AS t (x, n) ORDER BY n"
            ),
            {"xs": samples},
        ).scalars()
        assert list(got) == [id_key(s) for s in samples]
        assert conn.execute(text("SELECT salesforce_id_18(NULL)")).scalar() is None


def test_a_server_whose_autovacuum_does_not_run_is_named_in_a_warning() -> None:
    assert vacuum_warning_for({"autovacuum": "on", "track_counts": "on"}) is None
    off = vacuum_warning_for({"autovacuum": "off", "track_counts": "on"})
    assert off is not None and off.startswith("PostgreSQL's autovacuum is off, so autovacuum")
    both = vacuum_warning_for({"autovacuum": "off", "track_counts": "off"})
    assert both is not None and both.startswith("PostgreSQL's autovacuum and track_counts are off")


def test_the_warning_reads_the_servers_settings(engine: Engine) -> None:
    with engine.connect() as conn:
        on = conn.execute(text("SELECT current_setting('autovacuum')")).scalar_one() == "on"
    # the embedded test server runs without autovacuum (testbed/pg.py); a server given by
    # TEST_DATABASE_URL may run with or without it
    assert (vacuum_warning(engine) is None) == on


# --- 0026 and 0027: assignments' member key on member_keys -----------------------------------


def test_0026_gives_every_stored_member_its_key_and_0027_validates(blank: Engine) -> None:
    migrate_below(blank, 26)
    with blank.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO teams (id, org, name) VALUES (1, 'acme', 't');"
                " INSERT INTO members (id, team_id, crm_user_id, name, weight, position)"
                " VALUES (1, 1, '005A', 'Ada', 1, 0), (2, 1, '005B', 'Alan', 1, 1);"
                " INSERT INTO leads (id, org, crm_object, crm_id, fields, source)"
                " VALUES (1, 'acme', 'Lead', '00Q1', '{}', 'api');"
                " INSERT INTO assignments (lead_id, org, team_id, member_id, crm_user_id, epoch,"
                " rule_index, rule_name, source) VALUES (1, 'acme', 1, 1, '005A', 0, 0, 'r', 'api')"
            )
        )
    assert migrate(blank)[:2] == [26, 27]
    with blank.connect() as conn:
        keys = conn.execute(text("SELECT id FROM member_keys ORDER BY id")).scalars().all()
        assert keys == [1, 2]  # Alan, whom no assignment names, gets his key too
        key = conn.execute(
            text(
                "SELECT confrelid::regclass::text, convalidated FROM pg_constraint"
                " WHERE conname = 'assignments_member_id_fkey'"
            )
        ).one()
    assert tuple(key) == ("member_keys", True)
    with blank.begin() as conn:  # a member added later gets its key from the trigger
        conn.execute(
            text(
                "INSERT INTO members (id, team_id, crm_user_id, name, weight, position)"
                " VALUES (3, 1, '005C', 'Grace', 1, 2)"
            )
        )
        assert conn.execute(text("SELECT count(*) FROM member_keys WHERE id = 3")).scalar() == 1


def test_a_migration_kept_waiting_by_a_long_transaction_is_tried_again(
    blank: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    """0026 locks members; a transaction that read members holds it off. Each attempt waits
    at most the lock timeout (routing queued behind it moves again in the pause), then the
    migration is tried again once the long transaction has ended."""
    migrate_below(blank, 26)
    with blank.connect() as holder:
        holder.execute(text("SELECT count(*) FROM members")).scalar_one()  # its lock, held
        pauses: list[float] = []

        def sleep(seconds: float) -> None:
            pauses.append(seconds)
            if len(pauses) == 2:
                holder.rollback()  # the long transaction ends

        with caplog.at_level(logging.WARNING, logger="connector.shell.store"):
            applied = migrate(blank, lock_timeout_s=0.2, pause_s=7.0, sleep=sleep)
    assert applied[:2] == [26, 27]
    assert pauses == [7.0, 7.0]
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert (
        warned
        == [
            "migration 0026_member_keys: a table it changes stayed locked by another session"
            " for 0.2s (a long transaction?); trying again in 7s"
        ]
        * 2
    )
    assert pending_migrations(blank) == []


def test_a_migration_gives_up_once_it_has_waited_its_patience(blank: Engine) -> None:
    pauses: list[float] = []

    def clock() -> float:  # time passes in the pauses only: the 0.2 s waits count as 0.2
        return sum(pauses)

    migrate_below(blank, 26)
    with blank.connect() as holder:
        holder.execute(text("SELECT count(*) FROM members")).scalar_one()
        with pytest.raises(Conflict) as exc:
            migrate(
                blank,
                lock_timeout_s=0.2,
                patience_s=2.5,
                pause_s=1.0,
                sleep=pauses.append,
                clock=clock,
            )
        holder.rollback()
    assert exc.value.sqlstate == "55P03"
    # the first wait began at -0.2; a third attempt would start at 2.2 and a fourth at 3.2
    assert pauses == [1.0, 1.0]
    assert pending_migrations(blank)[:2] == [26, 27]  # nothing of it stayed


def test_other_migrators_wait_for_the_one_that_pauses(blank: Engine) -> None:
    """While a migrator pauses between attempts, it keeps the migrations' advisory lock, so
    another migrator waits for that lock instead of taking its own turn at the table lock
    (where routing would queue behind it again)."""
    migrate_below(blank, 26)
    url = blank.url.render_as_string(hide_password=False)
    engines = [make_engine(url, pool_size=1) for _ in range(2)]
    paused, resume = threading.Event(), threading.Event()
    second_pauses: list[float] = []
    results: dict[str, list[int]] = {}

    def first_sleep(seconds: float) -> None:
        paused.set()
        assert resume.wait(60)

    def run(name: str, engine: Engine, sleep: Callable[[float], None]) -> None:
        results[name] = migrate(engine, lock_timeout_s=0.2, pause_s=1.0, sleep=sleep)

    try:
        with blank.connect() as holder:
            holder.execute(text("SELECT count(*) FROM members")).scalar_one()
            first = threading.Thread(target=run, args=("first", engines[0], first_sleep))
            first.start()
            assert paused.wait(60)
            second = threading.Thread(target=run, args=("second", engines[1], second_pauses.append))
            second.start()
            wait_until_blocked(blank, "SELECT pg_advisory_lock%")  # the second waits
            holder.rollback()
        resume.set()
        first.join(60)
        second.join(60)
    finally:
        resume.set()
        for e in engines:
            e.dispose()
    assert results == {"first": [26, 27], "second": []}
    assert second_pauses == []  # it never waited for the table


def test_a_migrator_whose_connection_dies_leaves_no_lock_behind(blank: Engine) -> None:
    """The server ends the migrating session during a pause: migrate raises, holds no
    advisory lock afterwards, and the next run applies everything."""
    migrate_below(blank, 26)
    held = text(
        "SELECT l.pid FROM pg_locks l JOIN pg_database d ON d.oid = l.database"
        " WHERE d.datname = current_database() AND l.locktype = 'advisory' AND l.granted"
    )
    url = blank.url.render_as_string(hide_password=False)
    migrator = make_engine(url, pool_size=1)
    try:
        with blank.connect() as holder:
            holder.execute(text("SELECT count(*) FROM members")).scalar_one()

            def end_the_migrators_session(seconds: float) -> None:
                with make_engine(url, pool_size=1).connect() as admin:
                    (pid,) = admin.execute(held).scalars().all()
                    admin.execute(text("SELECT pg_terminate_backend(:p)"), {"p": pid})
                    admin.commit()
                    admin.engine.dispose()

            with pytest.raises(DatabaseUnavailable):
                migrate(migrator, lock_timeout_s=0.2, sleep=end_the_migrators_session)
            holder.rollback()
        with blank.connect() as conn:
            assert conn.execute(held).scalars().all() == []
        assert migrate(migrator)[:2] == [26, 27]
    finally:
        migrator.dispose()
