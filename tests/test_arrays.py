"""List parameters as binary arrays (connector/core/arrays.py), against the real server: what
is sent is what PostgreSQL reads back, and a list that cannot be sent is refused before
anything is stored."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta, timezone
from typing import Any
from zoneinfo import ZoneInfo

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Connection, Engine, text
from sqlalchemy.engine import make_url

from connector.core.arrays import (
    ArrayElementError,
    _InstantList,
    _NullList,
    _packer,
    pack_instants,
    pack_ints,
    send_lists_in_binary,
)
from connector.shell.store import make_engine
from testbed.pg import DatabaseFactory, with_database

INT8 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
# PostgreSQL text holds any character but NUL; surrogates cannot be encoded at all
TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"))
# instants across PostgreSQL's whole shared range with Python, in any whole-minute offset
ZONE = st.integers(min_value=-14 * 60, max_value=14 * 60).map(
    lambda m: timezone(timedelta(minutes=m))
)
INSTANT = st.datetimes(
    min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30), timezones=ZONE
)


@pytest.fixture(scope="module")
def conn(databases: DatabaseFactory) -> Iterator[Connection]:
    url = databases.new()
    engine: Engine = make_engine(url)  # through database.create_engine, as every engine
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
@given(st.lists(st.one_of(INT8, st.none()), min_size=1, max_size=700))
def test_int_lists_arrive_as_bigint_arrays(conn: Connection, value: list[int | None]) -> None:
    # 700 > the 256 ints packed per struct call: whole chunks and a remainder; a list led by
    # None is typed by its first int (a list of nothing but None goes as NULLs of text[])
    kind = "bigint[]" if any(v is not None for v in value) else "text[]"
    assert _back(conn, value) == (value, kind)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(st.one_of(TEXT, st.none()), min_size=1, max_size=50))
def test_str_lists_arrive_as_text_arrays(conn: Connection, value: list[str | None]) -> None:
    assert _back(conn, value) == (value, "text[]")


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(st.one_of(INSTANT, st.none()), min_size=1, max_size=300), st.booleans())
def test_aware_datetime_lists_arrive_as_timestamptz_arrays(
    conn: Connection, value: list[datetime | None], repeat: bool
) -> None:
    # the same instant again (as in a list of modification times) takes the shortcut for a
    # repeat; it must give what converting it afresh gives, in any offset
    if repeat and value[0] is not None:
        value = [*value, value[0], value[0].astimezone(UTC), None, value[0]]
    if all(v is None for v in value):
        return
    got, kind = _back(conn, value)
    assert kind == "timestamp with time zone[]"
    assert got == value  # aware datetimes compare as instants


@pytest.mark.parametrize(
    "wall",
    [
        datetime(2026, 11, 1, 1, 30),  # New York's clocks go back at 02:00: 01:30 comes twice
        datetime(2026, 3, 8, 2, 30),  # and forward at 02:00: 02:30 never comes
    ],
)
def test_two_instants_at_one_wall_clock_time_stay_apart(conn: Connection, wall: datetime) -> None:
    # Of one tzinfo, datetimes compare by their wall clocks alone: 01:30 EDT == 01:30 EST
    # although an hour apart. Only ``fold`` tells them apart, and the shortcut for a
    # repeated instant must not take one for the other.
    zone = ZoneInfo("America/New_York")
    first, second = wall.replace(tzinfo=zone), wall.replace(tzinfo=zone, fold=1)
    assert first == second and first.utcoffset() != second.utcoffset()
    value = [first, second, first, second]
    got, kind = _back(conn, value)
    assert kind == "timestamp with time zone[]"
    assert [g.astimezone(UTC) for g in got] == [v.astimezone(UTC) for v in value]
    assert got[0] != got[1]


def test_lists_of_aware_datetimes_are_packed_here_and_others_are_not() -> None:
    aware = datetime(2026, 1, 2, tzinfo=UTC)
    assert _packer([None, aware]) is _InstantList
    assert _packer([datetime(2026, 1, 2), aware]) is None  # psycopg's: a naive first
    assert _packer([None, None]) is _NullList
    assert _packer([]) is None


def test_a_list_of_nulls_takes_the_type_of_its_cast(conn: Connection) -> None:
    assert _back(conn, [None, None]) == ([None, None], "text[]")
    got = conn.execute(
        text("SELECT CAST(:i AS integer[]), CAST(:t AS timestamptz[]), CAST(:b AS bigint[])"),
        {"i": [None], "t": [None, None], "b": [None] * 600},
    ).one()
    assert tuple(got) == ([None], [None, None], [None] * 600)
    conn.rollback()


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ([None, 5], ([None, 5], "bigint[]")),  # typed by the first element that is not None
        ([None, "a"], ([None, "a"], "text[]")),
    ],
)
def test_a_list_led_by_none_takes_its_first_elements_type(
    conn: Connection, value: list[Any], expected: tuple[Any, str]
) -> None:
    assert _back(conn, value) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ([True, False], ([True, False], "boolean[]")),
        ([1.5, 2.0], ([1.5, 2.0], "double precision[]")),
        ([[1, 2], [3, 4]], ([[1, 2], [3, 4]], "smallint[]")),
        ([256, 2**40], ([256, 2**40], "bigint[]")),  # psycopg would have said smallint then int8
        # a naive datetime names no instant: psycopg sends it as a timestamp
        (
            [datetime(2026, 1, 2, 3, 4, 5)],
            ([datetime(2026, 1, 2, 3, 4, 5)], "timestamp without time zone[]"),
        ),
        ([date(2026, 1, 2)], ([date(2026, 1, 2)], "date[]")),
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
        (
            [None, datetime(2026, 1, 2, tzinfo=UTC), datetime(2026, 1, 2)],
            "element 2 of a timestamptz[] list is a datetime without a time zone",
        ),
        (
            [datetime(2026, 1, 2, tzinfo=UTC), datetime(2026, 1, 2, tzinfo=UTC), "x"],
            "element 2 of a timestamptz[] list is a str",
        ),
        (
            [datetime(2026, 1, 2, tzinfo=UTC), date(2026, 1, 2)],
            "element 1 of a timestamptz[] list is a date",
        ),
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


def test_pack_instants_counts_microseconds_from_2000_utc() -> None:
    body, hasnull = pack_instants(
        [datetime(2000, 1, 1, 1, tzinfo=timezone(timedelta(hours=1))), None]
    )
    assert hasnull == 1
    assert body == b"\x00\x00\x00\x08" + (0).to_bytes(8, "big", signed=True) + b"\xff" * 4
    assert pack_instants([datetime(1999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)])[0][4:] == (
        (-1).to_bytes(8, "big", signed=True)
    )


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
