"""An in-memory CrmAdapter: records and users in dicts, scripted failures, a log of requests.

The twin of the real adapters for tests that are about what the connector decides, not about
the wire: no HTTP, no sleeps, fully deterministic. It speaks one CRM's dialect (``kind``
"salesforce" or "hubspot": batch size, owner field, id comparison, error codes), applies owner
writes, and can be told to fail the way a CRM fails: per record (a locked parent, a deleted
record, an inactive owner, a validation rule, any scripted error) or per request (a transient
outage, a rate limit with Retry-After, refused credentials, any exception). Every request it
served is logged, so a test can count write requests and see whether one parent was ever in
two write requests at the same time (``overlaps``: a write locks its records and their
parents, as Salesforce does); ``on_write`` runs while a write request is
in flight, which lets a test start another request at exactly that moment.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Literal

from crm_adapters.base import (
    AuthError,
    CrmError,
    CrmRecord,
    OwnerWrite,
    PermanentError,
    RateLimitedError,
    RetryableError,
    WriteOutcome,
)
from crm_adapters.salesforce_ids import id_key, is_id, to_18

__all__ = [
    "Dialect",
    "MemoryCrm",
    "MemoryRecord",
    "Overlap",
    "ServedRequest",
    "dialect_for",
]

Op = Literal["write_owners", "fetch_records", "changed_since", "check_owners"]
OPS: tuple[Op, ...] = ("write_owners", "fetch_records", "changed_since", "check_owners")


@dataclass(frozen=True)
class Dialect:
    """What differs between CRMs as the connector sees them through the adapter."""

    kind: str
    max_batch: int
    owner_field: str
    parent_field: str | None
    inactive_reason: str  # what check_owners says of an owner that exists but cannot own
    missing: str  # per-record codes (all permanent except `lock`)
    malformed: str
    deleted: str
    unknown_owner: str
    inactive_owner: str
    validation: str
    lock: str
    rate_limit: str
    org_limit: str
    auth: str


SALESFORCE = Dialect(
    kind="salesforce",
    max_batch=200,
    owner_field="OwnerId",
    parent_field="AccountId",
    inactive_reason="inactive",
    missing="INVALID_CROSS_REFERENCE_KEY",
    malformed="MALFORMED_ID",
    deleted="ENTITY_IS_DELETED",
    unknown_owner="INVALID_CROSS_REFERENCE_KEY",
    inactive_owner="INACTIVE_OWNER_OR_USER",
    validation="FIELD_CUSTOM_VALIDATION_EXCEPTION",
    lock="UNABLE_TO_LOCK_ROW",
    rate_limit="429",
    org_limit="REQUEST_LIMIT_EXCEEDED",
    auth="INVALID_SESSION_ID",
)
HUBSPOT = Dialect(
    kind="hubspot",
    max_batch=100,
    owner_field="hubspot_owner_id",
    parent_field=None,
    inactive_reason="archived",
    missing="OBJECT_NOT_FOUND",
    malformed="OBJECT_NOT_FOUND",
    deleted="OBJECT_NOT_FOUND",
    unknown_owner="INVALID_OWNER_ID",
    inactive_owner="INVALID_OWNER_ID",
    validation="VALIDATION_ERROR",
    lock="LOCKED",
    rate_limit="TEN_SECONDLY_ROLLING",
    org_limit="DAILY",
    auth="INVALID_AUTHENTICATION",
)


def dialect_for(kind: str) -> Dialect:
    """The dialect of a CRM kind; ValueError for one the connector does not speak."""
    for d in (SALESFORCE, HUBSPOT):
        if d.kind == kind:
            return d
    raise ValueError(f"unknown CRM kind {kind!r}")


@dataclass
class MemoryRecord:
    """One record as the in-memory CRM holds it (ids in their stored form)."""

    crm_id: str
    owner_id: str | None
    parent_id: str | None
    fields: dict[str, str | None]
    modified_at: datetime
    deleted: bool = False


@dataclass(frozen=True)
class ServedRequest:
    """One request the adapter answered (or refused): `error` is the raised code, if any."""

    seq: int
    op: Op
    record_ids: tuple[str, ...] = ()
    parents: tuple[str, ...] = ()
    error: str | None = None


@dataclass(frozen=True)
class Overlap:
    """A record or parent that two write requests in flight at the same time both locked."""

    locked_id: str
    first_seq: int
    second_seq: int


@dataclass
class _Script:
    """A scripted failure: lets `skip` chances pass, then fires `times` times (None = always)."""

    error: Exception
    times: int | None
    skip: int = 0

    def fire(self) -> bool:
        if self.skip > 0:
            self.skip -= 1
            return False
        if self.times is None:
            return True
        if self.times <= 0:
            return False
        self.times -= 1
        return True

    @property
    def spent(self) -> bool:
        return self.times is not None and self.times <= 0


def _wall_clock() -> datetime:
    return datetime.now(UTC)


class MemoryCrm:
    """A CRM and its adapter in one object (satisfies ``CrmAdapter``); thread-safe."""

    def __init__(
        self,
        kind: str = "salesforce",
        *,
        max_batch: int | None = None,
        clock: Callable[[], datetime] = _wall_clock,
    ) -> None:
        self.dialect = dialect_for(kind)
        self.kind = self.dialect.kind
        self.max_batch = max_batch or self.dialect.max_batch
        self.owner_field = self.dialect.owner_field
        self.on_write: Callable[[ServedRequest], None] | None = None
        self._clock = clock
        self._lock = threading.RLock()
        self._ids = itertools.count(1)
        self._seq = itertools.count(1)
        self._last_stamp = datetime(2000, 1, 1, tzinfo=UTC)
        self._records: dict[str, MemoryRecord] = {}
        self._users: dict[str, bool] = {}  # user id -> active
        self._parents: set[str] = set()
        self._in_flight: dict[int, frozenset[str]] = {}  # write seq -> ids it locks
        self.requests: list[ServedRequest] = []
        self.overlaps: list[Overlap] = []
        self.clear_faults()

    # ------------------------------------------------------------- ids and time
    def _key(self, crm_id: str) -> str:
        """The form ids are compared in (Salesforce: 15 and 18 characters are equal)."""
        return id_key(crm_id.strip()) if self.kind == "salesforce" else crm_id.strip()

    def _new_id(self, prefix: str) -> str:
        n = next(self._ids)
        if self.kind == "salesforce":
            return to_18(f"{prefix}MC{n:010d}")
        return str(100_000 + n)

    def _tick(self) -> datetime:
        """The next modification time: the clock's, never going backwards."""
        self._last_stamp = max(self._clock(), self._last_stamp)
        return self._last_stamp

    # ------------------------------------------------------------- seeding and inspection
    def add_user(self, active: bool = True) -> str:
        """A user (owner) who can own records when active; returns its id."""
        with self._lock:
            uid = self._new_id("005")
            self._users[uid] = active
            return uid

    def set_user_active(self, user_id: str, active: bool) -> None:
        with self._lock:
            self._users[self._key(user_id)] = active

    def add_parent(self) -> str:
        """A parent record (a Salesforce Account): writes to its children lock it."""
        with self._lock:
            pid = self._new_id("001")
            self._parents.add(pid)
            return pid

    def add_record(
        self,
        owner_id: str | None = None,
        parent_id: str | None = None,
        fields: dict[str, str | None] | None = None,
    ) -> str:
        """A record (Lead, Contact) with an owner (None = unowned) and a parent; returns its id."""
        with self._lock:
            rid = self._new_id("003")
            self._records[rid] = MemoryRecord(
                rid,
                self._key(owner_id) if owner_id else None,
                self._key(parent_id) if parent_id else None,
                dict(fields or {}),
                self._tick(),
            )
            return rid

    def person_edit(self, record_id: str, owner_id: str | None) -> None:
        """A person changes the owner in the CRM's UI (not through this adapter)."""
        with self._lock:
            rec = self._records[self._key(record_id)]
            rec.owner_id = self._key(owner_id) if owner_id else None
            rec.modified_at = self._tick()

    def delete(self, record_id: str) -> None:
        """Delete a record: reads no longer return it, writes to it fail permanently."""
        with self._lock:
            self._records[self._key(record_id)].deleted = True

    def record(self, record_id: str) -> MemoryRecord | None:
        """A copy of the record as stored (deleted ones included), or None."""
        with self._lock:
            rec = self._records.get(self._key(record_id))
            return None if rec is None else replace(rec, fields=dict(rec.fields))

    def owner_of(self, record_id: str) -> str | None:
        rec = self.record(record_id)
        return None if rec is None else rec.owner_id

    def write_requests(self) -> list[ServedRequest]:
        """The write requests served so far, refused ones included, in completion order."""
        with self._lock:
            return [r for r in self.requests if r.op == "write_owners"]

    def written_ids(self) -> list[str]:
        """Every record id sent in a write request that was not refused as a whole."""
        return [i for r in self.write_requests() if r.error is None for i in r.record_ids]

    # ------------------------------------------------------------- failures
    def clear_faults(self) -> None:
        """Forget every scripted failure (the data and the request log stay)."""
        with self._lock:
            self._record_faults: dict[str, _Script] = {}
            self._parent_locks: dict[str, _Script] = {}
            self._poisoned: set[str] = set()
            self._request_faults: dict[Op, list[_Script]] = {op: [] for op in OPS}

    def fail_records(
        self, record_ids: Iterable[str], error: CrmError, times: int | None = None
    ) -> None:
        """Writes to these records fail with `error` (the next `times` writes of each, or all)."""
        with self._lock:
            for rid in record_ids:
                self._record_faults[self._key(rid)] = _Script(error, times)

    def lock_parent(self, parent_id: str, times: int | None = 1) -> None:
        """Someone else holds the parent's lock during the next `times` write requests that
        touch it: every child in such a request fails with the lock error (retryable)."""
        err = RetryableError(self.dialect.lock, f"unable to obtain exclusive access: {parent_id}")
        with self._lock:
            self._parent_locks[self._key(parent_id)] = _Script(err, times)

    def poison(self, record_ids: Iterable[str]) -> None:
        """Writes to these records always fail a validation rule (permanent)."""
        with self._lock:
            self._poisoned.update(self._key(r) for r in record_ids)

    def fail_requests(
        self, error: Exception, times: int | None = 1, op: Op = "write_owners", after: int = 0
    ) -> None:
        """After `after` more requests of kind `op` went through, the next `times` (None =
        all) raise `error` and change nothing. Scripts queue up: the first one runs until it
        is used up, then the next."""
        if op not in OPS:
            raise ValueError(f"unknown op {op!r}")
        with self._lock:
            self._request_faults[op].append(_Script(error, times, after))

    def fail_transient(
        self,
        times: int | None = 1,
        op: Op = "write_owners",
        retry_after: float | None = None,
        after: int = 0,
    ) -> None:
        """The CRM is down (a 503 for the whole request), optionally with Retry-After."""
        err = RetryableError("503", "Service Unavailable", retry_after)
        self.fail_requests(err, times, op, after)

    def fail_rate_limited(
        self,
        retry_after: float,
        scope: Literal["request", "org"] = "request",
        times: int | None = 1,
        op: Op = "write_owners",
    ) -> None:
        """Over quota: "request" = back off this call, "org" = a daily/org-wide limit."""
        code = self.dialect.org_limit if scope == "org" else self.dialect.rate_limit
        err = RateLimitedError(code, "over the limit", retry_after, scope=scope)
        self.fail_requests(err, times, op)

    def fail_auth(self, times: int | None = 1, op: Op = "write_owners") -> None:
        """The CRM refuses the credentials."""
        self.fail_requests(AuthError(self.dialect.auth, "credentials refused"), times, op)

    def _request_fault(self, op: Op) -> Exception | None:
        queue = self._request_faults[op]
        while queue and queue[0].spent:
            queue.pop(0)
        return queue[0].error if queue and queue[0].fire() else None

    def _refuse(self, seq: int, op: Op, ids: Sequence[str]) -> None:
        """Raise the scripted whole-request failure of `op`, if any, logging the request."""
        err = self._request_fault(op)
        if err is None:
            return
        code = err.code if isinstance(err, CrmError) else type(err).__name__
        self.requests.append(ServedRequest(seq, op, tuple(ids), (), code))
        raise err

    # ------------------------------------------------------------- CrmAdapter: writes
    def write_owners(self, batch: Sequence[OwnerWrite]) -> list[WriteOutcome]:
        """Apply owner writes; per-record failures are outcomes, scripted ones raise."""
        if not batch:
            return []
        if len(batch) > self.max_batch:
            raise ValueError(f"batch of {len(batch)} exceeds {self.max_batch}")
        ids = tuple(w.record_id for w in batch)
        with self._lock:
            seq = next(self._seq)
            self._refuse(seq, "write_owners", ids)
            parents = self._parents_of(ids)
            locks = parents | {self._key(i) for i in ids}
            for other, held in self._in_flight.items():
                for k in sorted(locks & held):
                    self.overlaps.append(Overlap(k, other, seq))
            self._in_flight[seq] = locks
        served = ServedRequest(seq, "write_owners", ids, tuple(sorted(parents)))
        try:
            if self.on_write is not None:
                self.on_write(served)
            with self._lock:
                locked = {p for p in parents if self._parent_locked(p)}
                outcomes = [self._write_one(w, locked) for w in batch]
                self.requests.append(served)
        finally:
            with self._lock:
                del self._in_flight[seq]
        return outcomes

    def _parents_of(self, ids: Iterable[str]) -> frozenset[str]:
        parents = set()
        for rid in ids:
            rec = self._records.get(self._key(rid))
            if rec is not None and rec.parent_id:
                parents.add(rec.parent_id)
        return frozenset(parents)

    def _parent_locked(self, parent: str) -> bool:
        script = self._parent_locks.get(parent)
        return script is not None and script.fire()

    def _write_one(self, w: OwnerWrite, locked: set[str]) -> WriteOutcome:
        err = self._write_error(w, locked)
        if err is not None:
            return WriteOutcome(w.key, False, err)
        rec = self._records[self._key(w.record_id)]
        rec.owner_id = self._key(w.owner_id)
        rec.modified_at = self._tick()
        return WriteOutcome(w.key, True)

    def _write_error(self, w: OwnerWrite, locked: set[str]) -> CrmError | None:
        d = self.dialect
        if d.kind == "salesforce" and not is_id(w.record_id):
            return PermanentError(d.malformed, "id value of incorrect type")
        key = self._key(w.record_id)
        rec = self._records.get(key)
        if rec is None:
            return PermanentError(d.missing, "no such record")
        if rec.deleted:
            return PermanentError(d.deleted, "entity is deleted")
        if rec.parent_id in locked:
            return RetryableError(d.lock, "unable to obtain exclusive access to the parent")
        script = self._record_faults.get(key)
        if script is not None and script.fire() and isinstance(script.error, CrmError):
            return script.error
        owner = self._key(w.owner_id)
        if owner not in self._users:
            return PermanentError(d.unknown_owner, "no such owner")
        if not self._users[owner]:
            return PermanentError(d.inactive_owner, "the owner is inactive")
        if key in self._poisoned:
            return PermanentError(d.validation, "a validation rule refused the record")
        return None

    # ------------------------------------------------------------- CrmAdapter: reads
    def _as_crm_record(self, rec: MemoryRecord, fields: Sequence[str]) -> CrmRecord:
        values: dict[str, str | None] = {self.owner_field: rec.owner_id}
        if self.dialect.parent_field:
            values[self.dialect.parent_field] = rec.parent_id
        for f in fields:
            if f not in values:
                values[f] = rec.fields.get(f)
        return CrmRecord(rec.crm_id, values, rec.modified_at)

    def fetch_records(self, ids: Sequence[str], fields: Sequence[str]) -> list[CrmRecord]:
        """Existing, undeleted records among `ids`, in input order (one request per call)."""
        with self._lock:
            seq = next(self._seq)
            self._refuse(seq, "fetch_records", ids)
            out = []
            for rid in ids:
                rec = self._records.get(self._key(rid))
                if rec is not None and not rec.deleted:
                    out.append(self._as_crm_record(rec, fields))
            self.requests.append(ServedRequest(seq, "fetch_records", tuple(ids)))
            return out

    def changed_since(
        self, since: datetime, until: datetime | None = None, page_size: int = 200
    ) -> Iterator[list[CrmRecord]]:
        """Undeleted records with since <= modified_at (< until), by (modified_at, id); one
        request per page."""
        if page_size < 1:
            raise ValueError("page_size must be >= 1")
        with self._lock:
            seq = next(self._seq)
            self._refuse(seq, "changed_since", ())
            hits = sorted(
                (
                    r
                    for r in self._records.values()
                    if not r.deleted
                    and r.modified_at >= since
                    and (until is None or r.modified_at < until)
                ),
                key=lambda r: (r.modified_at, r.crm_id),
            )
            pages = [
                [self._as_crm_record(r, list(r.fields)) for r in hits[i : i + page_size]]
                for i in range(0, len(hits), page_size)
            ]
            self.requests.append(ServedRequest(seq, "changed_since"))
            for _ in pages[1:]:
                self.requests.append(ServedRequest(next(self._seq), "changed_since"))
        yield from pages

    def check_owners(self, owner_ids: Sequence[str]) -> dict[str, str | None]:
        """owner id -> None (active), the dialect's inactive reason, or "not found"."""
        with self._lock:
            seq = next(self._seq)
            self._refuse(seq, "check_owners", owner_ids)
            result: dict[str, str | None] = {}
            for o in owner_ids:
                active = self._users.get(self._key(o))
                if active is None:
                    result[o] = "not found"
                else:
                    result[o] = None if active else self.dialect.inactive_reason
            self.requests.append(ServedRequest(seq, "check_owners", tuple(owner_ids)))
            return result

    def usage(self) -> dict[str, object]:
        """Requests served, in all and by kind (an in-memory CRM has no quota)."""
        with self._lock:
            by_op = {op: sum(1 for r in self.requests if r.op == op) for op in OPS}
            return {"kind": self.kind, "requests": len(self.requests), "by_op": by_op}
