"""The database layer: every engine and pool the connector uses, whose failures are the
connector's errors (``connector.core.errors``).

Every engine the connector makes comes from ``create_engine`` here. It installs a SQLAlchemy
``handle_error`` hook that turns each DBAPI (psycopg) error, at statement time and at connect
time, into a ``DatabaseError`` by SQLSTATE (``errors.translate``), and a pool that turns a pool
timeout into ``DatabaseUnavailable``. ``AsyncPool`` (made by ``async_pool_for(engine)``) is the
asyncio twin for the webhook receivers' one-statement writes, with the same translation,
``StatementPool`` (``statement_pool(engine)``, used by ``one_statement``) its synchronous
counterpart beside each engine's pool, and ``Notifications`` (``notifications_for(engine,
...)``) the one connection that LISTENs.

Only this module calls ``sqlalchemy.create_engine`` (``tests/test_errors.py`` checks it).
"""

from __future__ import annotations

import asyncio
import os
import queue
import threading
import time
import weakref
from collections.abc import Mapping
from typing import Any

import psycopg
import sqlalchemy
from sqlalchemy import Engine, event
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import URL, ExceptionContext, make_url
from sqlalchemy.pool import PoolProxiedConnection, QueuePool

from connector.core.arrays import send_lists_in_binary
from connector.core.errors import DatabaseUnavailable, translate

DATABASE_DRIVERS = ("postgresql", "postgres", "postgresql+psycopg")
DATABASE_URL_FORM = "postgresql://USER:PASSWORD@HOST:5432/DBNAME"


def database_url_problem(url: str) -> str | None:
    """Why ``url`` cannot be used (never quoting it: it may hold a password), or None.

    A libpq keyword string (``host=db password=...``) is refused rather than converted: the
    literal-password check reads URLs only, and a ``${ENV}`` value substituted into a keyword
    string would need libpq's quoting (a space or quote in a password would change the
    string's other keywords).
    """
    text = url.strip()
    if "://" not in text:
        if "=" in text:
            return (
                "a libpq keyword string (host=... password=...) is not accepted; "
                f"write {DATABASE_URL_FORM}"
            )
        return f"not a URL; write {DATABASE_URL_FORM}"
    try:
        driver = make_url(text).drivername
    except (sa_exc.ArgumentError, ValueError):
        return f"not a URL SQLAlchemy can read; write {DATABASE_URL_FORM}"
    if driver not in DATABASE_DRIVERS:
        return f"unsupported database driver {driver!r}; write {DATABASE_URL_FORM}"
    return None


def _on_error(ctx: ExceptionContext) -> None:
    """handle_error hook: raise the connector's error in place of SQLAlchemy's.

    Raising here replaces the exception (SQLAlchemy re-raises it ``from`` the DBAPI error);
    a disconnect still invalidates the connection and the pool afterwards. Pre-ping errors
    are left alone: the pool treats them as "reconnect", not as failures.
    """
    if ctx.is_pre_ping or not isinstance(ctx.sqlalchemy_exception, sa_exc.DBAPIError):
        return
    raise translate(
        ctx.original_exception,
        connection_lost=ctx.is_disconnect,
        connecting=ctx.connection is None,
    ) from ctx.original_exception


class BoundaryPool(QueuePool):
    """A QueuePool whose checkout timeout is ``DatabaseUnavailable`` (not a DBAPI error, so
    ``handle_error`` never sees it)."""

    def connect(self) -> PoolProxiedConnection:
        try:
            return super().connect()
        except sa_exc.TimeoutError as exc:
            raise DatabaseUnavailable(
                "database unavailable: no pooled connection became free in time"
            ) from exc


def create_engine(url: str | URL, **kwargs: Any) -> Engine:
    """``sqlalchemy.create_engine`` whose failures are the connector's errors, and whose
    connections send list parameters in binary (``arrays.send_lists_in_binary``)."""
    kwargs.setdefault("poolclass", BoundaryPool)
    engine = sqlalchemy.create_engine(url, **kwargs)
    event.listen(engine, "handle_error", _on_error)
    event.listen(engine, "connect", send_lists_in_binary)
    return engine


SyncConn = psycopg.Connection[tuple[Any, ...]]
SyncCursor = psycopg.Cursor[tuple[Any, ...]]


