"""What the dispatcher decides about its claimed rows, as pure functions on plain data.

The dispatcher's I/O is claim SQL -> read owners -> write -> finish SQL; everything it decides
in between is here and takes no database, no CRM and no clock (the jitter source is a
parameter): how a claim is cut into requests and which rows go back unsent, whether the lease
still covers the next request, which writes the owners just read allow, and what each row
becomes after the CRM answered: ``Sent``, ``Superseded`` (with the owner found), ``Dead``
(with the reason) or ``Retry`` (after a delay), plus whether the org's writes must pause.

The retry policy, as the dispatcher has always applied it:

- a row's attempt is counted when it is claimed (SQL); rows claimed but not sent (a partial
  last request held back, ``hold_tail``) are given back in the same transaction with the
  attempt returned (``RoundPlan.released``);
- a per-record retryable error (a locked row, a 429 for that record) retries while the row has
  attempts left (``attempts < max_attempts``), else the row is dead;
- a whole-request failure the CRM reported (5xx, timeouts, resets, 429, refused credentials)
  is not the record's fault: it retries whatever the attempts, so an outage never
  dead-letters an owner write; only an error the adapter did not classify (``UNEXPECTED``)
  spends the budget; a whole request refused as permanent kills every row in it;
- the delay is jittered exponential backoff on the attempts so far, capped at
  ``backoff_cap`` and, without Retry-After, at the row's age (after an outage of T every row
  is retried within about T of the recovery); a Retry-After is honoured as given;
- an org-wide rate limit pauses the org's writes for its Retry-After (an hour if none), and
  refused credentials pause them for ``auth_pause_seconds``.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from connector.core.ownership import is_unrouted, owner_key
from crm_adapters.base import (
    AuthError,
    CrmError,
    OwnerWrite,
    PermanentError,
    RateLimitedError,
    RetryableError,
    WriteOutcome,
)
from crm_adapters.batching import backoff_delay, plan_batches

__all__ = [
    "NOT_FOUND",
    "ORG_LIMIT_PAUSE_S",
    "Claimed",
    "Dead",
    "Decision",
    "Pause",
    "Policy",
    "Retry",
    "RoundPlan",
    "Sent",
    "Superseded",
    "decide_guard",
    "decide_outcomes",
    "decide_request_failure",
    "describe",
    "finish_params",
    "guard_writes",
    "hold_tail",
    "lease_valid",
    "lease_wants_renewal",
    "outcome_error",
    "plan_round",
    "requests_of",
    "retry_delay",
    "superseded_reason",
    "unexpected_error",
]

NOT_FOUND = "NOT_FOUND: the record is not in the CRM"
ORG_LIMIT_PAUSE_S = 3600.0  # an org-wide limit that names no Retry-After

Rng = Callable[[], float]


@dataclass(frozen=True)
class Claimed:
    """An outbox row as claimed: ``attempts`` already counts this claim."""

    id: int
    crm_id: str
    owner_id: str
    parent_id: str | None
    attempts: int
    age: float = 0.0  # seconds since the row was created (caps its retry delay)
    # Owners our own earlier writes of this lead may have left in the CRM (a reassignment):
    # this write may replace them; any other owner is a person's.
    replaces: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Policy:
    """The dispatcher's retry and pause settings."""

    max_attempts: int = 8
    backoff_base: float = 0.5
    backoff_cap: float = 60.0
    auth_pause_seconds: float = 60.0


@dataclass(frozen=True)
class Sent:
    """The CRM has our owner (written now, or it already had it)."""

    row_id: int


@dataclass(frozen=True)
class Superseded:
    """A person set another owner first: never written."""

    row_id: int
    owner: str


@dataclass(frozen=True)
class Dead:
    """Retrying cannot help (or the attempts are spent): dead-lettered with the reason."""

    row_id: int
    reason: str


@dataclass(frozen=True)
class Retry:
    """Back to pending, claimable again after ``delay`` seconds."""

    row_id: int
    reason: str
    delay: float


Decision = Sent | Superseded | Dead | Retry


@dataclass(frozen=True)
class Pause:
    """Stop every write of the org for ``seconds``."""

    seconds: float
    reason: str


@dataclass(frozen=True)
class RoundPlan:
    """What one claim sends (`kept`, cut into `batches` in sending order) and the ids of
    the rows it gives back unsent (`released`)."""

    kept: list[Claimed]
    batches: list[list[OwnerWrite]]
    released: list[int]


