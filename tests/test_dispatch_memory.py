"""The dispatcher's outcome matrix: real Postgres, the in-memory CRM (no HTTP).

Each case scripts the CRM (crm_adapters.memory) and checks what the outbox rows became, what
the CRM holds, and which requests went out. The wire (real clients, real HTTP against the
sandboxes) is covered by test_dispatch.py and test_crm_conformance.py.
"""

from __future__ import annotations

import math
import threading
from typing import Any

import pytest
from sqlalchemy import Engine, text

from connector.core.floor import ClaimFloor
from connector.writeback.dispatch import Claimed, Dispatcher
from connector.writeback.finished import retry_dead
from crm_adapters.base import PermanentError, RetryableError
from crm_adapters.memory import MemoryCrm, ServedRequest
from tests.helpers.clocks import Ticks
from tests.helpers.memory_orgs import ORG, MemoryOrg, memory_org


def _ops(crm: MemoryCrm) -> list[str]:
    return [r.op for r in sorted(crm.requests, key=lambda r: r.seq)]


@pytest.fixture
def org(engine: Engine) -> MemoryOrg:
    return memory_org(engine)


# -- the happy paths -----------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["salesforce", "hubspot"])
def test_every_owner_reaches_the_crm_in_full_requests(engine: Engine, kind: str) -> None:
    o = memory_org(engine, kind)
    parents = [o.crm.add_parent() for _ in range(7)] if kind == "salesforce" else [None]
    ids = o.route(450, parents)
    stats = o.dispatcher().drain(timeout=30)
    rows = o.rows()
    assert o.states() == {"sent": 450}
    assert all(o.crm.owner_of(rid) == rows[rid]["owner_id"] for rid in ids)
    assert {rows[rid]["owner_id"] for rid in ids} == set(o.reps)
    writes = o.crm.write_requests()
    assert len(writes) == stats.requests == math.ceil(450 / o.crm.max_batch)
    assert sorted(o.crm.written_ids()) == sorted(ids)
    # one owner read just before each write
    assert _ops(o.crm) == ["fetch_records", "write_owners"] * len(writes)
    assert o.crm.overlaps == []


def test_a_record_that_already_has_our_owner_is_sent_without_a_write(org: MemoryOrg) -> None:
    (rid,) = org.route(1)
    org.crm.person_edit(rid, org.rows()[rid]["owner_id"])
    stats = org.dispatcher().run_once()
    assert (stats.sent, stats.requests, stats.reads) == (1, 0, 1)
    assert org.states() == {"sent": 1}
    assert org.crm.write_requests() == []


def test_a_person_owner_supersedes_ours_and_is_never_written(org: MemoryOrg) -> None:
    keep, mine = org.route(2)
    person = org.crm.add_user()
    org.crm.person_edit(keep, person)
    stats = org.dispatcher().run_once()
    rows = org.rows()
    assert (rows[keep]["state"], rows[keep]["found_owner"]) == ("superseded", person)
    assert rows[keep]["last_error"].endswith(person)
    assert rows[mine]["state"] == "sent"
    assert org.crm.owner_of(keep) == person
    assert org.crm.written_ids() == [mine]
    assert (stats.superseded, stats.sent) == (1, 1)


def test_an_intake_owned_record_is_written(org: MemoryOrg) -> None:
    (rid,) = org.route(1)
    assert org.crm.owner_of(rid) == org.intake
    org.dispatcher().run_once()
    assert org.crm.owner_of(rid) == org.rows()[rid]["owner_id"] != org.intake


# -- per-record failures ---------------------------------------------------------------------


def test_a_deleted_record_is_dead_as_not_found_without_a_write(org: MemoryOrg) -> None:
    gone, ok = org.route(2)
    org.crm.delete(gone)
    org.dispatcher().run_once()
    rows = org.rows()
    assert rows[gone]["state"] == "dead" and rows[gone]["last_error"].startswith("NOT_FOUND")
    assert org.crm.written_ids() == [ok]


def test_a_locked_parent_retries_its_children_then_sends_them(org: MemoryOrg) -> None:
    busy, free = org.crm.add_parent(), org.crm.add_parent()
    ids = org.route(6, [busy, free])
    org.crm.lock_parent(busy, times=1)
    first = org.dispatcher().run_once()
    rows = org.rows()
    locked = [rid for rid in ids if org.crm.record(rid).parent_id == busy]  # type: ignore[union-attr]
    assert first.retried == 3 and first.sent == 3 and first.errors == {"UNABLE_TO_LOCK_ROW": 3}
    for rid in locked:
        assert (rows[rid]["state"], rows[rid]["attempts"]) == ("pending", 1)
        assert rows[rid]["last_error"].startswith("UNABLE_TO_LOCK_ROW")
    org.dispatcher().drain(timeout=30)
    rows = org.rows()
    assert org.states() == {"sent": 6}
    assert [rows[rid]["attempts"] for rid in locked] == [2, 2, 2]


