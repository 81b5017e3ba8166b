"""Full write requests: two dispatchers draining a backlog send every request full but one.

Real Postgres, the in-memory CRM (no HTTP). The schedules are deterministic: the CRM's
``on_write`` hook runs the other dispatcher's round while a write request is in flight, so
every claim of that round sees a claim in flight, as two busy dispatchers do. The policy
before ``hold_tail`` (``OldPolicyDispatcher``) is run on the same schedule to show that the
assertion catches it: it sends a partial request mid-run.
"""

from __future__ import annotations

import math
import random
import threading
from collections.abc import Callable

import pytest
from sqlalchemy import Engine, event

from connector.writeback import claiming
from connector.writeback.dispatch import Dispatcher
from connector.writeback.outcomes import Claimed, Sent, plan_round, requests_of
from connector.writeback.stats import DispatchStats
from crm_adapters.memory import ServedRequest
from tests.helpers.memory_orgs import ORG, MemoryOrg, memory_org

MAX_BATCH = 200


class OldPolicyDispatcher(Dispatcher):
    """The claim policy before hold_tail: only a claim smaller than one request waits while
    another claim is in flight, a full claim gives back its partial last request, and any
    other partial request goes out at once."""

    def _claim(self, token: str) -> list[Claimed]:
        sql = claiming._SQL
        max_batch = self.adapter.max_batch
        with self.engine.begin() as conn:
            conn.execute(sql["claim_lock"], {"org": self.org})
            rows = conn.execute(
                sql["claim"],
                {
                    "org": self.org,
                    "token": token,
                    "limit": self.claim_limit,
                    "lease_seconds": self.lease_seconds,
                    "floor": 0,
                },
            ).all()
            claimed = [
                Claimed(r.id, r.crm_id, r.owner_id, r.parent_id, r.attempts, float(r.age))
                for r in rows
            ]
            if (
                0 < len(claimed) < max_batch
                and conn.execute(
                    sql["others_in_flight"], {"org": self.org, "token": token}
                ).scalar_one()
            ):
                raise claiming.ClaimDeferred
            batches = requests_of(claimed, max_batch)
            full_claim = len(claimed) >= self.claim_limit and len(batches) > 1
            if full_claim and len(batches[-1]) < max_batch:
                back = {int(w.key) for w in batches[-1]}
                conn.execute(sql["release"], {"ids": sorted(back), "token": token})
                claimed = [c for c in claimed if c.id not in back]
        return claimed


class CheckAfterClaimDispatcher(Dispatcher):
    """Today's policy, but asking whether other claims are in flight after the claim
    statement instead of before it."""

    def _claim(self, token: str) -> list[Claimed]:
        sql = claiming._SQL
        with self.engine.begin() as conn:
            conn.execute(sql["claim_lock"], {"org": self.org})
            rows = conn.execute(
                sql["claim"],
                {
                    "org": self.org,
                    "token": token,
                    "limit": self.claim_limit,
                    "lease_seconds": self.lease_seconds,
                    "floor": 0,
                },
            ).all()
            claimed = [
                Claimed(r.id, r.crm_id, r.owner_id, r.parent_id, r.attempts, float(r.age))
                for r in rows
            ]
            others = conn.execute(
                sql["others_in_flight"], {"org": self.org, "token": token}
            ).scalar_one()
            plan = plan_round(
                claimed, self.adapter.max_batch, self.claim_limit, others_in_flight=others
            )
            if plan.released:
                if not plan.kept:
                    raise claiming.ClaimDeferred
                conn.execute(sql["release"], {"ids": plan.released, "token": token})
        return plan.kept


def skewed(n: int, parents: list[str]) -> list[str | None]:
    """The benchmark's mix: 30% of the records on the first parent, the rest spread."""
    heavy = int(n * 0.3)
    rest = parents[1:]
    return [parents[0]] * heavy + [rest[i % len(rest)] for i in range(n - heavy)]


