"""The outbox dispatcher: writes assigned owners back to the CRM.

Any number of dispatchers (threads, processes, machines) share an org's outbox: each claim
takes ready rows under a lease in a short transaction, the CRM is called with no transaction
open, and the result is recorded in another short transaction. A parent Account with a
claim in flight is not claimed again until that claim finishes, and a claim's requests
(``plan_batches``: sorted by parent, cut into full batches) go out one after another, so one
Account is never locked by two of our requests at the same time (Salesforce's
UNABLE_TO_LOCK_ROW). Claims read pending rows from a floor id up (connector/core/floor.py).
A partial request goes out only from a claim that took every ready row from its floor up
while no other claim was in flight (``hold_tail``); CRM quotas count requests. (A row below
the floor, such as another process's retry, is taken by the next full claim, possibly in a
partial request of its own.) Each claim first frees the rows whose lease ended since the
same thread's previous claim (a full claim from the start, every min(30 s, a quarter of the
lease), frees every expired lease), so the rows of a dispatcher that died are claimed again
once their lease expires; the dead worker's late result is ignored because finishing checks
the claim token. While a claim works, a ``LeaseKeeper`` thread (connector/core/leases.py)
renews the lease of its rows not finished yet every quarter of it, during CRM calls too, so
the lease is short (10 s) and a dead dispatcher's rows are taken over about a lease after it
died; a claim also renews before a CRM call once a quarter of the lease has gone since the
last renewal (``lease_wants_renewal``), and stops when a renewal found rows taken back.

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

This module holds the ``Dispatcher``: its rounds (claim, read owners, write, record), the
lease kept meanwhile, and its loops. The claim's transaction is
``connector.writeback.claiming``'s, the rounds' counts are ``connector.writeback.stats``'
``DispatchStats``, and listing or requeuing finished rows is ``connector.writeback.finished``'s.
"""

from __future__ import annotations

import functools
import logging
import random
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, TextClause, text

import db
from connector.core import outage
from connector.core.database import one_statement
from connector.core.errors import DatabaseError
from connector.core.floor import ClaimFloor
from connector.core.leases import DEFAULT_LEASE_S, HeldRows, LeaseKeeper
from connector.core.ownership import owner_key
from connector.core.pacing import NOMINAL_CALLS_PER_S, Spacer, pacing_for
from connector.writeback.claiming import ClaimDeferred, claim_rows
from connector.writeback.outcomes import (
    Claimed,
    Dead,
    Decision,
    Pause,
    Policy,
    Retry,
    Sent,
    Superseded,
    decide_guard,
    decide_outcomes,
    decide_request_failure,
    finish_params,
    guard_writes,
    lease_valid,
    lease_wants_renewal,
    outcome_error,
    requests_of,
    unexpected_error,
)
from connector.writeback.stats import DispatchStats
from crm_adapters.base import AuthError, CrmAdapter, CrmError, OwnerWrite

__all__ = ["Claimed", "Dispatcher", "guard_writes"]

log = logging.getLogger(__name__)

_SQL: dict[str, TextClause] = {k: text(v) for k, v in db.queries("outbox").items()}
_RENEW_HELD = db.pyformat(db.queries("outbox")["renew_held"])


class _TakenBack(Exception):
    """A lease renewal found rows of the claim no longer ours."""


