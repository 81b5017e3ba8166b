"""The intake inbox: pushes are stored by record id, then read back from the CRM and routed.

A receiver commits each delivery's record ids to ``intake_events`` in one short transaction
and answers at once (Salesforce and HubSpot both want a fast answer, and calling the CRM inside
a transaction is forbidden). An ``InboxWorker`` (any number, in any number of processes:
SKIP LOCKED claims under a lease, so a dead worker's claim is rescued) then, per claim:

1. drops the records that are already routed (a redelivery changes nothing),
2. reads the others from the CRM with the org's own credentials, with no transaction open,
   in the adapter's batches (SOQL ``Id IN`` of 200, HubSpot batch read of 100),
3. routes the records the CRM says are unrouted, with the fields of that read, records the
   others as skipped with the reason, and marks the events, all in one transaction (the skips
   and the events first, so the teams' locks that routing takes are held for the routing and
   the commit only).

A failed read is retried with exponential backoff; after ``max_attempts`` the events are dead
and ``connector inbox list --dead`` / ``connector inbox retry`` show and requeue them.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import math
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine, TextClause, text

import db
from connector.core import outage
from connector.core.config import OrgConfig
from connector.core.crm_kinds import crm_kind, org_pacing
from connector.core.database import AsyncPool, one_statement
from connector.core.errors import DatabaseError, DatabaseUnavailable
from connector.core.floor import ClaimFloor
from connector.core.leases import DEFAULT_LEASE_S, LeaseKeeper
from connector.core.metrics import Metrics
from connector.intake.verify import Verdict, judge_all, readable_ids
from connector.routing.assign import Outcome, Router, RoutingError
from crm_adapters.base import CrmAdapter, RateLimitedError

log = logging.getLogger(__name__)

SQL: dict[str, TextClause] = {k: text(v) for k, v in db.queries("inbox").items()}
INSERT_EVENTS_NOW = db.pyformat(db.queries("inbox")["insert_events"])
INSERT_EVENT_BATCH = db.pyformat(db.queries("inbox")["insert_event_batch"])
RENEW_NOW = db.pyformat(db.queries("inbox")["renew"])

INBOX_STATES = ("pending", "claimed", "done", "skipped", "dead")

AdapterSource = Callable[[str], CrmAdapter]
"""org name -> that org's CRM adapter (built once, shared by threads)."""


def _event_params(
    cfg: OrgConfig, event_keys: Sequence[str], crm_ids: Sequence[str]
) -> dict[str, Any]:
    return {
        "org": cfg.org,
        "source": crm_kind(cfg.crm.kind).intake_source,
        "crm_object": cfg.crm_object,
        "event_keys": list(event_keys),
        "crm_ids": list(crm_ids),
    }


def store_events(
    conn: Connection,
    cfg: OrgConfig,
    event_keys: Sequence[str],
    crm_ids: Sequence[str],
) -> int:
    """Commit-ready insert of one delivery's events; the number that were new."""
    if not event_keys:
        return 0
    return len(conn.execute(SQL["insert_events"], _event_params(cfg, event_keys, crm_ids)).all())


async def store_events_now(
    pool: AsyncPool,
    cfg: OrgConfig,
    event_keys: Sequence[str],
    crm_ids: Sequence[str],
) -> int:
    """The same insert as ``store_events`` as one autocommit statement on the event loop:
    stored durably when it returns (the receivers' path: one round trip, no thread hop).
    Returns the number of events that were new."""
    if not event_keys:
        return 0
    rows = await pool.fetch_all(INSERT_EVENTS_NOW, _event_params(cfg, event_keys, crm_ids))
    return len(rows)


STORE_TIMEOUT_SECONDS = 10.0
"""How long a receiver waits for its events' commit before it answers 503 (retry later)."""


@dataclass
class _Delivery:
    cfg: OrgConfig
    keys: Sequence[str]
    ids: Sequence[str]
    done: asyncio.Future[int]


def count_new(deliveries: Sequence[_Delivery], inserted: Iterable[tuple[str, str]]) -> list[int]:
    """How many events of each delivery were new, given the (org, event_key) pairs one batch
    insert returned. A key sent twice (in one delivery, or in two of the batch) is new for
    its first sender only, as two separate inserts would have had it."""
    fresh = set(inserted)
    counts = []
    for d in deliveries:
        n = 0
        for key in d.keys:
            if (d.cfg.org, key) in fresh:
                fresh.discard((d.cfg.org, key))
                n += 1
        counts.append(n)
    return counts


