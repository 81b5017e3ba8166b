"""Waking the dispatchers of another process: PostgreSQL's LISTEN/NOTIFY on one channel.

In ``connector run`` the inbox worker wakes its own process's dispatchers when a round's
routing has committed (``connector.core.pacing.Nudges``). With the receiver and the
dispatchers in separate processes (``connector serve`` or ``run --dispatchers 0``, and
``connector dispatch``) the worker announces each round that claimed events instead
(``announce``: one ``pg_notify`` with the org, once the round is over; a round that failed
announces too, which costs the dispatchers an empty claim), and every ``dispatch`` process
listens (``OutboxListener``) and nudges its dispatchers of that org, so a routed lead is
written in the same cycle instead of on the dispatchers' next one (up to one more cycle:
BENCHMARKS.md, "Webhooks").

An announcement is only a hint. A dispatcher still claims what is ready, and still starts a
round on its own cycle when no nudge comes (``Dispatcher.run_forever``), so a lost one (the
listener reconnecting, a process not yet listening, a failed announce) costs at most that
cycle. After each (re)connect the listener nudges every org once, for what was announced
while nobody listened. One announcement per inbox round, not per lead: PostgreSQL serialises
the commits of notifying transactions, and the per-lead path stays free of it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable

from sqlalchemy import Engine

import db
from connector.core import outage
from connector.core.database import Notifications, notifications_for, one_statement
from connector.core.errors import DatabaseError
from connector.core.pacing import Nudges
from crm_adapters.batching import backoff_delay

__all__ = ["OutboxListener", "announce", "listener_for"]

log = logging.getLogger(__name__)

_QUERIES = db.queries("outbox")
_ANNOUNCE = db.pyformat(_QUERIES["announce_ready"])


def announce(engine: Engine, org: str) -> None:
    """Tell the listening dispatchers that ``org`` has new owner writes. Never raises: when
    the announcement cannot be sent the dispatchers find the rows on their own cycle."""
    try:
        one_statement(engine, _ANNOUNCE, {"org": org})  # its own transaction, one round trip
    except DatabaseError as exc:
        if not outage.counted("wake-up announcements", exc):
            log.warning("org %s: announcing new owner writes failed: %s", org, exc)


class OutboxListener:
    """Listens for announcements and nudges this process's dispatchers of the org named.

    Runs in a thread (``start``) until ``stop`` is set; a stop is seen within
    ``receive_timeout`` (or, while a ping waits on a dead connection, once libpq gives it up:
    30 s with ``listener_for``'s settings). After ``ping_after`` seconds without an
    announcement it checks the connection with a round trip (a connection that a load
    balancer or NAT dropped while it was quiet would otherwise wait in silence; TCP
    keepalives, set by ``listener_for``, are the second line). When the connection breaks it
    reconnects with backoff (full jitter, ``retry_base`` doubling up to ``retry_cap``
    seconds; the backoff starts over only after a connection lived ``retry_cap`` seconds, so
    a server that ends every session soon after it starts is not hammered). Announcements for
    orgs this process does not dispatch are ignored. Nothing it meets ends the thread before
    ``stop``: an unexpected error is logged with its traceback and retried like a lost
    connection.
    """

    def __init__(
        self,
        notifications: Notifications,
        nudges: Nudges,
        orgs: Iterable[str],
        *,
        retry_base: float = 0.5,
        retry_cap: float = 30.0,
        receive_timeout: float = 1.0,
        ping_after: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.notifications = notifications
        self.nudges = nudges
        self.orgs = frozenset(orgs)
        self.retry_base = retry_base
        self.retry_cap = retry_cap
        self.receive_timeout = receive_timeout
        self.ping_after = ping_after
        self.clock = clock
        self.listening = threading.Event()  # set while a connection listens (/healthz reads it)
        self.connects = 0  # successful (re)connects

    def start(self, stop: threading.Event) -> threading.Thread:
        thread = threading.Thread(
            target=self.run, args=(stop,), name="outbox-listener", daemon=True
        )
        thread.start()
        return thread

    def run(self, stop: threading.Event) -> None:
        failures = 0
        try:
            while not stop.is_set():
                opened = self.clock()
                try:
                    self._listen(stop)
                except DatabaseError as exc:
                    if not outage.counted("outbox listener", exc):
                        log.warning(
                            "outbox listener: %s; dispatchers go on their own cycle until it "
                            "listens again",
                            exc,
                        )
                except Exception:
                    log.exception("outbox listener failed; it starts again")
                self.listening.clear()
                self.notifications.close()
                if self.clock() - opened >= self.retry_cap:
                    failures = 0
                stop.wait(backoff_delay(failures, self.retry_base, self.retry_cap))
                failures += 1
        finally:
            self.listening.clear()
            self.notifications.close()

    def _listen(self, stop: threading.Event) -> None:
        self.notifications.open()
        self.connects += 1
        if self.connects > 1:
            log.info("outbox listener: listening again")
        self.listening.set()
        for org in self.orgs:  # what was announced while nobody listened
            self.nudges.nudge(org)
        heard = self.clock()
        while not stop.is_set():
            orgs = self.notifications.receive(self.receive_timeout)
            for org in orgs:
                if org in self.orgs:
                    self.nudges.nudge(org)
            now = self.clock()
            if orgs:
                heard = now
            elif now - heard >= self.ping_after:
                self.notifications.ping()
                heard = now


def listener_for(engine: Engine, nudges: Nudges, orgs: Iterable[str]) -> OutboxListener:
    """An ``OutboxListener`` on the database of ``engine``."""
    conn_args = {
        "connect_timeout": 10,
        "application_name": "lrc-outbox-listener",
        # libpq's TCP keepalives: a dead peer is found in about a minute, not the kernel's 2 h
        "keepalives": 1,
        "keepalives_idle": 30,
        "keepalives_interval": 10,
        "keepalives_count": 3,
        # and a ping unanswered for 30 s fails instead of retransmitting for ~15 minutes
        # (keepalives are not sent while sent data waits for its ACK)
        "tcp_user_timeout": 30_000,
    }
    source = notifications_for(engine, _QUERIES["listen_ready"], conn_args)
    return OutboxListener(source, nudges, orgs)
