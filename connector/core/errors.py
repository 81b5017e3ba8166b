"""The connector's own errors, and the translation of database driver errors into them.

``translate`` turns a DBAPI (psycopg) error into a ``DatabaseError`` by SQLSTATE; the database
layer (``connector.core.database``: engines, pools, notifications) raises what it returns, at
statement time and at connect time. The rest of the connector catches only the classes below.

Layer rule (``tests/test_errors.py``): ``sqlalchemy.exc``, ``sqlalchemy.pool`` and ``psycopg``
may be imported in ``connector`` by this module and ``database.py`` only (and by ``arrays.py``,
the list dumper, which uses its adaptation API), and only ``database.py`` calls
``sqlalchemy.create_engine``.

Messages carry the SQLSTATE, its condition name and the constraint name, never SQL parameters
or row values (a unique violation's DETAIL names the key's value, which may be an email). The
driver's exception stays reachable as ``__cause__``.
"""

from __future__ import annotations

import psycopg


class ConnectorError(Exception):
    """Base of the errors the connector raises on purpose."""


class UsageError(ConnectorError, ValueError):
    """A command-line input mistake (a bad option value, an unreadable input file)."""


class DatabaseError(ConnectorError):
    """The database refused or failed an operation; retrying the same thing will not help."""

    def __init__(
        self,
        message: str,
        *,
        sqlstate: str | None = None,
        connection_invalidated: bool = False,
        constraint: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.sqlstate = sqlstate
        self.connection_invalidated = connection_invalidated
        self.constraint = constraint


class DatabaseUnavailable(DatabaseError):
    """The database cannot be reached or is going away; retry later.

    ``connection_invalidated`` says the connection in use died (and was discarded): a
    transaction whose outcome the caller can check may be retried at once on a fresh one.
    """


class Conflict(DatabaseError):
    """A concurrent transaction won (unique key, serialization, deadlock, row lock): retry."""


# SQLSTATEs (PostgreSQL Appendix A). Class 08 and 57P0x are matched by prefix.
CONFLICT_SQLSTATES = frozenset({"23505", "40001", "40P01", "55P03"})
UNAVAILABLE_PREFIXES = ("08", "57P0", "53")  # connection; shutdown/restart; resources (53300)


def error_class(
    sqlstate: str | None, *, connection_lost: bool = False, connecting: bool = False
) -> type[DatabaseError]:
    """Which connector error a driver error is.

    ``connection_lost``: the driver's connection is closed or broken after the error.
    ``connecting``: the error came while opening a connection (psycopg gives those no SQLSTATE:
    refused, unknown host, timeout, or a FATAL such as "the database system is starting up").
    """
    if connection_lost:
        return DatabaseUnavailable
    if sqlstate is None:
        return DatabaseUnavailable if connecting else DatabaseError
    if sqlstate in CONFLICT_SQLSTATES:
        return Conflict
    if sqlstate.startswith(UNAVAILABLE_PREFIXES):
        return DatabaseUnavailable
    return DatabaseError


_LABELS: dict[type[DatabaseError], str] = {
    DatabaseUnavailable: "database unavailable",
    Conflict: "database conflict",
    DatabaseError: "database error",
}


def _first_line(text: str, limit: int = 300) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


def translate(
    orig: BaseException, *, connection_lost: bool = False, connecting: bool = False
) -> DatabaseError:
    """The connector error for a driver exception (the caller raises it ``from orig``).

    A connect-time message is kept (host, port, database and user names: what an operator
    needs, and never a parameter); a statement error's text is not, since its DETAIL may quote
    row values.
    """
    sqlstate = getattr(orig, "sqlstate", None)
    sqlstate = sqlstate if isinstance(sqlstate, str) else None
    cls = error_class(sqlstate, connection_lost=connection_lost, connecting=connecting)
    diag = getattr(orig, "diag", None)
    constraint = getattr(diag, "constraint_name", None) if diag is not None else None
    constraint = constraint if isinstance(constraint, str) else None
    if connecting:
        what = _first_line(str(orig)) or type(orig).__name__
    elif sqlstate is not None:
        name = psycopg.errors.lookup(sqlstate).__name__ if _known(sqlstate) else "error"
        what = f"{name} (SQLSTATE {sqlstate})"
        if constraint:
            what += f" on constraint {constraint}"
    elif connection_lost:
        what = "the connection was lost"
    else:
        what = type(orig).__name__
    return cls(
        f"{_LABELS[cls]}: {what}",
        sqlstate=sqlstate,
        connection_invalidated=connection_lost,
        constraint=constraint,
    )


def _known(sqlstate: str) -> bool:
    try:
        psycopg.errors.lookup(sqlstate)
    except KeyError:
        return False
    return True
