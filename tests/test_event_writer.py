"""The receivers' store path: the asyncio pool (one autocommit statement per call) and the
group-commit ``EventWriter`` on top of it, against a real PostgreSQL."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sqlalchemy import Engine, text

import db
from connector.core.config import OrgConfig
from connector.core.database import AsyncPool, async_pool_for
from connector.core.errors import DatabaseError, DatabaseUnavailable
from connector.intake.inbox import EventWriter, _Delivery, count_new, store_events_now
from connector.shell.store import make_engine


def rows(engine: Engine) -> list[tuple[str, str, str]]:
    with engine.connect() as conn:
        return [
            (r.org, r.event_key, r.crm_id)
            for r in conn.execute(
                text("SELECT org, event_key, crm_id FROM intake_events ORDER BY event_key")
            )
        ]


def run(coro: Any) -> Any:
    return asyncio.run(coro)


# --- pure -------------------------------------------------------------------------------------


def test_pyformat_turns_named_binds_into_driver_parameters() -> None:
    assert db.pyformat("SELECT :a, CAST(:b_1 AS text[]), x::int, '5%'") == (
        "SELECT %(a)s, CAST(%(b_1)s AS text[]), x::int, '5%%'"
    )


def test_count_new_gives_a_repeated_key_to_its_first_sender(sample_cfg: OrgConfig) -> None:
    loop = asyncio.new_event_loop()
    try:
        batch = [
            _Delivery(sample_cfg, keys, keys, loop.create_future())
            for keys in (["a", "b"], ["b", "c"], ["a"], ["d", "d"])
        ]
    finally:
        loop.close()
    org = sample_cfg.org
    inserted = [(org, "a"), (org, "b"), (org, "c"), (org, "d"), ("other-org", "a")]
    assert count_new(batch, inserted) == [2, 1, 0, 1]


# --- the pool -------------------------------------------------------------------------------


def test_pool_statement_is_committed_when_it_returns(engine: Engine, applied: OrgConfig) -> None:
    async def go() -> int:
        pool = async_pool_for(engine, max_size=2)
        try:
            return await store_events_now(pool, applied, ["k1", "k2"], ["1", "2"])
        finally:
            await pool.close()

    assert run(go()) == 2
    # another connection sees them: committed, no transaction left open
    assert rows(engine) == [(applied.org, "k1", "1"), (applied.org, "k2", "2")]


def test_pool_drops_a_connection_that_died(engine: Engine, applied: OrgConfig) -> None:
    async def go() -> list[str]:
        pool = async_pool_for(engine, max_size=1)
        seen = []
        try:
            (pid,) = (await pool.fetch_all("SELECT pg_backend_pid()", {}))[0]
            with engine.connect() as conn:
                conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
            for key in ("k1", "k2"):
                try:
                    await store_events_now(pool, applied, [key], ["1"])
                    seen.append("stored")
                except DatabaseUnavailable:
                    seen.append("unavailable")
        finally:
            await pool.close()
        return seen

    # the dead connection fails once (the sender retries), then a fresh one is opened
    assert run(go()) == ["unavailable", "stored"]
    assert [r[1] for r in rows(engine)] == ["k2"]


def test_pool_to_a_database_that_is_down_is_unavailable(applied: OrgConfig) -> None:
    dead = make_engine("postgresql://postgres@127.0.0.1:1/nowhere")

    async def go() -> None:
        pool = async_pool_for(dead)
        try:
            await store_events_now(pool, applied, ["k"], ["1"])
        finally:
            await pool.close()

    try:
        with pytest.raises(DatabaseUnavailable):
            run(go())
    finally:
        dead.dispose()


def test_pool_refuses_size_zero() -> None:
    with pytest.raises(ValueError):
        AsyncPool({}, max_size=0)


# --- group commit ---------------------------------------------------------------------------


def test_concurrent_deliveries_share_statements_and_count_duplicates_once(
    engine: Engine, applied: OrgConfig
) -> None:
    deliveries = [[f"e{n}", f"e{n + 1}"] for n in range(0, 60, 2)]
    deliveries += [["e0"], ["e1", "e99"]]  # redeliveries, one with a new event

    async def go() -> tuple[list[int], int]:
        pool = async_pool_for(engine, max_size=2)
        writer = EventWriter(pool, max_in_flight=1)
        statements = 0
        original = pool.fetch_all

        async def counting(sql: str, params: Any) -> Any:
            nonlocal statements
            statements += 1
            return await original(sql, params)

        pool.fetch_all = counting  # type: ignore[method-assign]
        try:
            news = await asyncio.gather(
                *(writer.store(applied, keys, [k[1:] for k in keys]) for keys in deliveries)
            )
        finally:
            await pool.close()
        return list(news), statements

    news, statements = run(go())
    assert sum(news) == 61  # e0..e59 and e99, each new exactly once
    assert news == [2] * 30 + [0, 1]
    assert statements < len(deliveries)  # batched: one in flight, the rest waited together
    assert len(rows(engine)) == 61


def test_a_bad_delivery_does_not_fail_the_others_in_its_batch(
    engine: Engine, applied: OrgConfig
) -> None:
    async def go() -> list[Any]:
        pool = async_pool_for(engine, max_size=2)
        writer = EventWriter(pool, max_in_flight=1)
        try:
            return await asyncio.gather(
                writer.store(applied, ["first"], ["1"]),
                writer.store(applied, ["good-1"], ["2"]),
                writer.store(applied, ["bad\x00key"], ["3"]),  # text cannot hold NUL
                writer.store(applied, ["good-2"], ["4"]),
                return_exceptions=True,
            )
        finally:
            await pool.close()

    outcomes = run(go())
    assert outcomes[0] == 1 and outcomes[1] == 1 and outcomes[3] == 1
    assert isinstance(outcomes[2], DatabaseError)
    assert not isinstance(outcomes[2], DatabaseUnavailable)
    assert [r[1] for r in rows(engine)] == ["first", "good-1", "good-2"]


def test_an_outage_fails_every_delivery_of_the_batch(applied: OrgConfig) -> None:
    dead = make_engine("postgresql://postgres@127.0.0.1:1/nowhere")

    async def go() -> list[Any]:
        pool = async_pool_for(dead)
        writer = EventWriter(pool, max_in_flight=1)
        try:
            return await asyncio.gather(
                *(writer.store(applied, [f"k{n}"], ["1"]) for n in range(5)),
                return_exceptions=True,
            )
        finally:
            await pool.close()

    try:
        outcomes = run(go())
    finally:
        dead.dispose()
    assert all(isinstance(o, DatabaseUnavailable) for o in outcomes)


def test_a_store_that_cannot_commit_in_time_is_unavailable_not_hung(
    engine: Engine, applied: OrgConfig
) -> None:
    """Another transaction holds an uncommitted insert of the same event key, so the writer's
    statement waits on it: the delivery is answered DatabaseUnavailable (a 503, retry later)
    after ``store_timeout`` instead of waiting for ever; once the holder commits the late
    statement finds the key taken and stores nothing twice, and the writer serves the next."""

    async def go() -> tuple[BaseException | None, int]:
        pool = async_pool_for(engine, max_size=2)
        writer = EventWriter(pool, max_in_flight=1, store_timeout=0.5)
        failure: BaseException | None = None
        try:
            with engine.connect() as holder:
                holder.execute(
                    text(
                        "INSERT INTO intake_events (org, source, event_key, crm_object, crm_id) "
                        "VALUES (:org, 'salesforce_outbound', 'held', 'Lead', '1')"
                    ),
                    {"org": applied.org},
                )
                try:
                    await writer.store(applied, ["held"], ["1"])
                except DatabaseUnavailable as exc:
                    failure = exc
                holder.commit()
            return failure, await writer.store(applied, ["next"], ["2"])
        finally:
            await pool.close()

    failure, new = run(go())
    assert isinstance(failure, DatabaseUnavailable)
    assert str(failure) == "events not stored within 0.5 s"
    assert new == 1
    assert [r[1] for r in rows(engine)] == ["held", "next"]