class StatementPool:
    """Connections kept in autocommit for ``one_statement``, beside an engine's own pool: a
    statement that is its own transaction takes one, runs, and puts it back, with no
    autocommit switch and none of the engine pool's checkout and reset, and on a cursor kept
    with the connection (a new cursor a call looks its adapters up again). Together: a
    single lead's ``Router.assign`` spent 164 µs of client CPU with a pooled connection and
    about 110 µs with these (105 µs once its slots came from a C queue). One per engine
    (``statement_pool``).

    At most ``size`` connections (the engine pool's size plus its overflow), on top of the
    engine pool's own: a caller that waits longer than ``timeout`` for one gets
    ``DatabaseUnavailable`` (and opening one may wait for the engine pool as well). They are
    opened on demand through the engine (its connect arguments and listeners), detached from
    its pool, and reused while younger than ``recycle`` seconds (counted from when this pool
    took them). Pinged before reuse only when the engine pings (``pool_pre_ping``). A
    connection found lost (a server restart) is translated with ``connection_invalidated``,
    so the caller may retry; every connection opened before that moment, here and in the
    engine's pool, is then stale and closed instead of reused, so the retry opens a fresh
    one. ``close`` (also run by ``engine.dispose()``) does the same for the idle ones. In a
    forked child the parent's connections are forgotten, never used or closed.
    """

    def __init__(self, engine: Engine, size: int, timeout: float, recycle: float) -> None:
        if size < 1:
            raise ValueError("size must be at least 1")
        self._engine = weakref.ref(engine)
        self.size = size
        self.timeout = timeout
        self.recycle = recycle
        self.pre_ping = bool(getattr(engine.pool, "_pre_ping", False))
        self._start()

    def _start(self) -> None:
        self._pid = os.getpid()
        # the free slots, one token each: a C queue takes and gives one back in 0.1 µs, a
        # BoundedSemaphore (Python, on a Condition) in 1 µs
        self._slots: queue.SimpleQueue[None] = queue.SimpleQueue()
        for _ in range(self.size):
            self._slots.put(None)
        self._lock = threading.Lock()
        # (cursor, the detached pool wrapper, kept so that it is never garbage collected
        # while its connection is in use, when it was taken)
        self._idle: list[tuple[SyncCursor, Any, float]] = []
        self._stale_before = 0.0

    def run(self, sql: str, params: Mapping[str, Any]) -> tuple[Any, ...] | None:
        """Run ONE statement (``%(name)s`` placeholders), prepared, and return its first row."""
        if self._pid != os.getpid():  # a forked child: the parent's connections are not ours
            self._start()
        try:
            self._slots.get(timeout=self.timeout)
        except queue.Empty:
            raise DatabaseUnavailable(
                "database unavailable: no pooled connection became free in time"
            ) from None
        try:
            held = self._checkout()
            cur = held[0]
            conn = cur.connection
            try:
                cur.execute(sql, params, prepare=True)
                row = cur.fetchone()
            except psycopg.Error as exc:
                lost = conn.closed or conn.broken
                if lost:
                    conn.close()
                    self._lost(conn, exc)
                elif conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
                    self._put_back(held)
                else:  # interrupted mid-statement: never reused
                    conn.close()
                raise translate(exc, connection_lost=lost) from exc
            except BaseException:  # KeyboardInterrupt mid-statement: not reusable
                conn.close()
                raise
            self._put_back(held)
            return row
        finally:
            self._slots.put(None)

    def _lost(self, conn: SyncConn, exc: BaseException) -> None:
        """A connection died: so did every one opened before now, most likely (a restart)."""
        self._stale_before = time.monotonic()
        engine = self._engine()
        if engine is not None:
            # as SQLAlchemy does on a disconnect: its pool replaces every connection it
            # opened before now at its next checkout (one of them would be ours next)
            engine.pool._invalidate(conn, exc, _checkin=False)  # type: ignore[arg-type]
        self._drain()

    def _put_back(self, held: tuple[SyncCursor, Any, float]) -> None:
        if held[2] <= self._stale_before:
            held[0].connection.close()
            return
        with self._lock:
            self._idle.append(held)

    def _checkout(self) -> tuple[SyncCursor, Any, float]:
        while True:
            with self._lock:
                if not self._idle:
                    break
                held = self._idle.pop()
            cur, _, born = held
            if (
                not cur.connection.closed
                and born > self._stale_before
                and time.monotonic() - born < self.recycle
                and (not self.pre_ping or self._alive(cur))
            ):
                return held
            cur.connection.close()
        engine = self._engine()
        if engine is None:
            raise DatabaseUnavailable("database unavailable: the engine was disposed of")
        try:
            pooled = engine.raw_connection()
        except sa_exc.DBAPIError as exc:
            raise translate(exc.orig or exc, connecting=True) from exc
        except psycopg.Error as exc:
            raise translate(exc, connecting=True) from exc
        driver: SyncConn = pooled.driver_connection  # type: ignore[assignment]
        pooled.detach()  # ours now: the engine's pool opens another in its place when needed
        try:
            driver.autocommit = True
        except psycopg.Error as exc:  # a pooled connection that died while idle
            driver.close()
            raise translate(exc, connection_lost=True) from exc
        return driver.cursor(), pooled, time.monotonic()

    @staticmethod
    def _alive(cur: SyncCursor) -> bool:
        try:
            cur.execute("SELECT 1")
            cur.fetchone()
        except psycopg.Error:
            return False
        return True

    def idle(self) -> int:
        with self._lock:
            return len(self._idle)

    def close(self) -> None:
        """Close the idle connections; those in use are closed when they come back. In a
        forked child the parent's are only forgotten."""
        if self._pid != os.getpid():
            self._start()
            return
        self._stale_before = time.monotonic()
        self._drain()

    def _drain(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for cur, _, _ in idle:
            cur.connection.close()


_STATEMENT_POOLS: weakref.WeakKeyDictionary[Engine, StatementPool] = weakref.WeakKeyDictionary()
_STATEMENT_POOLS_LOCK = threading.Lock()


def statement_pool(engine: Engine) -> StatementPool:
    """The ``StatementPool`` of ``engine``: made on first use, sized like its pool, closed by
    its ``dispose()`` (in a forked child, ``dispose(close=False)`` only forgets the parent's
    connections)."""
    found = _STATEMENT_POOLS.get(engine)
    if found is not None:
        return found
    with _STATEMENT_POOLS_LOCK:
        found = _STATEMENT_POOLS.get(engine)
        if found is None:
            pool = engine.pool
            size = pool.size() + max(pool._max_overflow, 0) if isinstance(pool, QueuePool) else 8
            timeout = pool.timeout() if isinstance(pool, QueuePool) else 30.0
            recycle = pool._recycle if pool._recycle > 0 else float("inf")
            found = StatementPool(engine, size, timeout, recycle)
            event.listen(engine, "engine_disposed", lambda _engine: found.close())
            _STATEMENT_POOLS[engine] = found
    return found


def one_statement(engine: Engine, sql: str, params: Mapping[str, Any]) -> tuple[Any, ...] | None:
    """Run ONE statement (``%(name)s`` placeholders) in autocommit, as a prepared statement
    straight through the driver, on a connection of the engine's ``StatementPool``, and
    return its first row.

    For a hot path that is one statement (the single-lead assignment): the statement is its
    own transaction, one round trip, without SQLAlchemy's execution layer (which costs about
    as much as the round trip) or its pool's checkout. Errors are translated as
    ``handle_error`` translates them; a lost connection says so (``connection_invalidated``).
    """
    return statement_pool(engine).run(sql, params)


def is_boundary_engine(engine: Engine) -> bool:
    """Whether ``engine`` came from ``create_engine`` here."""
    return isinstance(engine.pool, BoundaryPool) and event.contains(
        engine, "handle_error", _on_error
    )


# --- asyncio: one statement per call --------------------------------------------------------

AsyncConn = psycopg.AsyncConnection[tuple[Any, ...]]


class AsyncPool:
    """A small pool of asyncio psycopg connections in autocommit mode, for work that is one
    statement: each ``fetch_all`` is its own transaction, committed (and flushed, under the
    server's ``synchronous_commit``) before it returns. No thread hop, one round trip.

    Connections are opened on demand (at most ``max_size``; waiting longer than ``timeout``
    for one is ``DatabaseUnavailable``), reused while younger than ``recycle`` seconds, and
    dropped when the driver says they broke. Not pinged on checkout, like the engines: a
    connection that died with its server fails its statement once (``DatabaseUnavailable``,
    so the sender retries) and is dropped. Bound to the event loop that first uses it;
    ``close`` (from that loop) closes the idle connections.
    """

    def __init__(
        self,
        connect_args: Mapping[str, Any],
        *,
        max_size: int = 8,
        timeout: float = 5.0,
        recycle: float = 1800.0,
    ) -> None:
        if max_size < 1:
            raise ValueError("max_size must be at least 1")
        self.connect_args = dict(connect_args)
        self.max_size = max_size
        self.timeout = timeout
        self.recycle = recycle
        self._idle: list[tuple[AsyncConn, float]] = []
        self._slots: asyncio.Semaphore | None = None

    async def fetch_all(self, sql: str, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        """Run one statement (``%(name)s`` parameters) and return its rows."""
        slots = await self._acquire()
        try:
            return await self._run(sql, params)
        finally:
            slots.release()

    async def _acquire(self) -> asyncio.Semaphore:
        """A slot (one of ``max_size``) within ``timeout``, else ``DatabaseUnavailable``."""
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.max_size)
        slots = self._slots
        try:
            async with asyncio.timeout(self.timeout):
                await slots.acquire()
        except TimeoutError:
            raise DatabaseUnavailable(
                "database unavailable: no pooled connection became free in time"
            ) from None
        return slots

    async def _run(self, sql: str, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        conn, born = await self._checkout()
        try:
            cur = await conn.execute(sql, params)
            rows = await cur.fetchall() if cur.description is not None else []
        except psycopg.Error as exc:
            lost = conn.broken or conn.closed
            if lost:
                await conn.close()
            else:
                self._idle.append((conn, born))
            raise translate(exc, connection_lost=lost) from exc
        self._idle.append((conn, born))
        return rows

    async def _checkout(self) -> tuple[AsyncConn, float]:
        while self._idle:
            conn, born = self._idle.pop()
            if not conn.closed and time.monotonic() - born < self.recycle:
                return conn, born
            await conn.close()
        try:
            conn = await psycopg.AsyncConnection.connect(autocommit=True, **self.connect_args)
        except psycopg.Error as exc:
            raise translate(exc, connecting=True) from exc
        return conn, time.monotonic()

    async def close(self) -> None:
        idle, self._idle = self._idle, []
        for conn, _ in idle:
            await conn.close()
        self._slots = None


def _driver_params(engine: Engine, connect_args: Mapping[str, Any] | None) -> dict[str, Any]:
    """psycopg's connection parameters for the database of ``engine`` (same server, database
    and user, as its dialect reads the URL), with ``connect_args`` added (default: a 10-second
    connect timeout)."""
    _, params = engine.dialect.create_connect_args(engine.url)
    params.pop("context", None)  # the sync dialect's type adapters: not for a bare connection
    return {**params, **(connect_args or {"connect_timeout": 10})}


def async_pool_for(
    engine: Engine, connect_args: Mapping[str, Any] | None = None, **kwargs: Any
) -> AsyncPool:
    """An ``AsyncPool`` to the database of ``engine`` (``_driver_params``); ``kwargs`` go to
    ``AsyncPool``."""
    return AsyncPool(_driver_params(engine, connect_args), **kwargs)


# --- LISTEN: one long-lived connection ------------------------------------------------------


class Notifications:
    """``LISTEN`` on a connection of its own, outside any pool (a pooled connection would drop
    its LISTEN when it is recycled). ``open`` connects in autocommit and runs ``listen_sql``;
    ``receive`` waits up to ``timeout`` seconds and returns the payloads that came, as soon
    as some did. A broken connection raises ``DatabaseUnavailable`` (translated like the
    engines' errors) and is closed; ``open`` again to listen again. Notifications sent while
    no connection listened are lost: PostgreSQL keeps none for a listener that is not there.
    """

    def __init__(self, connect_args: Mapping[str, Any], listen_sql: str) -> None:
        self.connect_args = dict(connect_args)
        self.listen_sql = listen_sql
        self._conn: psycopg.Connection[tuple[Any, ...]] | None = None

    def open(self) -> None:
        self.close()
        try:
            conn = psycopg.connect(autocommit=True, **self.connect_args)
        except psycopg.Error as exc:
            raise translate(exc, connecting=True) from exc
        try:
            conn.execute(self.listen_sql)
        except psycopg.Error as exc:
            lost = conn.broken or conn.closed
            conn.close()
            raise translate(exc, connection_lost=lost) from exc
        self._conn = conn

    def receive(self, timeout: float) -> list[str]:
        conn = self._listening()
        try:
            return [n.payload for n in conn.notifies(timeout=timeout, stop_after=1)]
        except psycopg.Error as exc:
            self.close()
            raise translate(exc, connection_lost=True) from exc

    def ping(self) -> None:
        """One round trip on the listening connection, so that a connection a network device
        dropped while it was quiet is found out (notifications that come meanwhile are kept
        for the next ``receive``)."""
        conn = self._listening()
        try:
            conn.execute("SELECT 1")
        except psycopg.Error as exc:
            self.close()
            raise translate(exc, connection_lost=True) from exc

    def _listening(self) -> psycopg.Connection[tuple[Any, ...]]:
        if self._conn is None:
            raise DatabaseUnavailable("database unavailable: not listening (open first)")
        return self._conn

    def backend_pid(self) -> int | None:
        """The server process of the listening connection (None when not listening)."""
        return None if self._conn is None else self._conn.info.backend_pid

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()


def notifications_for(
    engine: Engine, listen_sql: str, connect_args: Mapping[str, Any] | None = None
) -> Notifications:
    """``Notifications`` on the database of ``engine`` (``_driver_params``)."""
    return Notifications(_driver_params(engine, connect_args), listen_sql)