def test_an_inactive_owner_is_dead_with_the_crms_reason(org: MemoryOrg) -> None:
    ids = org.route(3)
    owners = org.rows()
    gone_rep = owners[ids[0]]["owner_id"]
    org.crm.set_user_active(gone_rep, False)
    org.dispatcher().drain(timeout=30)
    rows = org.rows()
    for rid in ids:
        if rows[rid]["owner_id"] == gone_rep:
            assert rows[rid]["state"] == "dead"
            assert rows[rid]["last_error"].startswith("INACTIVE_OWNER_OR_USER")
            assert org.crm.owner_of(rid) == org.intake
        else:
            assert rows[rid]["state"] == "sent"


def test_a_record_error_that_keeps_recurring_dies_when_attempts_run_out(org: MemoryOrg) -> None:
    stuck, ok = org.route(2)
    org.crm.fail_records([stuck], RetryableError("UNABLE_TO_LOCK_ROW", "busy"))
    org.dispatcher(max_attempts=3).drain(timeout=30)
    rows = org.rows()
    assert (rows[stuck]["state"], rows[stuck]["attempts"]) == ("dead", 3)
    assert rows[stuck]["last_error"] == "UNABLE_TO_LOCK_ROW: busy"
    assert rows[ok]["state"] == "sent"
    assert org.crm.written_ids().count(stuck) == 3


def test_a_poisoned_record_is_dead_and_its_batch_mates_are_sent(org: MemoryOrg) -> None:
    bad, *good = org.route(4)
    org.crm.poison([bad])
    org.dispatcher().run_once()
    rows = org.rows()
    assert rows[bad]["state"] == "dead"
    assert rows[bad]["last_error"].startswith("FIELD_CUSTOM_VALIDATION_EXCEPTION")
    assert all(rows[g]["state"] == "sent" for g in good)


# -- whole-request failures ------------------------------------------------------------------


def test_an_outage_longer_than_the_attempts_dead_letters_nothing(org: MemoryOrg) -> None:
    ids = org.route(5)
    org.crm.fail_transient(times=4)
    stats = org.dispatcher(max_attempts=2).drain(timeout=30)
    rows = org.rows()
    assert org.states() == {"sent": 5}
    assert all(rows[r]["attempts"] == 5 for r in ids)  # past max_attempts, never dead
    assert stats.errors == {"503": 4} and stats.dead == 0
    assert len(org.crm.write_requests()) == 5


def test_a_rate_limit_waits_its_retry_after_without_pausing_the_org(org: MemoryOrg) -> None:
    ids = org.route(3)
    org.crm.fail_rate_limited(3600.0, scope="request")
    stats = org.dispatcher().run_once()
    rows = org.rows()
    assert stats.retried == 3
    assert all(rows[r]["state"] == "pending" for r in ids)
    assert all(rows[r]["due_in_s"] > 3000 for r in ids)  # the Retry-After, not the age cap
    assert org.paused_for() is None
    assert org.dispatcher().run_once().claimed == 0  # not due yet


def test_an_org_rate_limit_pauses_every_write_of_the_org(org: MemoryOrg) -> None:
    ids = org.route(3)
    org.crm.fail_rate_limited(900.0, scope="org")
    org.dispatcher().run_once()
    paused = org.paused_for()
    assert paused is not None and 800 < paused <= 900
    assert all(org.rows()[r]["last_error"].startswith("REQUEST_LIMIT_EXCEEDED") for r in ids)
    more = org.route(2)
    assert org.dispatcher().run_once().claimed == 0
    assert org.rows()[more[0]]["state"] == "pending"


def test_refused_credentials_pause_the_org_and_keep_the_rows(org: MemoryOrg) -> None:
    ids = org.route(3)
    org.crm.fail_auth()
    stats = org.dispatcher(auth_pause_seconds=120, max_attempts=1).run_once()
    paused = org.paused_for()
    assert paused is not None and 60 < paused <= 120
    assert stats.retried == 3 and stats.dead == 0
    assert {org.rows()[r]["state"] for r in ids} == {"pending"}


