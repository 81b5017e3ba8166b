"""Migrations: the baseline plus db/functions/ build the schema a database at 0027 moves to
with nothing lost; migrate is idempotent, drops what the files no longer define, and is safe
to run at once."""

from __future__ import annotations

import logging
import random
import string
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text

import db
from connector.core.config import ConfigError
from connector.core.config_loading import parse_config
from connector.core.errors import Conflict, DatabaseUnavailable
from connector.routing.assign import Lead, Router
from connector.routing.teams import apply_teams
from connector.shell.migrations import functions_behind, migrate, pending_migrations
from connector.shell.store import make_engine, vacuum_warning, vacuum_warning_for
from crm_adapters.salesforce_ids import id_key, to_18
from testbed.harness import worker_context
from testbed.pg import DatabaseFactory, blank_database
from tests.helpers.blocking import wait_until_blocked

#: Every versioned migration, and those after the baseline (what a database at 0027 gets).
ALL_VERSIONS = [m.version for m in db.migrations()]
AFTER_BASELINE = ALL_VERSIONS[1:]
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
    "row_types": """
        SELECT c.relname, a.attname, format_type(a.atttypid, a.atttypmod)
        FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        JOIN pg_attribute a ON a.attrelid = c.oid
        WHERE n.nspname = 'public' AND c.relkind = 'c' AND a.attnum > 0
          AND NOT a.attisdropped
        ORDER BY 1, a.attnum
    """,
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


ALL = [m.version for m in db.migrations()]  # what a blank database gets
AFTER_BASELINE = ALL[1:]  # what a database at the baseline gets

FIXTURE_0027 = Path(__file__).parent / "fixtures" / "schema_0027.sql"


def database_at_0027(databases: DatabaseFactory, tag: str) -> Engine:
    """A database as the migrations 0001-0027 left it, functions and all, built from the
    frozen db/schema.sql of that version, with versions 1..27 recorded as the migrator
    recorded them (one schema_migrations row each)."""
    engine = make_engine(blank_database(databases, tag), pool_size=1)
    with engine.begin() as conn:
        conn.exec_driver_sql(FIXTURE_0027.read_text(encoding="utf-8"))
    return engine