def describe(err: CrmError) -> str:
    """The reason stored with a row: the CRM's code and (at most 300 chars of) its message."""
    msg = err.message[:300] if err.message else ""
    return f"{err.code}: {msg}" if msg else err.code


def superseded_reason(owner: str) -> str:
    return f"the CRM showed another owner just before the write: {owner}"


def requests_of(claimed: Sequence[Claimed], max_batch: int) -> list[list[OwnerWrite]]:
    """The write requests of claimed rows, in sending order (``plan_batches``): sorted by
    parent and cut into full requests; only the last may be smaller."""
    writes = [OwnerWrite(str(c.id), c.crm_id, c.owner_id, c.parent_id) for c in claimed]
    return plan_batches(writes, max_batch)


def hold_tail(claimed: int, max_batch: int, claim_limit: int, others_in_flight: bool) -> bool:
    """Should a claim of `claimed` rows give back the rows of its partial last request?

    A partial request goes out only from a claim that took every ready row while no other
    claim of the org was in flight: that is the backlog's one true tail. While another claim
    is in flight its dispatcher, or whoever claims after it, will claim these rows again
    with more (what that claim leaves free or gives back), and the last one standing sends
    one merged tail. A full claim (``claim_limit`` rows) most likely left rows behind that
    the next claim can add. Under a trickle nobody else is in flight, so a lone row goes out
    at once; one that arrives while another claim is in flight waits for that claim only.
    """
    if claimed % max_batch == 0:
        return False
    if others_in_flight:
        return True
    return claimed >= claim_limit and claimed > max_batch


def plan_round(
    claimed: Sequence[Claimed], max_batch: int, claim_limit: int, *, others_in_flight: bool
) -> RoundPlan:
    """Which claimed rows this round sends, in which requests, and which go back unsent.

    When the partial last request is held back (``hold_tail``), the rows given back are the
    newest claimed (highest ids), whatever their parent: claims take the oldest ready rows
    first, so a row given back is claimed again ahead of every newer row and is not passed
    over for ever (given back by parent order, a row of the last parent could be). Giving
    back any subset is safe for parents: a parent with rows of this claim still in flight is
    not claimed by anyone else until they are finished, and this claim never sends that
    parent again once its rows are done. Every request of the plan is full (``max_batch``
    rows) but, when nothing is held back, the last.
    """
    keep = list(claimed)
    released: list[int] = []
    tail = len(keep) % max_batch
    if hold_tail(len(keep), max_batch, claim_limit, others_in_flight):
        by_age = sorted(keep, key=lambda c: c.id)
        keep, released = by_age[:-tail], [c.id for c in by_age[-tail:]]
    return RoundPlan(keep, requests_of(keep, max_batch), released)


def lease_valid(elapsed: float, lease_seconds: float, stale_results: int) -> bool:
    """May the next request of a claim go out? Not once the lease may have run out (measured
    from before the claim, so never late) or a finish already found rows taken back: another
    dispatcher may hold them now, and writing them too would put two of our requests on one
    record or Account."""
    return stale_results == 0 and elapsed < lease_seconds


def lease_wants_renewal(elapsed: float, lease_seconds: float) -> bool:
    """Extend the lease before the next CRM call? Once a quarter of it has gone, so every call
    starts with at least three quarters of a lease left: 45 s of the default 60, room for the
    CRM timeout (30 s) and a wait in HubSpot's rate limiter (up to 10.55 s). Renewing before
    every call would cost a statement per request for nothing."""
    return elapsed >= lease_seconds / 4


def guard_writes(
    batch: Sequence[OwnerWrite],
    current: dict[str, str | None],
    kind: str,
    intake: frozenset[str],
    replaces: Mapping[str, frozenset[str]] | None = None,
) -> tuple[list[OwnerWrite], list[str], list[tuple[str, str]], list[str]]:
    """Sort one request's writes by the owners the CRM has now.

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


def decide_guard(
    batch: Sequence[OwnerWrite],
    current: dict[str, str | None],
    rows: Mapping[str, Claimed],
    kind: str,
    intake: frozenset[str],
) -> tuple[list[OwnerWrite], list[Decision]]:
    """(the writes still safe to send, the decisions for the others): already ours is sent,
    a person's owner supersedes us, a record the CRM no longer has is dead."""
    replaces = {k: r.replaces for k, r in rows.items() if r.replaces}
    write, ours, superseded, missing = guard_writes(batch, current, kind, intake, replaces)
    decisions: list[Decision] = [Sent(rows[k].id) for k in ours]
    decisions += [Superseded(rows[k].id, owner) for k, owner in superseded]
    decisions += [Dead(rows[k].id, NOT_FOUND) for k in missing]
    return write, decisions