def test_a_request_refused_as_permanent_kills_its_rows(org: MemoryOrg) -> None:
    ids = org.route(3)
    org.crm.fail_requests(PermanentError("400", "malformed request"))
    org.dispatcher().run_once()
    rows = org.rows()
    assert all(rows[r]["state"] == "dead" for r in ids)
    assert all(rows[r]["last_error"] == "400: malformed request" for r in ids)


def test_an_adapter_bug_is_retried_until_the_attempts_run_out(org: MemoryOrg) -> None:
    (rid,) = org.route(1)
    org.crm.fail_requests(RuntimeError("adapter bug"), times=None)
    stats = org.dispatcher(max_attempts=2).drain(timeout=30)
    row = org.rows()[rid]
    assert (row["state"], row["attempts"]) == ("dead", 2)
    assert row["last_error"] == "UNEXPECTED: RuntimeError"
    assert stats.errors == {"RuntimeError": 2}


def test_a_failed_owner_read_is_a_whole_request_failure_and_nothing_is_written(
    org: MemoryOrg,
) -> None:
    ids = org.route(3)
    org.crm.fail_transient(op="fetch_records")
    stats = org.dispatcher().run_once()
    assert stats.reads == 1 and stats.requests == 0 and stats.retried == 3
    assert org.crm.write_requests() == []
    assert {org.rows()[r]["state"] for r in ids} == {"pending"}


def test_a_failure_mid_claim_retries_the_rest_and_keeps_what_was_sent(engine: Engine) -> None:
    o = memory_org(engine, max_batch=10)
    ids = o.route(25)
    o.crm.fail_transient(after=1)  # the second write request of the claim fails
    stats = o.dispatcher(claim_limit=100).run_once()
    rows = o.rows()
    sent = {r for r in ids if rows[r]["state"] == "sent"}
    assert len(sent) == 10 and set(o.crm.written_ids()) == sent
    assert stats.retried == 15 and stats.stale == 0
    assert len(o.crm.write_requests()) == 2  # the third request never went out
    assert _ops(o.crm) == ["fetch_records", "write_owners", "fetch_records", "write_owners"]


def test_rows_the_owner_read_settled_keep_their_state_when_the_write_fails(org: MemoryOrg) -> None:
    """Superseded, already-ours and missing rows of a request are final even if the write
    of the request's other rows then fails: the failure covers only what it left undecided."""
    person_owned, ours, gone, pending = org.route(4)
    owners = org.rows()
    person = org.crm.add_user()
    org.crm.person_edit(person_owned, person)
    org.crm.person_edit(ours, owners[ours]["owner_id"])
    org.crm.delete(gone)
    org.crm.fail_transient()
    stats = org.dispatcher().run_once()
    rows = org.rows()
    assert rows[person_owned]["state"] == "superseded"
    assert rows[ours]["state"] == "sent"
    assert rows[gone]["state"] == "dead"
    assert rows[pending]["state"] == "pending"
    assert (stats.superseded, stats.sent, stats.dead, stats.retried, stats.stale) == (1, 1, 1, 1, 0)


# -- leases and concurrency ------------------------------------------------------------------


def test_an_expired_lease_sends_nothing_and_leaves_the_rows_to_the_rescue(org: MemoryOrg) -> None:
    ids = org.route(4)
    stats = org.dispatcher(lease_seconds=0).run_once()
    assert stats.claimed == 4 and stats.stale == 4
    assert org.crm.requests == []  # not even the owner read
    assert org.states() == {"claimed": 4}
    org.dispatcher().drain(timeout=30)  # the rescue (lease_until < now) makes them claimable
    assert org.states() == {"sent": 4}
    assert sorted(org.crm.written_ids()) == sorted(ids)


class NaiveDispatcher(Dispatcher):
    """Claims the next pending rows whatever their parent (row locks only): what the real
    claim's "no other claim in flight for this parent" test prevents."""

    def _claim(self, token: str) -> list[Claimed]:
        with self.engine.begin() as conn:
            rows = conn.execute(
                text(
                    "WITH ready AS (SELECT id FROM outbox WHERE org = :org AND state = 'pending' "
                    "ORDER BY id LIMIT :limit FOR UPDATE SKIP LOCKED) "
                    "UPDATE outbox o SET state = 'claimed', claimed_by = :token, "
                    "attempts = o.attempts + 1, lease_until = now() + interval '60 seconds' "
                    "FROM ready WHERE o.id = ready.id "
                    "RETURNING o.id, o.crm_id, o.owner_id, o.parent_id, o.attempts"
                ),
                {"org": self.org, "token": token, "limit": self.claim_limit},
            ).all()
        return [Claimed(r.id, r.crm_id, r.owner_id, r.parent_id, r.attempts) for r in rows]