# One or more rows in every table that holds data, as routing, the inbox, the outbox, the
# account refresh, reassignment and the CLI write them.
SEED_0027 = """
INSERT INTO teams (id, org, name, epoch, fingerprint, in_config) VALUES
    (1, 'acme', 't', 3, 'fp-t', true), (2, 'acme', 'old', 1, '', false);
INSERT INTO members (id, team_id, crm_user_id, name, weight, active, in_config, position,
                     assigned_in_epoch, credited_in_epoch) VALUES
    (1, 1, '005A', 'Rep 005A', 1, true, true, 0, 2, 1),
    (2, 1, '005B', 'Rep 005B', 1, true, true, 1, 1, 0),
    (3, 2, '005C', 'Grace', 2, false, false, 0, 0, 0);
INSERT INTO leads (id, org, crm_object, crm_id, fields, parent_id, source, received_at,
                   unassigned_reason, merged_into) VALUES
    (1, 'acme', 'Lead', '00Q5g00000LmAbCEAV', '{"Country": "US"}', NULL,
     'salesforce_outbound', '2026-11-30T09:00:00Z', NULL, NULL),
    (2, 'acme', 'Lead', '00Q5g00000LmXyZEAV', '{"Country": "US"}', '0015g00000AcMeQAAV',
     'import', '2026-11-30T09:01:00Z', NULL, NULL),
    (3, 'acme', 'Lead', '00Q3', '{"Country": "FR"}', NULL, 'api', '2026-11-30T09:02:00Z',
     'no rule matched', NULL),
    (4, 'acme', 'Lead', '00Q5g00000LmAbCEAV', '{}', NULL, 'poll', '2026-11-30T09:03:00Z',
     NULL, 1),
    (5, 'globex', 'contacts', '101', '{"country": "US"}', NULL, 'hubspot_webhook',
     '2026-11-30T09:04:00Z', NULL, NULL);
INSERT INTO assignments (id, lead_id, org, team_id, member_id, crm_user_id, epoch, rule_index,
                         rule_name, source, assigned_at, account_match, reason, note,
                         sla_due_at) VALUES
    (1, 1, 'acme', 1, 1, '005A', 3, 0, 'us', 'salesforce_outbound', '2026-11-30T09:00:01Z',
     NULL, 'routed', NULL, '2026-11-30T10:00:00Z'),
    (2, 2, 'acme', 1, 2, '005B', 3, 1, 'accounts', 'import', '2026-11-30T09:01:01Z',
     '{"result": "matched", "account": "0015g00000AcMeQAAV"}', 'reassigned', 'by hand', NULL);
INSERT INTO assignment_history (id, assignment_id, lead_id, org, team_id, member_id,
                                crm_user_id, epoch, reason, note, assigned_at, ended_at,
                                ended_reason) VALUES
    (1, 2, 2, 'acme', 1, 1, '005A', 3, 'routed', NULL, '2026-11-30T09:01:01Z',
     '2026-11-30T09:30:00Z', 'reassigned');
INSERT INTO outbox (id, org, lead_id, assignment_id, crm_object, crm_id, owner_id, parent_id,
                    state, attempts, available_at, claimed_by, lease_until, last_error,
                    created_at, finished_at, found_owner, replaces_owners,
                    lead_received_at) VALUES
    (1, 'acme', 1, 1, 'Lead', '00Q5g00000LmAbCEAV', '005A', NULL, 'sent', 1,
     '2026-11-30T09:00:01Z', NULL, NULL, NULL, '2026-11-30T09:00:01Z',
     '2026-11-30T09:00:02Z', NULL, '{}', '2026-11-30T09:00:00Z'),
    (2, 'acme', 2, 2, 'Lead', '00Q5g00000LmXyZEAV', '005B', '0015g00000AcMeQAAV', 'claimed',
     2, '2026-11-30T09:31:00Z', 'worker-1', '2026-11-30T09:32:00Z', 'timeout',
     '2026-11-30T09:30:00Z', NULL, NULL, '{005A}', '2026-11-30T09:01:00Z'),
    (3, 'acme', 2, 2, 'Lead', '00Q5g00000LmXyZEAV', '005A', NULL, 'superseded', 1,
     '2026-11-30T09:01:01Z', NULL, NULL, NULL, '2026-11-30T09:01:01Z',
     '2026-11-30T09:20:00Z', '005Z', '{}', NULL);
INSERT INTO routing_decisions (id, org, lead_id, kind, detail, made_at, batch, epoch,
                               chosen_id, seat_ids, seat_weights, seat_counts,
                               seat_skips) VALUES
    (1, 'acme', 1, 'route', '{"rules": [0], "team": "t"}', '2026-11-30T09:00:01Z', 7, 3, 1,
     '{1,2}', '{1,1}', '{1,1}', '{NULL,NULL}'),
    (2, 'acme', 3, 'route', '{"rules": [], "values": {"Country": "FR"}}',
     '2026-11-30T09:02:00Z', NULL, NULL, NULL, NULL, NULL, NULL, NULL),
    (3, 'acme', 2, 'reassign', '{"to": "005B"}', '2026-11-30T09:30:00Z', NULL, NULL, NULL,
     NULL, NULL, NULL, NULL);
INSERT INTO intake_events (id, org, source, event_key, crm_object, crm_id, state, attempts,
                           available_at, claimed_by, lease_until, last_error, received_at,
                           finished_at) VALUES
    (1, 'acme', 'salesforce_outbound', 'n-1', 'Lead', '00Q5g00000LmAbCEAV', 'done', 1,
     '2026-11-30T08:59:59Z', NULL, NULL, NULL, '2026-11-30T08:59:59Z', '2026-11-30T09:00:01Z'),
    (2, 'globex', 'hubspot_webhook', '7:1:101', 'contacts', '102', 'pending', 0,
     '2026-11-30T09:05:00Z', NULL, NULL, NULL, '2026-11-30T09:05:00Z', NULL),
    (3, 'acme', 'salesforce_outbound', 'n-2', 'Lead', '00Q9', 'claimed', 3,
     '2026-11-30T09:06:00Z', 'worker-2', '2026-11-30T09:07:00Z', 'CRM down',
     '2026-11-30T09:05:30Z', NULL);
INSERT INTO skipped_records (org, crm_object, crm_id, reason, owner_found, source, times,
                             first_seen_at, last_seen_at) VALUES
    ('acme', 'Lead', '00Q7', 'owned_by_person', '005Q', 'salesforce_outbound', 2,
     '2026-11-29T00:00:00Z', '2026-11-30T00:00:00Z');
INSERT INTO org_pauses (org, until, reason, updated_at) VALUES
    ('globex', '2026-12-01T00:00:00Z', 'DAILY limit', '2026-11-30T09:00:00Z');
INSERT INTO poll_watermarks (org, watermark, updated_at) VALUES
    ('acme', '2026-11-30T09:00:00Z', '2026-11-30T09:00:05Z');
INSERT INTO member_load (member_id, period, starts_on, assigned) VALUES
    (1, 'day', '2026-11-30', 2), (1, 'week', '2026-11-30', 2), (2, 'day', '2026-11-30', 1);
INSERT INTO rep_time_off (org, crm_user_id, starts_at, until, reason, set_at) VALUES
    ('acme', '005C', '2026-11-01T00:00:00Z', '2026-11-02T00:00:00Z', 'holiday',
     '2026-10-30T00:00:00Z');
INSERT INTO crm_accounts (org, crm_id, owner_id, modified_at, synced_at) VALUES
    ('acme', '0015g00000AcMeQAAV', '005B', '2026-11-29T00:00:00Z', '2026-11-30T00:00:00Z');
INSERT INTO crm_account_domains (org, domain, crm_id) VALUES
    ('acme', 'acme.example', '0015g00000AcMeQAAV');
INSERT INTO account_watermarks (org, watermark, updated_at) VALUES
    ('acme', '2026-11-29T00:00:00Z', '2026-11-30T00:00:00Z');
SELECT setval(pg_get_serial_sequence(t, 'id'), 100)
FROM unnest(ARRAY['teams', 'members', 'leads', 'assignments', 'assignment_history', 'outbox',
                  'routing_decisions', 'intake_events']) AS t;
"""


