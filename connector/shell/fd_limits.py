"""How many connections the listeners may hold: what the process's file limit leaves once the
database pools, the CRM clients and the process's own files have theirs.

Every open connection is a file descriptor. Past the soft ``RLIMIT_NOFILE`` (often 1,024)
``accept`` fails, and so does everything else that opens one: the database pool's next
connection, a CRM call, a log file. So at start the soft limit is raised to the hard one
(``raise_file_limit``), the descriptors the rest of the process needs are counted
(``reserved_descriptors``), and the public listener's connection cap is what is left, at most
the configured one (``connection_cap``). A limit too small for even ``MIN_CONNECTIONS`` is a
one-line refusal to start.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping

from sqlalchemy import Engine

from connector.core.config import ConfigError
from connector.core.database import pool_capacity

BASE_DESCRIPTORS = 128
"""Standard streams, listening sockets, the event loop's, threads' wake-up pipes, log files,
imported libraries' and the embedded database's pipes, with room to spare."""
CRM_CONNECTIONS_PER_ORG = 16
"""The CRM clients' HTTP connection pools of one org (dispatchers, inbox worker, poller)."""
MIN_CONNECTIONS = 100
"""Fewer public connections than this is no service: refuse to start instead."""
DEFAULT_MAX_CONNECTIONS = 1000


def raise_file_limit() -> int:
    """Raise the soft limit on open files to the hard one; the soft limit now in force
    (unchanged where the platform has no such limit or refuses)."""
    try:
        import resource
    except ImportError:  # not on this platform
        return 1 << 20
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft == resource.RLIM_INFINITY:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    else:
        target = hard
    if soft != resource.RLIM_INFINITY and target > soft:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def engine_connections(engine: Engine) -> int:
    """Database connections one engine may open: its pool (size plus overflow) and the
    one-statement pool beside it, sized the same (``connector.core.database``)."""
    return 2 * pool_capacity(engine)


def reserved_descriptors(*, database_connections: int, orgs: int, admin_connections: int) -> int:
    """Descriptors the process needs besides the public listener's connections."""
    return (
        BASE_DESCRIPTORS
        + database_connections
        + orgs * CRM_CONNECTIONS_PER_ORG
        + (admin_connections)
    )


def connection_cap(file_limit: int, reserved: int, wanted: int) -> int:
    """The public listener's connection cap: ``wanted``, or what ``file_limit`` leaves after
    ``reserved`` when that is less; ConfigError (one line) when it leaves under
    ``MIN_CONNECTIONS``."""
    room = file_limit - reserved
    if room < MIN_CONNECTIONS:
        raise ConfigError(
            f"the open-file limit ({file_limit}) leaves {max(room, 0)} connections after the "
            f"{reserved} files the database pools, CRM clients and admin listener need; "
            f"raise it (ulimit -n, the hard limit) to at least {reserved + MIN_CONNECTIONS}"
        )
    return min(wanted, room)


def count_from_env(name: str, default: int, env: Mapping[str, str] | None = None) -> int:
    """$``name`` as a whole number (unset or empty: ``default``); ConfigError (one line)
    for anything else."""
    raw = (os.environ if env is None else env).get(name, "").strip()
    if not raw:
        return default
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 9:
        raise ConfigError(f"{name} must be a whole number, got {raw[:20]!r}")
    return int(raw)