def batch_params(deliveries: Sequence[_Delivery]) -> dict[str, list[str]]:
    params: dict[str, list[str]] = {
        k: [] for k in ("orgs", "sources", "event_keys", "crm_objects", "crm_ids")
    }
    for d in deliveries:
        n = len(d.keys)
        params["orgs"] += [d.cfg.org] * n
        params["sources"] += [crm_kind(d.cfg.crm.kind).intake_source] * n
        params["crm_objects"] += [d.cfg.crm_object] * n
        params["event_keys"] += d.keys
        params["crm_ids"] += d.ids
    return params


class EventWriter:
    """Group commit for the receivers: deliveries that arrive while an insert is in flight
    are stored together by the next one (one statement, one commit, one WAL flush), so the
    number of statements adapts to the database's latency instead of queueing behind it.

    ``store`` returns only after the statement holding the delivery's events committed, so an
    ACK still means stored. At most ``max_in_flight`` statements run at once, each with at
    most ``max_events`` events (a delivery is never split). If a batch of several deliveries
    is refused for a reason other than an outage, each is retried alone, so one bad delivery
    cannot fail the others.
    """

    def __init__(
        self,
        pool: AsyncPool,
        *,
        max_in_flight: int = 4,
        max_events: int = 2000,
        store_timeout: float = STORE_TIMEOUT_SECONDS,
    ):
        self.pool = pool
        self.max_in_flight = max_in_flight
        self.max_events = max_events
        self.store_timeout = store_timeout
        self._queue: collections.deque[_Delivery] = collections.deque()
        self._in_flight = 0

    async def store(self, cfg: OrgConfig, keys: Sequence[str], ids: Sequence[str]) -> int:
        """Store one delivery's events; the number that were new."""
        if not keys:
            return 0
        done: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._queue.append(_Delivery(cfg, list(keys), list(ids), done))
        if self._in_flight < self.max_in_flight:
            self._in_flight += 1
            asyncio.get_running_loop().create_task(self._flush())
        try:
            # A hung statement (a lock held by someone else, a dead peer) must not hold the
            # sender for ever: it gets a 503 and retries. The insert may still commit later;
            # the retry is then recognised as a duplicate. (Cancelling ``done`` is safe:
            # ``_settle`` skips a future that is already done.)
            return await asyncio.wait_for(done, self.store_timeout)
        except TimeoutError:
            raise DatabaseUnavailable(
                f"events not stored within {self.store_timeout:g} s"
            ) from None

    def _take(self) -> list[_Delivery]:
        batch = [self._queue.popleft()]
        events = len(batch[0].keys)
        while self._queue and events + len(self._queue[0].keys) <= self.max_events:
            events += len(self._queue[0].keys)
            batch.append(self._queue.popleft())
        return batch

    async def _flush(self) -> None:
        try:
            while self._queue:
                batch = self._take()
                try:
                    rows = await self.pool.fetch_all(INSERT_EVENT_BATCH, batch_params(batch))
                except Exception as exc:
                    await self._failed(batch, exc)
                    continue
                for d, n in zip(batch, count_new(batch, rows), strict=True):
                    _settle(d.done, n)
        finally:
            self._in_flight -= 1

    async def _failed(self, batch: list[_Delivery], exc: Exception) -> None:
        if len(batch) == 1 or isinstance(exc, DatabaseUnavailable):
            for d in batch:
                _settle(d.done, exc)
            return
        for d in batch:
            try:
                n = await store_events_now(self.pool, d.cfg, d.keys, d.ids)
            except Exception as alone:
                _settle(d.done, alone)
            else:
                _settle(d.done, n)


def _settle(done: asyncio.Future[int], outcome: int | Exception) -> None:
    if done.done():  # the request was cancelled meanwhile
        return
    if isinstance(outcome, Exception):
        done.set_exception(outcome)
    else:
        done.set_result(outcome)