def stored_rows(engine: Engine) -> dict[str, list[str]]:
    """Every row of every table but the migrator's own, as JSON text, per table."""
    with engine.connect() as conn:
        tables = conn.execute(
            text(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'"
                " AND table_type = 'BASE TABLE'"
                " AND table_name NOT IN ('schema_migrations', 'schema_functions')"
            )
        ).scalars()
        return {
            t: sorted(conn.execute(text(f"SELECT CAST(to_jsonb(r) AS text) FROM {t} r")).scalars())
            for t in sorted(tables)
        }


ROUTING_YAML = """
org: acme
crm:
  kind: salesforce
  instance_url: https://x.my.salesforce.com
  auth: {method: session, access_token: "${TOKEN}"}
  object: Lead
teams:
  - name: t
    members:
      - {crm_user_id: "005A", name: "Rep 005A", weight: 1}
      - {crm_user_id: "005B", name: "Rep 005B", weight: 1}
rules:
  - {team: t, when: {Country: US}}
"""


def test_a_database_at_0027_moves_to_the_new_layout_with_nothing_lost(
    databases: DatabaseFactory, blank: Engine
) -> None:
    """A database built by the migrations 0001-0027, with data: migrate applies no versioned
    migration, keeps every row, and leaves the catalog of a database migrated from nothing;
    routing then works on it."""
    fresh = blank
    assert migrate(fresh) == ALL
    old = database_at_0027(databases, "at_0027")
    try:
        with old.begin() as conn:
            conn.exec_driver_sql(SEED_0027)
        before = stored_rows(old)
        assert [t for t, rows in before.items() if not rows] == []  # every table holds data
        assert pending_migrations(old) == AFTER_BASELINE
        assert functions_behind(old)
        assert migrate(old) == AFTER_BASELINE
        assert not functions_behind(old)
        # the seed's rows are all kept (tables added since start empty)
        assert {t: rows for t, rows in stored_rows(old).items() if t in before} == before
        expected, got = catalog(fresh), catalog(old)
        for key in CATALOG:
            assert got[key] == expected[key], f"{key} differ between a fresh database and 0027's"
        assert got["versions"] == [(m.version, m.name) for m in db.migrations()]
        # the comparison looks at something: every table, the unique lead constraint, the
        # functions, the view and the trigger
        tables = {r[0] for r in got["relations"] if r[1] == "r"}
        assert {"schema_migrations", "teams", "members", "leads", "assignments"} <= tables
        assert ("assignments", "assignments_lead_id_key", "u", "UNIQUE (lead_id)") in got[
            "constraints"
        ]
        assert {
            "salesforce_id_18",
            "rotation_picks",
            "count_turns",
            "record_assignments",
            "route_team",
            "route_new_lead",
            "team_seats",
            "members_add_key",
            "crm_budget_take",
            "queue_notifications",
        } == {r[0] for r in got["functions"]}
        assert [r[0] for r in got["views"]] == ["decision_details"]
        assert [r[:2] for r in got["triggers"]] == [("members", "members_add_key")]

        cfg = parse_config(ROUTING_YAML, "acme.yaml", {"TOKEN": "unused"})
        apply_teams(old, cfg)
        router = Router(old, cfg)
        one = router.assign(Lead("00Q10", {"Country": "US"}), "api")
        batch = router.assign_many([Lead(f"00Q{i}", {"Country": "US"}) for i in (11, 12)], "api")
        assert [o.status for o in [one, *batch]] == ["assigned"] * 3
        assert {o.owner_id for o in [one, *batch]} == {"005A", "005B"}
        with old.connect() as conn:
            new = conn.execute(
                text(
                    "SELECT count(*) FROM assignments a JOIN outbox o ON o.assignment_id = a.id"
                    " WHERE a.id > 100"
                )
            ).scalar()
            assert new == 3  # after the old rows' ids: the sequences came along
            details = conn.execute(text("SELECT count(*) FROM decision_details")).scalar()
            assert details == 6
    finally:
        old.dispose()


