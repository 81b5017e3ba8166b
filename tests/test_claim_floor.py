"""The inbox claim's floor: pure rules (connector/core/floor.py), then on a real Postgres with
the HubSpot simulator: what the floor passes is claimed later, never lost."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine, text

from connector.core.floor import ClaimFloor
from connector.core.metrics import Metrics
from connector.intake.inbox import InboxWorker, store_events
from connector.routing.assign import Router
from connector.routing.teams import apply_teams
from connector.shell.adapters import Adapters
from crm_sandboxes import HubSpotSandbox
from testbed.crm_orgs import hubspot_org
from tests.helpers.clocks import Ticks


def test_the_first_claim_and_one_every_full_every_read_from_the_start() -> None:
    clock = Ticks()
    f = ClaimFloor(lag=5, full_every=30, clock=clock)
    assert f.next_claim() == (0, True)
    f.claimed([7, 9, 8], full=True)
    assert f.next_claim() == (1, False)  # 9 was claimed less than `lag` ago
    clock.now += 5
    assert f.next_claim() == (10, False)  # now it is passed
    clock.now += 25
    assert f.next_claim() == (0, True)
    f.claimed([], full=True)  # an empty full claim counts as one
    assert f.next_claim() == (10, False)


def test_the_floor_passes_only_claims_older_than_the_lag() -> None:
    clock = Ticks()
    f = ClaimFloor(lag=5, full_every=3600, clock=clock)
    f.claimed([1, 2], full=f.next_claim()[1])
    clock.now += 3
    f.claimed([3, 4], full=f.next_claim()[1])
    clock.now += 2
    assert f.next_claim() == (3, False)  # [1, 2] is 5 s old, [3, 4] only 2 s
    clock.now += 3
    assert f.next_claim() == (5, False)
    f.claimed([], full=False)  # an empty claim moves nothing
    clock.now += 60
    assert f.next_claim() == (5, False)


def test_rescheduled_events_hold_the_floor_until_claimed_again() -> None:
    clock = Ticks()
    f = ClaimFloor(lag=0, full_every=30, clock=clock)
    f.claimed([10, 11, 12], full=f.next_claim()[1])
    f.rescheduled([(11, 2.0), (12, 4.0)])
    assert f.next_claim() == (11, False)
    f.claimed([11], full=False)
    assert f.next_claim() == (12, False)
    f.rescued([5])  # an expired claim, pending again under its old id
    assert f.next_claim() == (5, False)
    f.claimed([5, 12], full=False)
    assert f.next_claim() == (13, False)


def test_a_reschedule_another_worker_took_is_forgotten_after_a_full_claim() -> None:
    clock = Ticks()
    f = ClaimFloor(lag=0, full_every=30, clock=clock)
    f.claimed([20], full=f.next_claim()[1])
    f.rescheduled([(20, 1.0)])
    clock.now += 31  # due at +1; a full claim at +31 had its chance at it
    assert f.next_claim() == (0, True)
    f.claimed([], full=True)
    assert f.next_claim() == (21, False)


def test_a_full_claim_that_comes_back_full_is_followed_by_a_sweep() -> None:
    """Events below the floor (say 5 requeued after an outage) drain at the worker's pace:
    the claims after a full one go on from where it stopped until one comes back short."""
    clock = Ticks()
    f = ClaimFloor(lag=0, full_every=30, clock=clock)
    f.claimed([900], full=f.next_claim()[1])
    assert f.next_claim() == (901, False) and not f.sweeping
    clock.now += 30
    assert f.next_claim() == (0, True)
    f.claimed([1, 2], full=True, exhausted=False)  # the batch was full: there may be more
    assert f.sweeping and f.next_claim() == (3, False)
    f.claimed([3, 4], full=False, exhausted=False)
    assert f.next_claim() == (5, False)
    f.claimed([5], full=False, exhausted=True)  # short: the sweep is over
    assert not f.sweeping and f.next_claim() == (901, False)


def test_a_sweep_ends_where_the_floor_is() -> None:
    clock = Ticks()
    f = ClaimFloor(lag=0, full_every=30, clock=clock)
    f.claimed([10, 11], full=f.next_claim()[1], exhausted=False)
    assert f.sweeping
    assert f.next_claim() == (12, False)  # the sweep's start is the floor itself
    assert not f.sweeping


def test_bad_settings_are_refused() -> None:
    for lag, every in [(-1, 30), (0, 0), (5, -1)]:
        with pytest.raises(ValueError, match="lag must be >= 0 and full_every > 0"):
            ClaimFloor(lag, every)


# --- on Postgres ---------------------------------------------------------------------------


def states(engine: Engine) -> dict[str, str]:
    with engine.connect() as conn:
        return dict(conn.execute(text("SELECT event_key, state FROM intake_events")).all())


def worker_for(engine: Engine, hs: HubSpotSandbox, **kw: float) -> tuple[InboxWorker, str]:
    cfg = hubspot_org(hs, [hs.add_owner("Rep")])
    apply_teams(engine, cfg)
    configs = {cfg.org: cfg}
    w = InboxWorker(
        engine,
        configs,
        {cfg.org: Router(engine, cfg)},
        Adapters(configs).get,
        Metrics(engine, configs),
        **kw,  # type: ignore[arg-type]
    )
    return w, cfg.org


def store(engine: Engine, w: InboxWorker, org: str, key: str, hs: HubSpotSandbox) -> None:
    with engine.begin() as conn:
        store_events(conn, w.configs[org], [key], [hs.add_record("contacts")])


def test_an_insert_committed_after_a_later_id_was_claimed_is_claimed_by_a_full_claim(
    engine: Engine, hs: HubSpotSandbox
) -> None:
    w, org = worker_for(engine, hs)
    clock = Ticks()
    w.floors[org] = ClaimFloor(lag=0, full_every=60, clock=clock)
    slow = engine.connect()
    tx = slow.begin()
    store_events(slow, w.configs[org], ["slow"], [hs.add_record("contacts")])  # id N, open
    store(engine, w, org, "fast", hs)  # id N + 1, committed
    assert w.drain_once([org], started=1.0) == 1  # a full claim (the first): "fast" only
    tx.commit()
    slow.close()
    assert w.drain_once([org], started=2.0) == 0  # the floor is past "slow"'s id
    assert states(engine) == {"slow": "pending", "fast": "done"}
    clock.now += 60
    assert w.drain_once([org], started=3.0) == 1  # the next full claim takes it
    assert states(engine) == {"slow": "done", "fast": "done"}


def test_events_below_the_floor_drain_in_a_sweep_not_a_batch_per_full_claim(
    engine: Engine, hs: HubSpotSandbox
) -> None:
    w, org = worker_for(engine, hs, batch_size=2)
    clock = Ticks()
    w.floors[org] = floor = ClaimFloor(lag=0, full_every=3600, clock=clock)
    floor.claimed([10**9], full=floor.next_claim()[1])  # the floor is far above them
    for key in "abcde":  # e.g. dead events requeued by `connector inbox retry`
        store(engine, w, org, key, hs)
    assert w.drain_once([org], started=1.0) == 0
    clock.now += 3600
    assert w.drain_once([org], started=2.0) == 2  # the full claim, full
    assert w.drain_once([org], started=3.0) == 2  # the sweep goes on at once
    assert w.drain_once([org], started=4.0) == 1
    assert set(states(engine).values()) == {"done"}
    assert not floor.sweeping and floor.next_claim() == (10**9 + 1, False)


def test_a_rescheduled_event_comes_back_before_any_full_claim(
    engine: Engine, hs: HubSpotSandbox
) -> None:
    w, org = worker_for(engine, hs, base_delay=0.0)
    clock = Ticks()
    w.floors[org] = ClaimFloor(lag=0, full_every=3600, clock=clock)
    store(engine, w, org, "a", hs)
    rows = w._claim(org)  # full (the first): claims "a"
    store(engine, w, org, "b", hs)
    w._retry_later(org, rows, "CRM read failed: 503")  # "a" pending again at once
    assert states(engine) == {"a": "pending", "b": "pending"}
    assert w.drain_once([org], started=1.0) == 2  # from "a"'s id, not past it
    assert states(engine) == {"a": "done", "b": "done"}


def test_an_expired_claim_is_freed_by_a_full_claim_and_the_late_result_dropped(
    engine: Engine, hs: HubSpotSandbox
) -> None:
    w, org = worker_for(engine, hs, lease_seconds=0.4)
    assert w.floors[org].full_every == pytest.approx(0.1)  # a quarter of the lease
    store(engine, w, org, "a", hs)
    stalled = w._claim(org)
    assert [r.crm_id for r in stalled] and states(engine) == {"a": "claimed"}
    with engine.begin() as conn:  # the lease ran out
        conn.execute(text("UPDATE intake_events SET lease_until = now() - interval '1 s'"))
    other, _ = worker_for(engine, hs)
    assert other.drain_once([org], started=1.0) == 1  # its first claim is full: rescues
    assert states(engine) == {"a": "done"}
    w._retry_later(org, stalled, "late")  # the stalled worker's late answer changes nothing
    assert states(engine) == {"a": "done"}


def test_rows_a_claim_left_pending_hold_the_floor_until_a_claim_covers_them() -> None:
    f = ClaimFloor(lag=0, full_every=3600, clock=Ticks())
    f.claimed([10, 12, 20], full=f.next_claim()[1])
    f.skipped(11, floor=0, top=20)  # 11 stayed pending (its parent was in flight)
    assert f.next_claim() == (11, False)
    f.claimed([11, 21], full=False)
    f.skipped(None, floor=11, top=21)  # the claim covered 11: nothing is left below 21
    assert f.next_claim() == (22, False)
    f.claimed([22, 30], full=False)
    f.skipped(25, floor=22, top=30)
    f.rescheduled([(5, 0.0)])  # a retry far below
    floor, _ = f.next_claim()
    assert floor == 5
    f.claimed([5], full=False)  # this claim stopped at 5: it says nothing of 25
    f.skipped(None, floor=5, top=5)
    assert f.next_claim() == (25, False)


def test_a_claim_that_stops_short_of_an_earlier_report_keeps_the_floor_below_it() -> None:
    """Claim 1 took up to 21 and left 1-10 and 15 pending (two Accounts in flight); claim 2,
    once the first Account's write landed, took only 1-10: it says nothing of 15."""
    f = ClaimFloor(lag=0, full_every=3600, clock=Ticks())
    f.claimed([11, 12, 13, 14, 16, 21], full=f.next_claim()[1])
    f.skipped(1, floor=0, top=21)
    assert f.next_claim() == (1, False)
    f.claimed(range(1, 11), full=False)
    f.skipped(None, floor=1, top=10)
    assert f.next_claim() == (11, False)  # not 22: 11-21 have not been read again
    f.claimed([], full=False)  # (a claim that took nothing tells nothing)
    f.claimed([15, 22], full=False)
    f.skipped(None, floor=11, top=22)
    assert f.next_claim() == (23, False)