def retry_delay(row: Claimed, err: CrmError, policy: Policy, rng: Rng = random.random) -> float:
    """Seconds before the row may be tried again after `err`."""
    retry_after = err.retry_after if isinstance(err, RetryableError) else None
    delay = backoff_delay(
        max(row.attempts - 1, 0),
        base=policy.backoff_base,
        cap=policy.backoff_cap,
        rng=rng,
        retry_after=retry_after,
    )
    if retry_after is None:
        # Never wait longer than the row has existed: after an outage of T every row is
        # retried within about T of the CRM's recovery (the backlog drains within twice
        # the outage), while a long outage still backs off exponentially up to the cap.
        delay = min(delay, max(row.age, policy.backoff_base))
    return delay


def outcome_error(outcome: WriteOutcome) -> CrmError | None:
    """The error of a failed outcome (a failure that names none counts as permanent)."""
    if outcome.ok:
        return None
    return outcome.error or PermanentError("UNKNOWN", "no error given")


def decide_outcomes(
    outcomes: Sequence[WriteOutcome],
    rows: Mapping[str, Claimed],
    policy: Policy,
    rng: Rng = random.random,
) -> list[Decision]:
    """Per-record results: ok is sent; a retryable error retries while attempts last."""
    decisions: list[Decision] = []
    for o in outcomes:
        row = rows[o.key]
        err = outcome_error(o)
        if err is None:
            decisions.append(Sent(row.id))
        elif isinstance(err, RetryableError) and row.attempts < policy.max_attempts:
            decisions.append(Retry(row.id, describe(err), retry_delay(row, err, policy, rng)))
        else:
            decisions.append(Dead(row.id, describe(err)))
    return decisions


def unexpected_error(exc: BaseException) -> RetryableError:
    """An exception the adapter did not classify (a bug, an unmapped transport error)."""
    return RetryableError("UNEXPECTED", type(exc).__name__)


def _is_crm_trouble(exc: CrmError) -> bool:
    """A whole-request failure that says nothing about the records (quota, credentials, a
    CRM that is down): retried without limit."""
    return isinstance(exc, RateLimitedError | AuthError) or (
        isinstance(exc, RetryableError) and exc.code != "UNEXPECTED"
    )


def decide_request_failure(
    exc: CrmError,
    writes: Sequence[OwnerWrite],
    rows: Mapping[str, Claimed],
    policy: Policy,
    rng: Rng = random.random,
) -> tuple[list[Decision], Pause | None]:
    """A raise covers every write of the claim not yet attempted (`writes`)."""
    pause: Pause | None = None
    if isinstance(exc, RateLimitedError) and exc.scope == "org":
        seconds = exc.retry_after if exc.retry_after is not None else ORG_LIMIT_PAUSE_S
        pause = Pause(seconds, describe(exc))
    elif isinstance(exc, AuthError):
        pause = Pause(policy.auth_pause_seconds, describe(exc))
    decisions: list[Decision] = []
    for w in writes:
        row = rows[w.key]
        if isinstance(exc, PermanentError):
            decisions.append(Dead(row.id, describe(exc)))
        elif _is_crm_trouble(exc) or row.attempts < policy.max_attempts:
            # Not the record's fault: never dead-letter it, or an outage of a minute would
            # lose every owner write in flight.
            decisions.append(Retry(row.id, describe(exc), retry_delay(row, exc, policy, rng)))
        else:
            decisions.append(Dead(row.id, describe(exc)))
    return decisions, pause


def finish_params(decisions: Sequence[Decision]) -> dict[str, list[object]]:
    """The columns of the ``finish`` statement (ids, states, errors, delays, owners)."""
    cols: dict[str, list[object]] = {
        "ids": [],
        "states": [],
        "errors": [],
        "delays": [],
        "owners": [],
    }
    row: tuple[int, str, str | None, float, str | None]
    for d in decisions:
        match d:
            case Sent(row_id):
                row = (row_id, "sent", None, 0.0, None)
            case Dead(row_id, reason):
                row = (row_id, "dead", reason, 0.0, None)
            case Retry(row_id, reason, delay):
                row = (row_id, "pending", reason, delay, None)
            case Superseded(row_id, owner):
                row = (row_id, "superseded", superseded_reason(owner), 0.0, owner)
        for name, value in zip(cols, row, strict=True):
            cols[name].append(value)
    return cols