def record_skips(conn: Connection, cfg: OrgConfig, source: str, skips: Sequence[Verdict]) -> None:
    """Remember why records were not routed (latest reason per record), record and owner ids
    in their stored form (Salesforce: 18 characters)."""
    if skips:
        key = crm_kind(cfg.crm.kind).id_key
        conn.execute(
            SQL["record_skips"],
            {
                "org": cfg.org,
                "crm_object": cfg.crm_object,
                "source": source,
                "crm_ids": [key(v.crm_id) for v in skips],
                "reasons": [v.reason or "" for v in skips],
                "owners": [None if v.owner is None else key(v.owner) for v in skips],
            },
        )


def count_outcomes(metrics: Metrics, org: str, source: str, outcomes: Sequence[Outcome]) -> None:
    for o in outcomes:
        metrics.leads_ingested.labels(source, o.status).inc()
        if o.status == "assigned" and o.team:
            metrics.assignments.labels(org, o.team).inc()


def read_unrouted(
    engine: Engine, cfg: OrgConfig, adapter: CrmAdapter, crm_ids: Sequence[str]
) -> tuple[set[str], list[Verdict]]:
    """(ids already routed, verdicts for the others from one batched CRM read).

    Already-routed records are not read again: a redelivery or re-import changes nothing, and
    our own write-back would otherwise look like a person's owner. No transaction is open
    while the CRM is called.
    """
    key = crm_kind(cfg.crm.kind).id_key  # compared with leads' stored ids
    ids = list(dict.fromkeys(key(i) for i in crm_ids))
    with engine.connect() as conn:
        routed = {
            r.crm_id
            for r in conn.execute(
                SQL["already_routed"],
                {"org": cfg.org, "crm_object": cfg.crm_object, "crm_ids": ids},
            )
        }
    to_check = [i for i in ids if i not in routed]
    if not to_check:
        return routed, []
    wanted = readable_ids(cfg, to_check)
    records = adapter.fetch_records(wanted, cfg.read_fields) if wanted else []
    return routed, judge_all(cfg, to_check, records, adapter.owner_field)


@dataclass(frozen=True)
class InboxRow:
    id: int
    crm_id: str


