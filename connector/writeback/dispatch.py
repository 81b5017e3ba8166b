"""The outbox dispatcher: writes assigned owners back to the CRM.

Any number of dispatchers (threads, processes, machines) share an org's outbox: each claim
takes ready rows under a lease in a short transaction, the CRM is called with no transaction
open, and the result is recorded in another short transaction. A parent Account with a
claim in flight is not claimed again until that claim finishes, and a claim's requests
(``plan_batches``: sorted by parent, cut into full batches) go out one after another, so one
Account is never locked by two of our requests at the same time (Salesforce's
UNABLE_TO_LOCK_ROW). Rows whose
dispatcher died are claimed again once their lease expires; the dead worker's late result is
ignored because finishing checks the claim token.

The CRM is the system of record: just before each write request the dispatcher reads the
current owners of its records (one read per request, same batching) and writes only those
still unowned, owned by an intake owner, or (a reassigned lead) owned by one of the row's
``replaces_owners``: the owner we last wrote, or a write in flight when it was replaced. A
record a person moved meanwhile becomes `superseded`, with the owner found, and is never
written; one that already has the owner we would write is `sent` without a write; one the
CRM no longer has is `dead`. Neither CRM offers
a conditional batch update (Salesforce's If-Unmodified-Since works on single sObject Rows
only), so a person's change that lands between that read and the write (one request round
trip, typically well under a second) can still be overwritten.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine, TextClause, text

import db
from connector.core.ownership import is_unrouted, owner_key
from crm_adapters.base import (
    AuthError,
    CrmAdapter,
    CrmError,
    OwnerWrite,
    PermanentError,
    RateLimitedError,
    RetryableError,
    WriteOutcome,
)
from crm_adapters.batching import backoff_delay, plan_batches

log = logging.getLogger(__name__)

_SQL: dict[str, TextClause] = {k: text(v) for k, v in db.queries("outbox").items()}


class _Deferred(Exception):
    """A claim not worth a CRM request yet (see Dispatcher.claim)."""


@dataclass
class DispatchStats:
    claimed: int = 0
    sent: int = 0
    retried: int = 0
    dead: int = 0
    requests: int = 0
    stale: int = 0
    superseded: int = 0
    reads: int = 0
    errors: dict[str, int] = field(default_factory=dict)

    def add(self, other: DispatchStats) -> None:
        self.claimed += other.claimed
        self.sent += other.sent
        self.retried += other.retried
        self.dead += other.dead
        self.requests += other.requests
        self.stale += other.stale
        self.superseded += other.superseded
        self.reads += other.reads
        for k, v in other.errors.items():
            self.errors[k] = self.errors.get(k, 0) + v


@dataclass(frozen=True)
class Claimed:
    id: int
    crm_id: str
    owner_id: str
    parent_id: str | None
    attempts: int
    age: float = 0.0  # seconds since the row was created (caps its retry delay)
    # Owners our own earlier writes of this lead may have left in the CRM (a reassignment):
    # this write may replace them; any other owner is a person's.
    replaces: frozenset[str] = frozenset()


@dataclass
class _Finish:
    sent: list[int] = field(default_factory=list)
    dead: list[tuple[int, str]] = field(default_factory=list)
    retry: list[tuple[int, str, float]] = field(default_factory=list)
    superseded: list[tuple[int, str]] = field(default_factory=list)


def guard_writes(
    batch: Sequence[OwnerWrite],
    current: dict[str, str | None],
    kind: str,
    intake: frozenset[str],
    replaces: Mapping[str, frozenset[str]] | None = None,
) -> tuple[list[OwnerWrite], list[str], list[tuple[str, str]], list[str]]:
    """Sort one request's writes by the owners the CRM has now (pure).

    ``current`` maps owner_key(record id) -> owner for the records the CRM returned.
    ``replaces`` maps a write's key -> the owners (owner_key form) our own earlier writes of
    that record may have left (a reassignment); the write may replace exactly those, an empty
    owner or an intake owner, never anyone else.
    Returns (to write, already ours: keys, superseded: (key, owner found), missing: keys).
    """
    write: list[OwnerWrite] = []
    ours: list[str] = []
    superseded: list[tuple[str, str]] = []
    missing: list[str] = []
    for w in batch:
        rid = owner_key(kind, w.record_id)
        if rid not in current:
            missing.append(w.key)
            continue
        owner = current[rid]
        if owner and owner_key(kind, owner) == owner_key(kind, w.owner_id):
            ours.append(w.key)
        elif is_unrouted(kind, owner, intake) or (
            owner and owner_key(kind, owner) in (replaces or {}).get(w.key, frozenset())
        ):
            write.append(w)
        else:
            superseded.append((w.key, owner or ""))
    return write, ours, superseded, missing


class Dispatcher:
    """Drains one org's outbox through one adapter."""

    def __init__(
        self,
        engine: Engine,
        org: str,
        adapter: CrmAdapter,
        *,
        claim_limit: int | None = None,
        lease_seconds: float = 60.0,
        max_attempts: int = 8,
        backoff_base: float = 0.5,
        backoff_cap: float = 60.0,
        intake_owner_ids: Sequence[str],
        auth_pause_seconds: float = 60.0,
        linger_seconds: float = 0.5,
    ) -> None:
        self.engine = engine
        self.org = org
        self.adapter = adapter
        self.intake = frozenset(owner_key(adapter.kind, o) for o in intake_owner_ids)
        self.claim_limit = claim_limit or adapter.max_batch * 5
        self.lease_seconds = lease_seconds
        self.max_attempts = max_attempts
        self.backoff_base = backoff_base
        self.backoff_cap = backoff_cap
        self.auth_pause_seconds = auth_pause_seconds
        self.linger_seconds = linger_seconds

    # -- claiming -------------------------------------------------------------------------
    def claim(self, token: str) -> list[Claimed]:
        """Claim ready rows under a lease, or nothing.

        A claim smaller than one request while another claim of this org is in flight is
        rolled back: its rows are mostly the few whose Accounts that claim left free, and
        sending them now would spend a CRM call on a half-empty request. They are claimed
        again, with what the other claim releases, once it finishes.
        """
        try:
            return self._claim(token)
        except _Deferred:
            return []

    def _claim(self, token: str) -> list[Claimed]:
        with self.engine.begin() as conn:
            conn.execute(_SQL["claim_lock"], {"org": self.org})
            rescued = conn.execute(_SQL["rescue_expired"], {"org": self.org}).all()
            if rescued:
                log.warning(
                    "org %s: %d outbox rows had an expired lease; claimable again",
                    self.org,
                    len(rescued),
                )
            if conn.execute(_SQL["paused_until"], {"org": self.org}).first() is not None:
                return []
            rows = conn.execute(
                _SQL["claim"],
                {
                    "org": self.org,
                    "token": token,
                    "limit": self.claim_limit,
                    "lease_seconds": self.lease_seconds,
                },
            ).all()
            if (
                0 < len(rows) < self.adapter.max_batch
                and conn.execute(
                    _SQL["others_in_flight"], {"org": self.org, "token": token}
                ).scalar_one()
            ):
                raise _Deferred  # rolls the claim back
        kind = self.adapter.kind
        return [
            Claimed(
                r.id,
                r.crm_id,
                r.owner_id,
                r.parent_id,
                r.attempts,
                float(r.age),
                frozenset(owner_key(kind, o) for o in r.replaces_owners),
            )
            for r in rows
        ]

    # -- one round --------------------------------------------------------------------------
    def run_once(self) -> DispatchStats:
        """Claim what is ready, write it to the CRM, record the results."""
        token = uuid.uuid4().hex
        claimed_at = time.monotonic()  # taken before the claim: never later than its lease
        claimed = self.claim(token)
        stats = DispatchStats(claimed=len(claimed))
        if not claimed:
            return stats
        by_key = {str(c.id): c for c in claimed}
        writes = [OwnerWrite(str(c.id), c.crm_id, c.owner_id, c.parent_id) for c in claimed]
        batches = plan_batches(writes, self.adapter.max_batch)
        if len(claimed) >= self.claim_limit and len(batches) > 1:
            # More rows are probably waiting: a half-empty last request would cost a CRM call
            # (quotas count calls); its rows go back and fill the next claim's requests.
            tail = batches[-1]
            if len(tail) < self.adapter.max_batch:
                batches.pop()
                with self.engine.begin() as conn:
                    conn.execute(
                        _SQL["release"], {"ids": [int(w.key) for w in tail], "token": token}
                    )
                stats.claimed -= len(tail)
        for i, batch in enumerate(batches):
            if stats.stale or time.monotonic() - claimed_at >= self.lease_seconds:
                # The lease is gone (this process was paused, or the CRM was slow): another
                # dispatcher may hold these rows now, and writing them too would put two of
                # our requests on one record or Account. Leave them to the rescue.
                left = sum(len(b) for b in batches[i:])
                stats.stale += left
                log.warning(
                    "org %s: claim lease expired; %d unsent writes left to another dispatcher",
                    self.org,
                    left,
                )
                break
            finish = _Finish()
            try:
                to_write = self._guard(batch, by_key, finish, stats)
                if to_write:
                    stats.requests += 1
                    outcomes = self.adapter.write_owners(to_write)
                    self._sort_outcomes(outcomes, by_key, finish, stats)
            except CrmError as exc:
                self._count(stats, exc.code)
                rest = [w for b in batches[i:] for w in b]
                self._whole_request_failed(exc, rest, by_key, finish, stats)
                self._record(token, finish, stats)
                break
            except Exception as exc:  # an adapter bug or a transport error it did not classify
                log.exception("org %s: unexpected error writing owners", self.org)
                self._count(stats, type(exc).__name__)
                rest = [w for b in batches[i:] for w in b]
                err = RetryableError("UNEXPECTED", type(exc).__name__)
                self._whole_request_failed(err, rest, by_key, finish, stats)
                self._record(token, finish, stats)
                break
            self._record(token, finish, stats)
        return stats

    def _guard(
        self,
        batch: Sequence[OwnerWrite],
        by_key: dict[str, Claimed],
        finish: _Finish,
        stats: DispatchStats,
    ) -> list[OwnerWrite]:
        """Read the records' current owners (one CRM call) and keep only the safe writes."""
        stats.reads += 1
        records = self.adapter.fetch_records([w.record_id for w in batch], [])
        kind = self.adapter.kind
        current = {
            owner_key(kind, r.crm_id): r.fields.get(self.adapter.owner_field) for r in records
        }
        replaces = {w.key: by_key[w.key].replaces for w in batch if by_key[w.key].replaces}
        write, ours, superseded, missing = guard_writes(batch, current, kind, self.intake, replaces)
        finish.sent.extend(by_key[k].id for k in ours)
        for k, owner in superseded:
            finish.superseded.append((by_key[k].id, owner))
        for k in missing:
            finish.dead.append((by_key[k].id, "NOT_FOUND: the record is not in the CRM"))
        if superseded:
            log.warning(
                "org %s: %d owner writes superseded: a person changed the owner in the CRM",
                self.org,
                len(superseded),
            )
        return write

    def _sort_outcomes(
        self,
        outcomes: Sequence[WriteOutcome],
        by_key: dict[str, Claimed],
        finish: _Finish,
        stats: DispatchStats,
    ) -> None:
        for o in outcomes:
            row = by_key[o.key]
            if o.ok:
                finish.sent.append(row.id)
                continue
            err = o.error or PermanentError("UNKNOWN", "no error given")
            self._count(stats, err.code)
            if isinstance(err, RetryableError) and row.attempts < self.max_attempts:
                finish.retry.append((row.id, _describe(err), self._delay(row, err)))
            else:
                finish.dead.append((row.id, _describe(err)))

    def _whole_request_failed(
        self,
        exc: CrmError,
        writes: Sequence[OwnerWrite],
        by_key: dict[str, Claimed],
        finish: _Finish,
        stats: DispatchStats,
    ) -> None:
        """A raise covers every write not yet attempted in this claim."""
        if isinstance(exc, RateLimitedError) and exc.scope == "org":
            seconds = exc.retry_after if exc.retry_after is not None else 3600.0
            self._pause(seconds, _describe(exc))
        if isinstance(exc, AuthError):
            log.error(
                "org %s: CRM refused our credentials (%s); pausing writes for %.0f s",
                self.org,
                exc.code,
                self.auth_pause_seconds,
            )
            self._pause(self.auth_pause_seconds, _describe(exc))
        for w in writes:
            row = by_key[w.key]
            if isinstance(exc, PermanentError):
                finish.dead.append((row.id, _describe(exc)))
            elif (
                isinstance(exc, RateLimitedError | AuthError)
                or (isinstance(exc, RetryableError) and exc.code != "UNEXPECTED")
                or row.attempts < self.max_attempts
            ):
                # Quota and credential trouble, and a CRM that is down (5xx, timeouts, resets
                # for the whole request), are not the record's fault: never dead-letter it, or
                # an outage of a minute would lose every owner write in flight.
                delay = self._delay(row, exc)
                finish.retry.append((row.id, _describe(exc), delay))
            else:
                finish.dead.append((row.id, _describe(exc)))

    def _delay(self, row: Claimed, err: CrmError) -> float:
        retry_after = err.retry_after if isinstance(err, RetryableError) else None
        delay = backoff_delay(
            max(row.attempts - 1, 0),
            base=self.backoff_base,
            cap=self.backoff_cap,
            retry_after=retry_after,
        )
        if retry_after is None:
            # Never wait longer than the row has existed: after an outage of T every row is
            # retried within about T of the CRM's recovery (the backlog drains within twice
            # the outage), while a long outage still backs off exponentially up to the cap.
            delay = min(delay, max(row.age, self.backoff_base))
        return delay

    def _record(self, token: str, finish: _Finish, stats: DispatchStats) -> None:
        rows: list[tuple[int, str, str | None, float, str | None]] = [
            *((i, "sent", None, 0.0, None) for i in finish.sent),
            *((i, "dead", err, 0.0, None) for i, err in finish.dead),
            *((i, "pending", err, delay, None) for i, err, delay in finish.retry),
            *(
                (
                    i,
                    "superseded",
                    f"the CRM showed another owner just before the write: {o}",
                    0.0,
                    o,
                )
                for i, o in finish.superseded
            ),
        ]
        applied = 0
        if rows:
            with self.engine.begin() as conn:
                ids, states, errors, delays, owners = (list(c) for c in zip(*rows, strict=True))
                params = {
                    "ids": ids,
                    "states": states,
                    "errors": errors,
                    "delays": delays,
                    "owners": owners,
                    "token": token,
                }
                applied = len(conn.execute(_SQL["finish"], params).all())
        total = len(rows)
        stats.superseded += len(finish.superseded)
        stats.sent += len(finish.sent)
        stats.dead += len(finish.dead)
        stats.retried += len(finish.retry)
        stats.stale += total - applied
        if total != applied:
            log.warning(
                "org %s: %d results arrived after their lease expired; ignored",
                self.org,
                total - applied,
            )
        for row_id, reason in finish.dead:
            log.warning("org %s: outbox row %d is dead: %s", self.org, row_id, reason)

    def _pause(self, seconds: float, reason: str) -> None:
        log.error("org %s: pausing CRM writes for %.0f s (%s)", self.org, seconds, reason)
        with self.engine.begin() as conn:
            conn.execute(_SQL["pause_org"], {"org": self.org, "seconds": seconds, "reason": reason})

    @staticmethod
    def _count(stats: DispatchStats, code: str) -> None:
        stats.errors[code] = stats.errors.get(code, 0) + 1

    # -- loops ----------------------------------------------------------------------------
    def open_rows(self) -> tuple[int, float | None]:
        """(rows not yet finished, seconds until the earliest is due or None)."""
        with self.engine.connect() as conn:
            row = conn.execute(_SQL["next_due"], {"org": self.org}).one()
            now = conn.execute(text("SELECT now()")).scalar_one()
        if not row.open:
            return 0, None
        wait = max((row.next_at - now).total_seconds(), 0.0) if row.next_at else 0.0
        return int(row.open), wait

    def drain(
        self, timeout: float = 600.0, idle_sleep: float = 0.05, stop: threading.Event | None = None
    ) -> DispatchStats:
        """Work until no row is pending or claimed (retries included), or the timeout."""
        total = DispatchStats()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not (stop and stop.is_set()):
            stats = self.run_once()
            total.add(stats)
            if stats.claimed:
                continue
            open_rows, wait = self.open_rows()
            if open_rows == 0:
                break
            # rows are waiting for a backoff, a pause, or another dispatcher's lease
            time.sleep(
                min(max(wait or idle_sleep, idle_sleep), 1.0, max(deadline - time.monotonic(), 0))
            )
        return total

    def run_forever(
        self,
        stop: threading.Event,
        poll_interval: float = 0.2,
        on_stats: Callable[[DispatchStats], None] | None = None,
    ) -> None:
        """Claim and write until ``stop`` is set; a round in progress is finished first."""
        while not stop.is_set():
            try:
                stats = self.run_once()
                if on_stats is not None:
                    on_stats(stats)
            except Exception:
                log.exception("org %s: dispatcher round failed; retrying", self.org)
                stop.wait(1.0)
                continue
            if not stats.claimed:
                stop.wait(poll_interval)
            elif stats.claimed < self.adapter.max_batch:
                # A partial batch: let the next one fill up a little. Under a steady trickle
                # this turns many tiny requests into few full ones (CRM quotas count
                # requests), for at most linger_seconds of added latency.
                stop.wait(self.linger_seconds)


def _describe(err: CrmError) -> str:
    msg = err.message[:300] if err.message else ""
    return f"{err.code}: {msg}" if msg else err.code


def finished_rows(
    engine: Engine, org: str, state: str = "dead", limit: int = 100
) -> list[dict[str, Any]]:
    """Dead rows (with the CRM's reason) or superseded ones (with the owner found)."""
    with engine.connect() as conn:
        return [
            dict(r._mapping)
            for r in conn.execute(
                _SQL["list_finished"], {"org": org, "state": state, "limit": limit}
            )
        ]


def retry_dead(engine: Engine, org: str, ids: Sequence[int] | None = None) -> int:
    """Requeue dead rows (all of the org's, or the given ids); returns how many."""
    with engine.begin() as conn:
        return len(
            conn.execute(_SQL["retry_dead"], {"org": org, "ids": list(ids) if ids else None}).all()
        )