def route_skewed(o: MemoryOrg, n: int, parents: int = 50) -> list[str]:
    """n records over `parents` Accounts as the benchmark spreads them, routed in one batch."""
    return o.route(n, skewed(n, [o.crm.add_parent() for _ in range(parents)]))


def interleaved(
    o: MemoryOrg, dispatchers: list[Dispatcher], pick: Callable[[], bool] = lambda: True
) -> DispatchStats:
    """Drain with the dispatchers taking turns at the top level; while any write request is
    in flight, an idle dispatcher runs a whole round when ``pick()`` says so (every time by
    default). Single-threaded and deterministic for a given ``pick``."""
    total = DispatchStats()
    active: set[int] = set()

    def round_of(i: int) -> None:
        active.add(i)
        try:
            total.add(dispatchers[i].run_once())
        finally:
            active.discard(i)

    def during_write(_: ServedRequest) -> None:
        idle = [i for i in range(len(dispatchers)) if i not in active]
        if idle and pick():
            round_of(idle[0])

    o.crm.on_write = during_write
    try:
        for turn in range(200):
            if o.dispatcher().open_rows()[0] == 0:
                break
            round_of(turn % len(dispatchers))
        else:
            pytest.fail("the outbox did not drain in 200 rounds")
    finally:
        o.crm.on_write = None
    return total


def assert_exactly_once(o: MemoryOrg, ids: list[str]) -> None:
    written = o.crm.written_ids()
    assert sorted(written) == sorted(ids)  # every record written, none twice
    assert o.states() == {"sent": len(ids)}
    assert o.crm.overlaps == []  # no record or parent in two requests in flight at once


@pytest.mark.parametrize("n", [2000, 2050])
def test_two_dispatchers_send_every_request_full_but_one(engine: Engine, n: int) -> None:
    o = memory_org(engine)
    ids = route_skewed(o, n)
    stats = interleaved(o, [o.dispatcher(), o.dispatcher()])
    sizes = [len(r.record_ids) for r in sorted(o.crm.write_requests(), key=lambda r: r.seq)]
    assert len(sizes) == stats.requests == math.ceil(n / MAX_BATCH)
    assert sorted(sizes)[1:] == [MAX_BATCH] * (len(sizes) - 1)
    assert_exactly_once(o, ids)


def test_the_old_policy_sends_a_partial_request_mid_run(engine: Engine) -> None:
    """The same schedule with the policy before hold_tail: a claim made while another is in
    flight got more than one request's worth of rows and sent its remainder half empty."""
    o = memory_org(engine)
    ids = route_skewed(o, 2000)
    old = [
        OldPolicyDispatcher(engine, ORG, o.crm, intake_owner_ids=o.cfg.intake_owner_ids)
        for _ in range(2)
    ]
    stats = interleaved(o, list(old))
    assert stats.requests > math.ceil(2000 / MAX_BATCH)
    assert sum(1 for r in o.crm.write_requests() if len(r.record_ids) < MAX_BATCH) >= 2
    assert_exactly_once(o, ids)  # wasteful, not wrong


@pytest.mark.parametrize("seed", range(4))
def test_full_requests_hold_for_any_interleaving(engine: Engine, seed: int) -> None:
    """Rounds nested into a random subset of write requests (three dispatchers, smaller
    requests so each claim spans many): still one partial request at most."""
    o = memory_org(engine, max_batch=25)
    parents = [o.crm.add_parent() for _ in range(13)]
    ids = o.route(515, skewed(515, parents))
    rng = random.Random(seed)
    dispatchers = [o.dispatcher(claim_limit=rng.choice([60, 75, 110])) for _ in range(3)]
    stats = interleaved(o, dispatchers, pick=lambda: rng.random() < 0.6)
    assert stats.requests == len(o.crm.write_requests()) == math.ceil(515 / 25)
    assert_exactly_once(o, ids)