def test_migrate_is_idempotent(blank: Engine) -> None:
    versions = [m.version for m in db.migrations()]
    assert pending_migrations(blank) == versions
    assert functions_behind(blank)
    assert migrate(blank) == versions
    before = catalog(blank)
    assert migrate(blank) == []
    assert pending_migrations(blank) == []
    assert catalog(blank) == before


def test_a_database_before_the_baseline_is_refused(blank: Engine) -> None:
    q = db.queries("migrate")
    with blank.begin() as conn:
        conn.execute(text(q["create_version_table"]))
        for version in range(1, 20):
            conn.execute(text(q["record"]), {"version": version, "name": f"m{version}"})
    with pytest.raises(ConfigError) as exc:
        migrate(blank)
    assert str(exc.value) == (
        "this database's schema is at version 19, before the baseline 0027 (no release"
        " shipped it): build a new database"
    )
    with blank.connect() as conn:  # nothing was applied
        assert conn.execute(text("SELECT to_regclass('leads')")).scalar() is None


EXTRA = db.Functions(
    "zz_extra",
    """
    CREATE OR REPLACE FUNCTION zz_gone(a integer) RETURNS integer LANGUAGE sql AS 'SELECT a';
    CREATE OR REPLACE FUNCTION zz_gone_trigger() RETURNS trigger LANGUAGE plpgsql
    AS $$ BEGIN RETURN NULL; END $$;
    CREATE OR REPLACE TRIGGER zz_gone AFTER UPDATE ON teams
    FOR EACH ROW EXECUTE FUNCTION zz_gone_trigger();
    CREATE OR REPLACE VIEW zz_gone_view AS SELECT zz_gone(1) AS one;
    """,
)


