"""Waking the dispatchers of another process: PostgreSQL's LISTEN/NOTIFY on one channel.

In ``connector run`` the inbox worker wakes its own process's dispatchers when a round's
routing has committed (``connector.core.pacing.Nudges``). With the receiver and the
dispatchers in separate processes (``connector serve`` and ``connector dispatch``) the worker
announces each such round instead (``announce``: one ``pg_notify`` with the org, after the
round committed), and every ``dispatch`` process listens (``OutboxListener``) and nudges its
dispatchers of that org, so a routed lead is written in the same cycle instead of on the
dispatchers' next one (up to one more cycle: BENCHMARKS.md, "Webhooks").

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
from collections.abc import Iterable

from sqlalchemy import Engine

import db
from connector.core.errors import DatabaseError, Notifications, notifications_for, one_statement
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
        log.warning("org %s: announcing new owner writes failed: %s", org, exc)


class OutboxListener:
    """Listens for announcements and nudges this process's dispatchers of the org named.

    Runs in a thread (``start``) until ``stop`` is set, reconnecting with backoff (full
    jitter, ``retry_base`` doubling up to ``retry_cap`` seconds) when the connection breaks;
    a stop is seen within ``receive_timeout``. Announcements for orgs this process does not
    dispatch are ignored.
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
    ) -> None:
        self.notifications = notifications
        self.nudges = nudges
        self.orgs = frozenset(orgs)
        self.retry_base = retry_base
        self.retry_cap = retry_cap
        self.receive_timeout = receive_timeout
        self.listening = threading.Event()  # set while a connection listens (tests wait on it)
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
                try:
                    self.notifications.open()
                    self.connects += 1
                    if failures:
                        log.info("outbox listener: listening again after %d failures", failures)
                    failures = 0
                    self.listening.set()
                    for org in self.orgs:  # what was announced while nobody listened
                        self.nudges.nudge(org)
                    while not stop.is_set():
                        for org in self.notifications.receive(self.receive_timeout):
                            if org in self.orgs:
                                self.nudges.nudge(org)
                except DatabaseError as exc:
                    self.listening.clear()
                    self.notifications.close()
                    log.warning(
                        "outbox listener: %s; dispatchers go on their own cycle until it "
                        "listens again",
                        exc,
                    )
                    stop.wait(backoff_delay(failures, self.retry_base, self.retry_cap))
                    failures += 1
        finally:
            self.listening.clear()
            self.notifications.close()


def listener_for(engine: Engine, nudges: Nudges, orgs: Iterable[str]) -> OutboxListener:
    """An ``OutboxListener`` on the database of ``engine``."""
    conn_args = {"connect_timeout": 10, "application_name": "lrc-outbox-listener"}
    source = notifications_for(engine, _QUERIES["listen_ready"], conn_args)
    return OutboxListener(source, nudges, orgs)