def test_two_dispatcher_threads_drain_in_full_requests(engine: Engine) -> None:
    """The production shape: two threads, each draining until nothing is left."""
    o = memory_org(engine)
    ids = route_skewed(o, 2000)
    total = DispatchStats()
    lock = threading.Lock()

    def one() -> None:
        s = o.dispatcher().drain(timeout=120)
        with lock:
            total.add(s)

    threads = [threading.Thread(target=one) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert total.requests == len(o.crm.write_requests()) == 10
    assert_exactly_once(o, ids)


@pytest.mark.parametrize("check", ["before-claim", "after-claim"])
def test_a_claim_finishing_during_ours_does_not_make_ours_the_tail(
    engine: Engine, check: str
) -> None:
    """B holds Account P1's first rows; A claims, and B's claim finishes right after A's
    claim statement, which therefore skipped P1. Asked before the claim, "others in flight"
    is still yes and A holds its partial request; asked after, A takes itself for the last
    one standing and sends 3 rows as the tail, then P1's rows go out in a second partial."""
    o = memory_org(engine, max_batch=5)
    p1, p2 = o.crm.add_parent(), o.crm.add_parent()
    o.route(4, [p1])
    o.route(3, [p2])
    b = o.dispatcher(claim_limit=2)
    b_rows = b.claim("b-token")
    assert {c.parent_id for c in b_rows} == {p1} and len(b_rows) == 2
    cls = Dispatcher if check == "before-claim" else CheckAfterClaimDispatcher
    a = cls(engine, ORG, o.crm, intake_owner_ids=o.cfg.intake_owner_ids)
    done: list[int] = []

    def b_finishes(_c: object, _cur: object, statement: str, *_: object) -> None:
        if not done and "SET state = 'claimed'" in statement:
            done.append(1)
            b._record("b-token", [Sent(c.id) for c in b_rows], DispatchStats())

    event.listen(engine, "after_cursor_execute", b_finishes)
    try:
        a.run_once()
    finally:
        event.remove(engine, "after_cursor_execute", b_finishes)
    a.drain(timeout=30)
    sizes = [len(r.record_ids) for r in sorted(o.crm.write_requests(), key=lambda r: r.seq)]
    assert done == [1]
    assert o.states() == {"sent": 7}
    if check == "before-claim":
        assert sizes == [5]  # P1's 2 left + P2's 3, one request
    else:
        assert sizes == [3, 2]


# -- a trickle -------------------------------------------------------------------------------


def test_a_lone_row_goes_out_at_once(engine: Engine) -> None:
    o = memory_org(engine)
    a, b = o.dispatcher(), o.dispatcher()
    (rid,) = o.route(1)
    assert b.run_once().requests == 1  # one row, one request, no waiting for more
    assert o.crm.written_ids() == [rid]
    assert o.states() == {"sent": 1}
    assert a.run_once().claimed == 0


def test_a_row_arriving_during_a_write_waits_only_for_that_claim(engine: Engine) -> None:
    """A lone row is held while another claim is in flight, and the first round after that
    claim finished sends it (no timer involved)."""
    o = memory_org(engine)
    a, b = o.dispatcher(), o.dispatcher()
    (first,) = o.route(1)
    late: list[str] = []
    held: list[int] = []

    def arrives_now(_: ServedRequest) -> None:
        if not late:
            late.extend(o.route(1))
            held.append(b.run_once().claimed)

    o.crm.on_write = arrives_now
    assert a.run_once().sent == 1
    o.crm.on_write = None
    assert held == [0]  # a's request was in flight: b waited for the merged tail
    assert o.rows()[late[0]]["state"] == "pending"
    assert o.rows()[late[0]]["attempts"] == 0  # the rolled-back claim spent no attempt
    stats = b.run_once()
    assert (stats.claimed, stats.requests, stats.sent) == (1, 1, 1)
    assert o.crm.written_ids() == [first, late[0]]