def server_code(engine: Engine) -> set[str]:
    got = catalog(engine)
    return {r[0] for k in ("functions", "views") for r in got[k]} | {r[1] for r in got["triggers"]}


def test_what_the_files_no_longer_define_is_dropped(
    blank: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = db.functions()
    monkeypatch.setattr(db, "functions", lambda: [*files, EXTRA])
    assert migrate(blank) == ALL
    defined = server_code(blank)
    assert {"zz_gone", "zz_gone_trigger", "zz_gone_view"} <= defined
    monkeypatch.setattr(db, "functions", lambda: files)
    assert functions_behind(blank)  # a process that does not migrate refuses to start
    assert migrate(blank) == []
    assert not functions_behind(blank)
    assert defined - server_code(blank) == {"zz_gone", "zz_gone_trigger", "zz_gone_view"}
    # the same holds for an overload the files never defined
    with blank.begin() as conn:
        conn.execute(
            text("CREATE FUNCTION route_team(x integer) RETURNS integer AS 'SELECT x' LANGUAGE sql")
        )
    migrate(blank)
    with blank.connect() as conn:
        assert (
            conn.execute(text("SELECT count(*) FROM pg_proc WHERE proname = 'route_team'")).scalar()
            == 1
        )


def test_a_row_type_whose_columns_changed_is_made_again_with_its_functions(
    blank: Engine,
) -> None:
    """db/functions/_result_types.sql: a result type that is no longer the file's (here an
    older shape of route_new_lead_result) is dropped with the function returning it, and
    both are made again as the files define them."""
    assert migrate(blank) == ALL
    before = catalog(blank)
    assert ("route_new_lead_result", "seat_skips", "text[]") in before["row_types"]
    with blank.begin() as conn:
        conn.execute(text("DROP TYPE route_new_lead_result CASCADE"))
        conn.execute(text("CREATE TYPE route_new_lead_result AS (status text, lead_id bigint)"))
        conn.execute(
            text(
                "CREATE FUNCTION route_new_lead() RETURNS route_new_lead_result "
                "LANGUAGE sql AS $$ SELECT 'x', 1 $$"
            )
        )
    assert migrate(blank) == []
    assert catalog(blank) == before


PERCENT = db.Functions(
    "zz_percent",
    """
    CREATE OR REPLACE FUNCTION zz_percent(a integer) RETURNS text LANGUAGE plpgsql AS $$
    BEGIN
        RAISE NOTICE 'zz_percent %', a;
        RETURN format('%s%%', a) || CASE WHEN 'x%' LIKE 'x%' THEN ' like' END;
    END $$;
    """,
)


def test_a_server_code_file_runs_as_written_percent_signs_and_all(
    blank: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = db.functions()
    monkeypatch.setattr(db, "functions", lambda: [*files, PERCENT])
    migrate(blank)
    with blank.connect() as conn:
        assert conn.execute(text("SELECT zz_percent(7)")).scalar() == "7% like"


def test_an_extensions_functions_are_left_alone(blank: Engine) -> None:
    assert migrate(blank) == ALL
    with blank.begin() as conn:
        available = set(conn.execute(text("SELECT name FROM pg_available_extensions")).scalars())
        names = [n for n in ("pg_trgm", "citext", "hstore", "btree_gist") if n in available]
        if not names:
            pytest.skip("this server has none of the contrib extensions the test knows")
        conn.execute(text(f"CREATE EXTENSION {names[0]} SCHEMA public"))
    count = text(
        "SELECT count(*) FROM pg_depend d WHERE d.deptype = 'e'"
        " AND d.classid = CAST('pg_proc' AS regclass)"
    )
    with blank.connect() as conn:
        before = conn.execute(count).scalar()
    assert before
    assert migrate(blank) == []
    with blank.connect() as conn:
        assert conn.execute(count).scalar() == before


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
    ctx = worker_context()  # forked from the fork server: no interpreter start
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


# --- the functions step under the advisory lock and the lock timeout ------------------------

# A transaction that wrote to members (a routing transaction left open) holds the table's ROW
# EXCLUSIVE lock; the functions step's CREATE OR REPLACE TRIGGER on members waits for it.
HOLD_MEMBERS = "UPDATE members SET name = name WHERE false"


def obsolete_function(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.execute(
            text("CREATE FUNCTION zz_obsolete() RETURNS integer AS 'SELECT 1' LANGUAGE sql")
        )


def has_obsolete_function(engine: Engine) -> bool:
    with engine.connect() as conn:
        return conn.execute(text("SELECT to_regproc('zz_obsolete')")).scalar() is not None


def test_the_functions_step_kept_waiting_by_a_long_transaction_is_tried_again(
    blank: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    """A transaction that wrote to members holds the functions step off. Each attempt waits
    at most the lock timeout (routing queued behind it moves again in the pause), then the
    step is tried again once the long transaction has ended."""
    migrate(blank)
    obsolete_function(blank)
    with blank.connect() as holder:
        holder.execute(text(HOLD_MEMBERS))  # its lock, held
        pauses: list[float] = []

        def sleep(seconds: float) -> None:
            pauses.append(seconds)
            if len(pauses) == 2:
                holder.rollback()  # the long transaction ends

        with caplog.at_level(logging.WARNING, logger="connector.shell.migrations"):
            applied = migrate(blank, lock_timeout_s=0.2, pause_s=7.0, sleep=sleep)
    assert applied == []
    assert pauses == [7.0, 7.0]
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert (
        warned
        == [
            "server functions (db/functions): a table it changes stayed locked by another"
            " session for 0.2s (a long transaction?); trying again in 7s"
        ]
        * 2
    )
    assert not has_obsolete_function(blank)


def test_the_functions_step_gives_up_once_it_has_waited_its_patience(blank: Engine) -> None:
    pauses: list[float] = []

    def clock() -> float:  # time passes in the pauses only: the 0.2 s waits count as 0.2
        return sum(pauses)

    migrate(blank)
    obsolete_function(blank)
    with blank.connect() as holder:
        holder.execute(text(HOLD_MEMBERS))
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
    assert has_obsolete_function(blank)  # nothing of the step stayed


def test_other_migrators_wait_for_the_one_that_pauses(blank: Engine) -> None:
    """While a migrator pauses between attempts of its functions step, it keeps the
    migrations' advisory lock, so another migrator waits for that lock instead of taking its
    own turn at the table lock (where routing would queue behind it again)."""
    migrate(blank)
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
            holder.execute(text(HOLD_MEMBERS))
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
    assert results == {"first": [], "second": []}
    assert second_pauses == []  # it never waited for the table


def test_a_migrator_whose_connection_dies_leaves_no_lock_behind(blank: Engine) -> None:
    """The server ends the migrating session during a pause of its functions step: migrate
    raises, holds no advisory lock afterwards, and the next run applies the step."""
    migrate(blank)
    obsolete_function(blank)
    held = text(
        "SELECT l.pid FROM pg_locks l JOIN pg_database d ON d.oid = l.database"
        " WHERE d.datname = current_database() AND l.locktype = 'advisory' AND l.granted"
    )
    url = blank.url.render_as_string(hide_password=False)
    migrator = make_engine(url, pool_size=1)
    try:
        with blank.connect() as holder:
            holder.execute(text(HOLD_MEMBERS))

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
        assert has_obsolete_function(blank)
        assert migrate(migrator) == []
        assert not has_obsolete_function(blank)
    finally:
        migrator.dispose()
