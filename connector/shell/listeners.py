"""The listeners' own limits, decided at start: the admin listener's caps and token rule,
and the public listener's connection cap from the open-file limit
(``connector.shell.fd_limits``)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from sqlalchemy import Engine

from connector.core.config import ConfigError, OrgConfig
from connector.shell.fd_limits import (
    connection_cap,
    engine_connections,
    raise_file_limit,
    reserved_descriptors,
)

log = logging.getLogger(__name__)

ADMIN_MAX_CONNECTIONS = 64
"""The admin listener's connection cap (an operator, a scraper and a health check need few)."""
ADMIN_LIMITS: dict[str, Any] = {
    "max_connections": ADMIN_MAX_CONNECTIONS,
    "max_connections_per_peer": None,  # on loopback every client is one address
}


def _loopback(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


MIN_ADMIN_TOKEN_CHARS = 32


def check_admin_binding(host: str, token: str | None) -> None:
    """Health and metrics name the orgs and their queues: off loopback they need a token, and
    a token, wherever it is set, must be long enough not to be guessed."""
    if token is not None and len(token) < MIN_ADMIN_TOKEN_CHARS:
        raise ConfigError(
            f"CONNECTOR_ADMIN_TOKEN is {len(token)} characters; use at least "
            f'{MIN_ADMIN_TOKEN_CHARS} (e.g. python3 -c "import secrets; '
            'print(secrets.token_urlsafe(32))")'
        )
    from connector.shell.dashboard.security import session_seconds_from_env

    session_seconds_from_env()  # a bad value stops the start here, in one line
    if not _loopback(host) and not token:
        raise ConfigError(
            f"the admin listener on {host} is reachable from other machines: set "
            "CONNECTOR_ADMIN_TOKEN, or bind it to 127.0.0.1 (--admin-host)"
        )


def public_connection_cap(
    engine: Engine, configs: Mapping[str, OrgConfig], wanted: int, *, admin: bool
) -> int:
    """Raise the soft file limit to the hard one; the public listener's connection cap that
    leaves room for the database pools, the CRM clients and the admin listener."""
    from connector.intake.receivers import STORE_POOL_SIZE

    file_limit = raise_file_limit()
    reserved = reserved_descriptors(
        # the engine's pools, the receivers' insert pool, the outbox LISTEN connection
        database_connections=engine_connections(engine) + STORE_POOL_SIZE + 1,
        orgs=len(configs),
        admin_connections=ADMIN_MAX_CONNECTIONS if admin else 0,
    )
    cap = connection_cap(file_limit, reserved, wanted)
    if cap < wanted:
        log.warning(
            "the open-file limit (%d) leaves room for %d public connections, not %d",
            file_limit,
            cap,
            wanted,
        )
    return cap