@pytest.mark.parametrize("naive", [False, True], ids=["dispatcher", "naive-claim"])
def test_no_parent_is_in_two_write_requests_at_once(engine: Engine, naive: bool) -> None:
    """While dispatcher A's first write is in flight, dispatcher B runs a whole round.

    Parents are interleaved, so A's claim holds every parent: the real claim gives B nothing
    to send, the naive one sends B's rows of the same Accounts at the same time (the overlap
    Salesforce answers with UNABLE_TO_LOCK_ROW)."""
    o = memory_org(engine, max_batch=5)
    parents = [o.crm.add_parent() for _ in range(3)]
    o.route(30, parents)
    a = o.dispatcher(claim_limit=6)
    b = (NaiveDispatcher if naive else Dispatcher)(
        engine, ORG, o.crm, intake_owner_ids=o.cfg.intake_owner_ids, claim_limit=6
    )
    during: list[int] = []
    started: list[int] = []

    def b_runs_now(req: ServedRequest) -> None:
        if not started:  # once, during A's first write (not again for B's own writes)
            started.append(req.seq)
            during.append(b.run_once().requests)

    o.crm.on_write = b_runs_now
    a.run_once()
    o.crm.on_write = None
    if naive:
        assert during[0] >= 1
        assert {ov.locked_id for ov in o.crm.overlaps} & set(parents)
    else:
        assert during == [0]
        assert o.crm.overlaps == []
    Dispatcher(engine, ORG, o.crm, intake_owner_ids=o.cfg.intake_owner_ids).drain(timeout=30)
    assert o.states() == {"sent": 30}


def test_dispatchers_write_other_parents_concurrently(engine: Engine) -> None:
    """With Accounts in blocks, B does send while A's write is in flight, and still no
    Account is in both."""
    o = memory_org(engine, max_batch=5)
    p1, p2, p3, p4 = (o.crm.add_parent() for _ in range(4))
    o.route(5, [p1])
    o.route(5, [p2])
    o.route(10, [p3, p4])
    a = o.dispatcher(claim_limit=10)  # p1 and p2
    b = o.dispatcher(claim_limit=10)
    during: list[int] = []
    started: list[int] = []

    def b_runs_now(req: ServedRequest) -> None:
        if not started:  # once, during A's first write (not again for B's own writes)
            started.append(req.seq)
            during.append(b.run_once().requests)

    o.crm.on_write = b_runs_now
    a.run_once()
    assert during == [2]  # B wrote p3 and p4 while A's first request was in flight
    assert o.crm.overlaps == []
    assert o.states() == {"sent": 20}


# -- the claim floor (connector/core/floor.py) -----------------------------------------------
# These dispatchers' floors pass a claimed id at once (lag 0) and never read from the start
# again on their own (full_every: an hour): what they claim is what the floor let them see.


def _floored(org: MemoryOrg, clock: Ticks | None = None, **kw: Any) -> Dispatcher:
    d = org.dispatcher(**kw)
    d.floor = ClaimFloor(lag=0, full_every=3600, clock=clock or Ticks())
    return d


def test_rows_a_claim_skipped_for_a_parent_in_flight_are_claimed_once_it_lands(
    engine: Engine,
) -> None:
    o = memory_org(engine, max_batch=2)
    busy = o.crm.add_parent()
    o.route(1, [busy])
    assert len(o.dispatcher().claim("b")) == 1  # b's write to `busy` is in flight
    waiting = o.route(3, [busy])  # lower ids than the next ones
    free = o.route(4)
    a = _floored(o)
    assert sorted(c.crm_id for c in a.claim("a-1")) == sorted(free)
    assert a.floor.next_claim() == (min(_ids(o, waiting)), False)
    _land(o)  # b's write (and a's) land
    assert sorted(c.crm_id for c in a.claim("a-2")) == sorted(waiting)


