"""Named SQL as db.queries loads it: blocks split by ``-- name:``, comment lines dropped."""

from __future__ import annotations

import pytest
from sqlalchemy import text
from sqlalchemy.dialects.postgresql import psycopg

import db


def test_comment_lines_are_dropped_and_code_is_kept() -> None:
    got = db.parse_named(
        "-- name: one\n"
        "-- what it does\n"
        "SELECT 1 -- a trailing comment stays\n"
        "    -- an indented comment line\n"
        "FROM t\n"
        "\t--\n"
        "WHERE x = '--'\n"
        "-- name: two\n"
        "SELECT 2\n"
        "-- the last line, with no newline after it"
    )
    assert got == {
        "one": "SELECT 1 -- a trailing comment stays\nFROM t\nWHERE x = '--'",
        "two": "SELECT 2",
    }


def test_a_name_defined_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="query 'one' is defined twice"):
        db.parse_named("-- name: one\nSELECT 1\n-- name: one\nSELECT 2\n")


@pytest.mark.parametrize(
    "name",
    [
        "insert_leads",
        "lock_teams",
        "route_team",
        "route_new_lead",
        "team_candidates",
    ],
)
def test_a_batchs_statements_fit_psycopgs_query_cache(name: str) -> None:
    # psycopg converts a statement's placeholders once and caches the result only for
    # statements of at most 4,096 bytes and 50 parameters (psycopg/_queries.py); a batch runs
    # these under the team's lock. As the driver receives them: SQLAlchemy's %(name)s form.
    compiled = text(db.queries("routing")[name]).compile(dialect=psycopg.dialect())
    sql = str(compiled)
    assert "%(lead_ids)s" in sql or name != "route_team"
    assert len(sql.encode()) <= 4096, len(sql.encode())
    assert len(compiled.params) <= 50
