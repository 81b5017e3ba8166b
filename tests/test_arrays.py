"""List parameters as binary arrays (connector/core/arrays.py), against the real server: what
is sent is what PostgreSQL reads back, and a list that cannot be sent is refused before
anything is stored."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Connection, Engine, text
from sqlalchemy.engine import make_url

from connector.core.arrays import ArrayElementError, pack_ints, send_lists_in_binary
from connector.shell.store import make_engine
from tests.pg import DatabaseFactory, with_database

INT8 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
# PostgreSQL text holds any character but NUL; surrogates cannot be encoded at all
TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"))


@pytest.fixture(scope="module")
def conn(databases: DatabaseFactory) -> Iterator[Connection]:
    url = databases.new()
    engine: Engine = make_engine(url)  # through errors.create_engine, as every engine
    with engine.connect() as c:
        c.execute(text("CREATE TABLE kept (v text)"))
        c.commit()
        yield c
    engine.dispose()
    databases.release(url)


def _back(conn: Connection, value: list[Any]) -> tuple[Any, str]:
    row = conn.execute(text("SELECT :v, CAST(pg_typeof(:v) AS text)"), {"v": value}).one()
    conn.rollback()
    return row[0], row[1]


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(st.one_of(INT8, st.none()), min_size=1, max_size=700).filter(
        lambda v: v[0] is not None
    )
)
def test_int_lists_arrive_as_bigint_arrays(conn: Connection, value: list[int | None]) -> None:
    # 700 > the 256 ints packed per struct call: whole chunks and a remainder
    assert _back(conn, value) == (value, "bigint[]")


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(st.one_of(TEXT, st.none()), min_size=1, max_size=50).filter(lambda v: v[0] is not None)
)
def test_str_lists_arrive_as_text_arrays(conn: Connection, value: list[str | None]) -> None:
    assert _back(conn, value) == (value, "text[]")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ([None, 5], ([None, 5], "smallint[]")),
        ([True, False], ([True, False], "boolean[]")),
        ([1.5, 2.0], ([1.5, 2.0], "double precision[]")),
        ([[1, 2], [3, 4]], ([[1, 2], [3, 4]], "smallint[]")),
        ([256, 2**40], ([256, 2**40], "bigint[]")),  # psycopg would have said smallint then int8
    ],
)
def test_other_lists_go_through_psycopg(
    conn: Connection, value: list[Any], expected: tuple[Any, str]
) -> None:
    assert _back(conn, value) == expected


def test_an_empty_list_takes_the_type_of_its_cast(conn: Connection) -> None:
    # psycopg's own dumper: no element to type it, so the statement's cast does
    assert conn.execute(text("SELECT CAST(:v AS bigint[])"), {"v": []}).scalar_one() == []
    conn.rollback()


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ([1, "2"], "element 1 of a bigint[] list is a str"),
        ([1, None, 2.5], "element 2 of a bigint[] list is a float"),
        ([0, 2**63], "element 1 of a bigint[] list is out of its range"),
        ([-(2**63) - 1], "element 0 of a bigint[] list is out of its range"),
        ([1, [2]], "element 1 of a bigint[] list is a list"),
        (["a", 1], "element 1 of a text[] list is a int"),
        (["a", None, b"b"], "element 2 of a text[] list is a bytes"),
    ],
)
def test_a_list_that_cannot_be_sent_is_refused_and_nothing_is_stored(
    conn: Connection, value: list[Any], message: str
) -> None:
    with pytest.raises(ArrayElementError) as info:
        conn.execute(text("INSERT INTO kept SELECT CAST(:v AS text)"), {"v": value})
    assert str(info.value) == message
    conn.rollback()
    assert conn.execute(text("SELECT count(*) FROM kept")).scalar_one() == 0
    assert conn.execute(text("SELECT 1")).scalar_one() == 1  # the connection still works
    conn.rollback()


def test_pack_ints_reports_nulls() -> None:
    assert pack_ints([1, 2])[1] == 0
    body, hasnull = pack_ints([1, None])
    assert hasnull == 1
    assert body == b"\x00\x00\x00\x08" + (1).to_bytes(8, "big") + b"\xff\xff\xff\xff"


def test_a_sql_ascii_database_gets_utf8_text(databases: DatabaseFactory) -> None:
    # as psycopg's own str dumper does: the client encoding SQL_ASCII maps to Python's
    # "ascii", which cannot encode "é"
    name = f"{databases.prefix}_ascii"
    with databases.admin.connect() as admin:
        admin.execute(
            text(
                f"CREATE DATABASE {name} ENCODING 'SQL_ASCII' TEMPLATE template0 "
                "LC_COLLATE 'C' LC_CTYPE 'C'"
            )
        )
    url = make_url(with_database(databases.url, name)).set(drivername="postgresql")
    conn = psycopg.connect(url.render_as_string(hide_password=False))
    try:
        send_lists_in_binary(conn, None)  # what every engine's connections get
        got = conn.execute(
            "SELECT octet_length(x) FROM unnest(CAST(%s AS text[])) x", (["é", "a"],)
        ).fetchall()
        assert got == [(2,), (1,)]
    finally:
        conn.close()
        with databases.admin.connect() as admin:
            admin.execute(text(f"DROP DATABASE {name}"))