class Dispatcher:
    """Drains one org's outbox through one adapter.

    The I/O of a round is claim SQL -> read owners -> write -> finish SQL; every decision in
    between is a pure function of ``connector.writeback.outcomes``.
    """

    def __init__(
        self,
        engine: Engine,
        org: str,
        adapter: CrmAdapter,
        *,
        claim_limit: int | None = None,
        lease_seconds: float = DEFAULT_LEASE_S,
        max_attempts: int = 8,
        backoff_base: float = 0.5,
        backoff_cap: float = 60.0,
        intake_owner_ids: Sequence[str],
        auth_pause_seconds: float = 60.0,
        spacer: Spacer | None = None,
        nudge: threading.Event | None = None,
        rng: Callable[[], float] = random.random,
        clock: Callable[[], float] = time.monotonic,
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
        # After a partial round: wait for the inbox worker's nudge when it runs in this
        # process (the next owner writes come from its next round), else for a turn on the
        # spacer, which the org's dispatchers in one process share (connector.core.pacing).
        self.nudge = nudge
        self.spacer = spacer or Spacer(pacing_for(NOMINAL_CALLS_PER_S).cycle_s)
        self.rng = rng
        # the lease is timed on it (monotonic seconds; tests step it)
        self.clock = clock
        self._local = threading.local()

    @property
    def floor(self) -> ClaimFloor:
        """Where this thread's claims start reading (connector/core/floor.py): from the start,
        freeing expired leases, at least every 30 s (a quarter of a shorter lease). One per
        thread: `connector dispatch --concurrency N` runs one Dispatcher in N threads, and a
        floor is not thread-safe."""
        floor: ClaimFloor | None = getattr(self._local, "floor", None)
        if floor is None:
            floor = self._local.floor = ClaimFloor.for_lease(self.lease_seconds)
        return floor

    @floor.setter
    def floor(self, value: ClaimFloor) -> None:
        self._local.floor = value

    @property
    def policy(self) -> Policy:
        return Policy(
            max_attempts=self.max_attempts,
            backoff_base=self.backoff_base,
            backoff_cap=self.backoff_cap,
            auth_pause_seconds=self.auth_pause_seconds,
        )

    # -- claiming -------------------------------------------------------------------------
    def claim(self, token: str) -> list[Claimed]:
        """Claim ready rows under a lease: the rows this round sends, possibly none.

        Only the backlog's tail goes out in a partial request (``hold_tail``): a claim whose
        partial last request could still be filled gives those rows back in the same
        transaction, and one with no full request at all is rolled back. So with a backlog
        that was ready when the dispatchers started, every write request is full but one.
        """
        try:
            return self._claim(token)
        except ClaimDeferred:
            return []

    def _claim(self, token: str) -> list[Claimed]:
        floor, full = self.floor.next_claim()
        # every claim frees the leases that ended since this thread's previous rescue (a
        # full claim: all of them)
        since = None if full else getattr(self._local, "rescued_at", None)
        done = claim_rows(
            self.engine,
            self.org,
            token,
            kind=self.adapter.kind,
            max_batch=self.adapter.max_batch,
            limit=self.claim_limit,
            lease_seconds=self.lease_seconds,
            floor=floor,
            since=since,
        )
        self._committed(done.rescued_at, done.rescued, [c.id for c in done.claimed], full)
        if done.claimed:
            self.floor.skipped(done.skipped, floor, done.top)
        return done.kept

    def _committed(
        self, rescued_at: datetime, rescued: list[int], ids: list[int], full: bool
    ) -> None:
        """Tell this thread's floor and rescue window what a committed claim did."""
        self._local.rescued_at = rescued_at
        self.floor.rescued(rescued)
        self.floor.claimed(ids, full, exhausted=len(ids) < self.claim_limit)

    # -- one round --------------------------------------------------------------------------
    def run_once(self) -> DispatchStats:
        """Claim what is ready, write it to the CRM, record the results."""
        token = uuid.uuid4().hex
        claimed_at = self.clock()  # taken before the claim: never later than its lease
        claimed = self.claim(token)
        stats = DispatchStats(claimed=len(claimed))
        if not claimed:
            return stats
        held = HeldRows(c.id for c in claimed)
        renew = held.renewal(functools.partial(self._renew_held, token))
        with LeaseKeeper(renew, self.lease_seconds, started_at=claimed_at, clock=self.clock) as k:
            self._send(token, claimed, claimed_at, stats, held, k)
        return stats

    def _send(
        self,
        token: str,
        claimed: Sequence[Any],
        claimed_at: float,
        stats: DispatchStats,
        held: HeldRows,
        keeper: LeaseKeeper,
    ) -> None:
        """The claim's requests, in order, while ``keeper`` renews its lease."""
        rows = {str(c.id): c for c in claimed}
        batches = requests_of(claimed, self.adapter.max_batch)
        lease_from: float | None = claimed_at
        for i, batch in enumerate(batches):
            lease_from = self._keep_lease(token, batches[i:], keeper.since(lease_from), stats)
            if lease_from is None:
                break
            decisions: list[Decision] = []
            failure: CrmError | None = None
            undecided: Sequence[OwnerWrite] = batch
            try:
                to_write = undecided = self._guard(batch, rows, decisions, stats)
                if to_write:
                    # the owner read may have been slow: the write needs the lease too
                    lease_from = self._keep_lease(
                        token, [to_write, *batches[i + 1 :]], keeper.since(lease_from), stats
                    )
                    if lease_from is None:
                        self._record(token, decisions, stats, held)
                        break
                    stats.requests += 1
                    outcomes = self.adapter.write_owners(to_write)
                    for o in outcomes:
                        err = outcome_error(o)
                        if err is not None:
                            stats.count_error(err.code)
                    decisions += decide_outcomes(outcomes, rows, self.policy, self.rng)
            except CrmError as exc:
                stats.count_error(exc.code)
                failure = exc
            except Exception as exc:  # an adapter bug or a transport error it did not classify
                log.exception("org %s: unexpected error writing owners", self.org)
                stats.count_error(type(exc).__name__)
                failure = unexpected_error(exc)
            if failure is not None:
                # The failure covers what this request left undecided and every later request
                # of the claim; rows the owner read already settled keep that decision.
                rest = [*undecided, *(w for b in batches[i + 1 :] for w in b)]
                failed, pause = decide_request_failure(failure, rest, rows, self.policy, self.rng)
                decisions += failed
                if pause is not None:
                    if isinstance(failure, AuthError):
                        log.error(
                            "org %s: CRM refused our credentials (%s); pausing writes for %.0f s",
                            self.org,
                            failure.code,
                            pause.seconds,
                        )
                    self._pause(pause)
                self._record(token, decisions, stats, held)
                break
            self._record(token, decisions, stats, held)

    def _keep_lease(
        self,
        token: str,
        left: Sequence[Sequence[OwnerWrite]],
        lease_from: float | None,
        stats: DispatchStats,
    ) -> float | None:
        """Before a CRM call: when the lease started (monotonic, never later than the
        database's), renewed once a quarter of it has gone; None when the claim must send
        nothing more (its lease may have ended, a finish found rows taken back, a renewal did,
        or the renewal failed), with the writes `left` counted as stale."""
        now = self.clock()
        if lease_from is None or not lease_valid(now - lease_from, self.lease_seconds, stats.stale):
            self._give_up(left, stats)
            return None
        if lease_wants_renewal(now - lease_from, self.lease_seconds):
            if not self._renew(token, [int(w.key) for b in left for w in b]):
                self._give_up(left, stats)
                return None
            stats.renewals += 1
            lease_from = now
        return lease_from

    def _renew(self, token: str, ids: list[int]) -> bool:
        """Extend the lease of these rows of the claim (one statement): False, with nothing
        changed, when any was taken back or the database could not be reached."""
        try:
            with self.engine.begin() as conn:
                params = {"ids": ids, "token": token, "lease_seconds": self.lease_seconds}
                if len(conn.execute(_SQL["renew"], params).all()) != len(ids):
                    # rolled back: the rows still ours keep the lease they had, so their
                    # parents are not held for another lease by a claim that stops here
                    raise _TakenBack
        except _TakenBack:
            return False
        except DatabaseError:  # the engine translates driver errors (core/database.py)
            # not the CRM's failure, so no row is judged by it: the rows stay claimed until
            # their lease ends and are taken again then
            log.warning("org %s: could not renew a claim's lease; stopping it", self.org)
            return False
        return True

    def _renew_held(self, token: str, ids: list[int]) -> bool:
        """The keeper's renewal (one autocommit statement: a process frozen meanwhile holds
        no row lock): False when a row was taken back; database errors are raised."""
        params = {"ids": ids, "token": token, "lease_seconds": self.lease_seconds}
        row = one_statement(self.engine, _RENEW_HELD, params)
        return row is not None and row[0] == len(ids)

    def _give_up(self, left: Sequence[Sequence[OwnerWrite]], stats: DispatchStats) -> None:
        """The claim sends nothing more: its unsent writes are counted stale."""
        n = sum(len(b) for b in left)
        stats.stale += n
        log.warning(
            "org %s: claim lease ended or rows taken back; "
            "%d unsent writes left to another dispatcher",
            self.org,
            n,
        )

    def _guard(
        self,
        batch: Sequence[OwnerWrite],
        rows: dict[str, Claimed],
        decisions: list[Decision],
        stats: DispatchStats,
    ) -> list[OwnerWrite]:
        """Read the records' current owners (one CRM call) and keep only the safe writes."""
        stats.reads += 1
        records = self.adapter.fetch_records([w.record_id for w in batch], [])
        kind = self.adapter.kind
        current = {
            owner_key(kind, r.crm_id): r.fields.get(self.adapter.owner_field) for r in records
        }
        write, decided = decide_guard(batch, current, rows, kind, self.intake)
        decisions += decided
        superseded = sum(1 for d in decided if isinstance(d, Superseded))
        if superseded:
            log.warning(
                "org %s: %d owner writes superseded: a person changed the owner in the CRM",
                self.org,
                superseded,
            )
        return write

    def _record(
        self,
        token: str,
        decisions: Sequence[Decision],
        stats: DispatchStats,
        held: HeldRows | None = None,
    ) -> None:
        """Store a request's decisions (one statement); rows no longer ours are not touched."""
        applied = 0
        held = held or HeldRows(())
        if decisions:
            with held.finishing(d.row_id for d in decisions), self.engine.begin() as conn:
                params = {**finish_params(decisions), "token": token}
                applied = len(conn.execute(_SQL["finish"], params).all())
        # pending again under their ids, due later: the floor must not pass them
        self.floor.rescheduled((d.row_id, d.delay) for d in decisions if isinstance(d, Retry))
        total = len(decisions)
        stats.superseded += sum(1 for d in decisions if isinstance(d, Superseded))
        stats.sent += sum(1 for d in decisions if isinstance(d, Sent))
        stats.dead += sum(1 for d in decisions if isinstance(d, Dead))
        stats.retried += sum(1 for d in decisions if isinstance(d, Retry))
        stats.stale += total - applied
        if total != applied:
            log.warning(
                "org %s: %d results arrived after their lease expired; ignored",
                self.org,
                total - applied,
            )
        for d in decisions:
            if isinstance(d, Dead):
                log.warning(
                    "org %s: outbox row %d is dead: %s",
                    self.org,
                    d.row_id,
                    d.reason,
                    extra={"org": self.org, "outbox_id": d.row_id},
                )

    def _pause(self, pause: Pause) -> None:
        log.error(
            "org %s: pausing CRM writes for %.0f s (%s)", self.org, pause.seconds, pause.reason
        )
        with self.engine.begin() as conn:
            conn.execute(
                _SQL["pause_org"],
                {"org": self.org, "seconds": pause.seconds, "reason": pause.reason},
            )

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
        """Claim and write until ``stop`` is set; a round in progress is finished first.

        After a round that was not full, the next one waits for the inbox worker's nudge when
        there is one (or ``poll_interval``, for rows from elsewhere and retries coming due),
        and a round not started by a nudge waits for its turn on the spacer: under a steady
        trickle that turns many tiny requests into few fuller ones (CRM quotas count
        requests). A full round goes on at once.
        """
        full = False
        while not stop.is_set():
            if not full:
                if self.nudge is None:
                    wait = self.spacer.reserve()
                    if wait > 0 and stop.wait(wait):
                        break
                else:
                    # A nudged round goes at once (the inbox's rounds are paced already) but
                    # takes its turn, so rounds started by the poll, for rows from elsewhere
                    # (an import, a retry), stay a cycle apart; a nudge cuts that wait short.
                    if self.nudge.wait(poll_interval):
                        self.spacer.note()
                    else:
                        wait = self.spacer.reserve()
                        if wait > 0 and self.nudge.wait(wait):
                            self.spacer.note()  # the nudge came first: its round goes now
                    self.nudge.clear()
                    if stop.is_set():  # (a stopping service wakes every nudge event)
                        break
            try:
                stats = self.run_once()
                if on_stats is not None:
                    on_stats(stats)
            except Exception as exc:
                if not outage.counted("dispatcher rounds", exc):
                    log.exception("org %s: dispatcher round failed; retrying", self.org)
                full = False
                stop.wait(1.0)
                continue
            full = stats.claimed >= self.adapter.max_batch
            if not stats.claimed and self.nudge is None:
                stop.wait(poll_interval)