class InboxWorker:
    """Drains ``intake_events``: claim (short transaction), read from the CRM (no
    transaction), route and record (one transaction)."""

    def __init__(
        self,
        engine: Engine,
        configs: Mapping[str, OrgConfig],
        routers: Mapping[str, Router],
        adapters: AdapterSource,
        metrics: Metrics,
        *,
        batch_size: int = 200,
        lease_seconds: float = DEFAULT_LEASE_S,
        max_attempts: int = 10,
        base_delay: float = 1.0,
        max_delay: float = 300.0,
        poll_interval: float = 0.5,
        spacing: Mapping[str, float] | None = None,
    ) -> None:
        self.engine = engine
        self.configs = dict(configs)
        self.routers = routers
        self.adapters = adapters
        self.metrics = metrics
        self.batch_size = batch_size
        self.lease_seconds = lease_seconds
        self.max_attempts = max_attempts
        self.base_delay = base_delay
        self.max_delay = max_delay
        self.poll_interval = poll_interval
        # Seconds between the starts of two partial claims of an org, so that one CRM read
        # covers what arrived meanwhile (HubSpot's budget counts calls: one read per delivery
        # at 100 req/s would exhaust it). From the org's budget (connector.core.pacing).
        pacing = {org: org_pacing(cfg.crm) for org, cfg in self.configs.items()}
        self.spacing = {org: (spacing or {}).get(org, p.cycle_s) for org, p in pacing.items()}
        # ...and a paced claim of more than one CRM read takes whole reads only.
        self.read_units = {org: p.read_unit for org, p in pacing.items()}
        self._next_claim = dict.fromkeys(self.configs, -math.inf)
        # Where each org's claim starts reading (connector/core/floor.py); a full claim
        # from the start, which also frees expired leases, at least every 30 s (a quarter of
        # the lease when that is shorter).
        self.floors = {org: ClaimFloor.for_lease(lease_seconds) for org in self.configs}
        # Called with the org after each round that claimed events, once its routing has
        # committed (``connector run`` nudges the org's dispatchers with it, see
        # connector.core.pacing.Nudges).
        self.on_routed: Callable[[str], None] | None = None
        self.worker_id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def wake(self) -> None:
        self._wake.set()

    def start(self) -> None:
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="inbox-worker", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.is_set():
            now = time.monotonic()
            if not self._next_claim:  # no org configured
                self._stop.wait(self.poll_interval)
                continue
            due = [org for org, at in self._next_claim.items() if at <= now]
            if not due:  # every org claimed a moment ago: wait for the first one's turn
                self._stop.wait(min(self._next_claim.values()) - now)
                continue
            self._wake.clear()
            done = 0
            for org in due:
                started = time.monotonic()  # each org's spacing from its own claim
                try:
                    done += self.drain_once([org], started=started)
                except Exception as exc:  # keep the worker alive; a full claim frees leases
                    if not outage.counted("inbox rounds", exc):
                        log.warning("inbox worker: org %s: %s", org, type(exc).__name__)
                    self._next_claim[org] = started + self.spacing[org]
            if done == 0:  # nothing came: sleep until a delivery wakes us, or poll
                now = time.monotonic()
                later = [at - now for at in self._next_claim.values() if at > now]
                self._wake.wait(min([self.poll_interval, *later]))

    def drain_once(self, orgs: Sequence[str] | None = None, started: float | None = None) -> int:
        """Process one claim per org (of ``orgs``, default all); the number of events handled.

        With ``started`` (the worker's loop), an org whose claim was partial or empty is not
        claimed again until its spacing has passed since ``started``; a full claim (a
        backlog) may be followed at once.
        """
        handled = 0
        for org in sorted(orgs if orgs is not None else self.configs):
            paced = started is not None
            rows = self._claim(org, self.read_units[org] if paced else 1, full=not paced)
            if started is not None and len(rows) < self.batch_size:  # empty ones too
                self._next_claim[org] = started + self.spacing[org]
            if rows:
                with LeaseKeeper(functools.partial(self._renew, rows), self.lease_seconds):
                    self._process(self.configs[org], rows)
                handled += len(rows)
                if self.on_routed is not None:
                    self.on_routed(org)
        return handled

    def drain(self, rounds: int = 1000) -> int:
        """Process until nothing is ready (tests and `--once` commands)."""
        total = 0
        for _ in range(rounds):
            n = self.drain_once()
            total += n
            if n == 0:
                break
        return total

    def _claim(self, org: str, unit: int = 1, full: bool = False) -> list[InboxRow]:
        """Claim up to ``batch_size`` ready events; beyond ``unit``, whole units only. From
        the org's floor up, or with ``full`` (or when the floor says it is time) from the
        start, after freeing expired leases."""
        floors = self.floors[org]
        floor, due = floors.next_claim()
        if full and not due:
            floor, due = 0, True
        if due or floors.sweeping:
            unit = 1  # these claims must tell whether they took all that was ready
        with self.engine.begin() as conn:
            if due:
                rescued = [r.id for r in conn.execute(SQL["rescue_expired"], {"org": org})]
                if rescued:
                    log.warning(
                        "inbox: %d events of org %s had an expired claim; pending again",
                        len(rescued),
                        org,
                    )
                    floors.rescued(rescued)
            result = conn.execute(
                SQL["claim"],
                {
                    "org": org,
                    "worker": self.worker_id,
                    "lease_seconds": self.lease_seconds,
                    "limit": self.batch_size,
                    "unit": unit,
                    "floor": floor,
                },
            ).all()
        floors.claimed((r.id for r in result), due, exhausted=len(result) < self.batch_size)
        return [InboxRow(r.id, r.crm_id) for r in result]

    def _renew(self, rows: list[InboxRow]) -> bool:
        """Extend the claim's lease; False when a row was taken back (the lease had ended)."""
        params = {
            "ids": [r.id for r in rows],
            "worker": self.worker_id,
            "lease_seconds": self.lease_seconds,
        }
        row = one_statement(self.engine, RENEW_NOW, params)
        return row is not None and row[0] == len(rows)

    def _retry_later(
        self,
        org: str,
        rows: list[InboxRow],
        error: str,
        limited: RateLimitedError | None = None,
    ) -> None:
        """Back off (dead after max_attempts), or, over a CRM quota, wait its Retry-After
        without spending an attempt."""
        try:
            with self.engine.begin() as conn:
                back = conn.execute(
                    SQL["retry_later"],
                    {
                        "ids": [r.id for r in rows],
                        "worker": self.worker_id,
                        "max_attempts": self.max_attempts,
                        "base_delay": self.base_delay,
                        "max_delay": self.max_delay,
                        "error": error,
                        "rate_limited": limited is not None,
                        "delay": limited.retry_after if limited is not None else None,
                    },
                ).all()
            # pending again under their old ids: the floor must not pass them
            self.floors[org].rescheduled((r.id, r.due_in) for r in back if r.state == "pending")
        except DatabaseError as exc:
            if not outage.counted("inbox rounds", exc):
                log.warning("inbox: cannot reschedule (%s); the lease will", type(exc).__name__)

    def _process(self, cfg: OrgConfig, rows: list[InboxRow]) -> None:
        source = crm_kind(cfg.crm.kind).intake_source
        try:
            routed, checked = read_unrouted(
                self.engine, cfg, self.adapters(cfg.org), [r.crm_id for r in rows]
            )
        except Exception as exc:  # a CRM or database error, or an adapter bug: retry later
            code = str(getattr(exc, "code", "") or type(exc).__name__)[:100]
            if not outage.counted("inbox rounds", exc):
                self.metrics.crm_errors.labels(cfg.org, code).inc()
                log.warning("inbox: CRM read for org %s failed (%s); will retry", cfg.org, code)
            limited = exc if isinstance(exc, RateLimitedError) else None
            self._retry_later(cfg.org, rows, f"CRM read failed: {code}", limited)
            return
        if checked:
            self.metrics.crm_calls.labels(cfg.org, "fetch_records").inc()
        verdicts = {v.crm_id: v for v in checked}
        leads = [v.lead for v in verdicts.values() if v.lead is not None]
        skips = [v for v in verdicts.values() if v.reason is not None]
        states: list[str] = []
        notes: list[str | None] = []
        key = crm_kind(cfg.crm.kind).id_key  # verdicts are by stored id
        for row in rows:
            v = verdicts.get(key(row.crm_id))
            if v is None or v.reason is None:
                states.append("done")
                notes.append("already routed" if v is None else None)
            else:
                states.append("skipped")
                notes.append(v.reason)
        try:
            with self.engine.begin() as conn:
                # The events' and skips' rows first: routing takes the teams' locks, which
                # are then held only for the routing and the commit, not for these too.
                record_skips(conn, cfg, source, skips)
                conn.execute(
                    SQL["finish"],
                    {
                        "ids": [r.id for r in rows],
                        "states": states,
                        "notes": notes,
                        "worker": self.worker_id,
                    },
                )
                router = self.routers[cfg.org]
                routed_now = router.assign_in_deferred(conn, leads, source)
        except (DatabaseError, RoutingError) as exc:
            # Rolled back; back off (and dead-letter after max_attempts). If even that fails
            # (database down), the lease expires and another claim rescues the rows.
            if not outage.counted("inbox rounds", exc):
                log.warning("inbox: routing for org %s failed: %s", cfg.org, type(exc).__name__)
            self._retry_later(cfg.org, rows, f"routing failed: {type(exc).__name__}")
            return
        outcomes = routed_now()  # after the commit, without the teams' locks
        count_outcomes(self.metrics, cfg.org, source, outcomes)
        for v in skips:
            self.metrics.records_skipped.labels(cfg.org, v.reason or "").inc()
        log.info(
            "inbox: org %s routed %s; skipped %s; %d already routed",
            cfg.org,
            [f"{o.crm_id}:{o.status}" for o in outcomes],
            [f"{v.crm_id}:{v.reason}" for v in skips],
            len(routed),
            extra={
                "org": cfg.org,
                "crm_ids": [o.crm_id for o in outcomes],
                "skipped_crm_ids": [v.crm_id for v in skips],
            },
        )


# --- operator commands -------------------------------------------------------------------


def list_events(engine: Engine, org: str, state: str, limit: int = 100) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        return [
            dict(r._mapping)
            for r in conn.execute(SQL["list"], {"org": org, "state": state, "limit": limit})
        ]


def retry_dead(engine: Engine, org: str, ids: Sequence[int] | None = None) -> int:
    """Requeue dead events (all of the org's, or the given ids); returns how many."""
    with engine.begin() as conn:
        return len(
            conn.execute(SQL["retry_dead"], {"org": org, "ids": list(ids) if ids else None}).all()
        )