def test_a_partial_request_given_back_is_claimed_by_the_next_claim(engine: Engine) -> None:
    o = memory_org(engine, max_batch=2)
    o.route(1)
    other = o.dispatcher()
    other.claim("other")  # another claim in flight: a partial request waits (hold_tail)
    tail = o.route(3)  # one full request and a partial one
    a = _floored(o)
    kept = a.claim("a-1")
    assert len(kept) == 2
    (given_back,) = set(tail) - {c.crm_id for c in kept}
    _land(o)
    more = o.route(2)  # higher ids: the floor is past the partial request's row
    assert {c.crm_id for c in a.claim("a-2")} == {given_back, *more}


def test_a_retried_row_comes_back_without_waiting_for_a_full_claim(org: MemoryOrg) -> None:
    first = org.route(3)
    org.crm.fail_transient(times=1)
    a = _floored(org, backoff_base=0.0)
    assert a.run_once().retried == 3
    later = org.route(2)  # claimed before the retries: the floor moves past them
    stats = a.drain(timeout=5)
    assert stats.sent == 5
    assert sorted(org.crm.written_ids()) == sorted(first + later)


def test_a_row_requeued_below_the_floor_is_claimed_by_the_next_full_claim(org: MemoryOrg) -> None:
    clock = Ticks()
    a = _floored(org, clock)
    (gone,) = org.route(1)
    org.crm.delete(gone)
    a.run_once()
    assert org.rows()[gone]["state"] == "dead"
    org.route(2)
    assert a.run_once().sent == 2  # the floor is now past the dead row
    assert retry_dead(org.engine, ORG) == 1  # an operator requeues it
    assert a.run_once().claimed == 0  # below the floor
    clock.now += 3600
    assert a.run_once().claimed == 1  # a full claim reads from the start
    assert org.rows()[gone]["state"] == "dead"  # still gone: dead again, with the reason


def test_an_expired_lease_is_freed_by_the_next_claim(org: MemoryOrg) -> None:
    a = _floored(org)
    assert a.run_once().claimed == 0  # its first claim (a full one) is behind it
    ids = org.route(2)
    org.dispatcher(lease_seconds=0).run_once()  # claims, then gives up: lease expired
    assert org.states() == {"claimed": 2}
    assert a.run_once().sent == 2
    assert sorted(org.crm.written_ids()) == sorted(ids)


def test_a_claim_frees_the_leases_ended_since_the_previous_one_and_a_full_claim_all(
    org: MemoryOrg,
) -> None:
    clock = Ticks()
    a = _floored(org, clock)
    (rid,) = org.route(1)
    assert a.run_once().sent == 1  # (a full claim)
    with org.engine.begin() as conn:  # a lease that ended an hour ago, never freed
        conn.execute(
            text(
                "UPDATE outbox SET state = 'claimed', claimed_by = 'ghost', "
                "lease_until = now() - interval '1 hour' WHERE crm_id = :c"
            ),
            {"c": rid},
        )
    assert a.run_once().claimed == 0  # before this claim's window: not read
    assert org.states() == {"claimed": 1}
    clock.now += 3600
    assert a.run_once().claimed == 1  # a full claim frees every expired lease
    assert org.states() == {"sent": 1}


def test_a_paused_org_is_not_read_from_the_start_on_every_poll(org: MemoryOrg) -> None:
    org.route(2)
    with org.engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO org_pauses (org, until, reason)"
                " VALUES (:o, now() + interval '1 minute', 'test')"
            ),
            {"o": ORG},
        )
    a = _floored(org)
    assert a.floor.next_claim()[1]  # its first claim is a full one...
    assert a.run_once().claimed == 0
    assert not a.floor.next_claim()[1]  # ...and it counts, though the pause claimed nothing
    assert org.states() == {"pending": 2}


def test_each_thread_running_a_dispatcher_keeps_its_own_floor(org: MemoryOrg) -> None:
    """`connector dispatch --concurrency N` runs one Dispatcher in N threads."""
    d = org.dispatcher()
    seen: list[ClaimFloor] = []
    t = threading.Thread(target=lambda: seen.append(d.floor))
    t.start()
    t.join()
    assert d.floor is d.floor and seen[0] is not d.floor


def _land(o: MemoryOrg) -> None:
    """Every claim in flight finishes (as its dispatcher would, once its writes landed)."""
    with o.engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE outbox SET state = 'sent', lease_until = NULL, finished_at = now() "
                "WHERE state = 'claimed'"
            )
        )


def _ids(o: MemoryOrg, crm_ids: list[str]) -> list[int]:
    with o.engine.connect() as conn:
        return [
            int(r.id)
            for r in conn.execute(
                text("SELECT id FROM outbox WHERE crm_id = ANY(:c)"), {"c": crm_ids}
            )
        ]
