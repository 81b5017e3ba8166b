"""connector.core.pacing: the spacing of CRM calls under a trickle, from the org's budget (pure),
and how the inbox worker applies it (real Postgres, the HubSpot simulator over real HTTP)."""

from __future__ import annotations

import math
import threading
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import Engine, text

from connector.core.crm_kinds import org_pacing
from connector.core.metrics import Metrics
from connector.core.pacing import (
    CALLS_PER_CYCLE,
    NOMINAL_CALLS_PER_S,
    Nudges,
    Spacer,
    pacing_for,
)
from connector.intake.inbox import InboxWorker, store_events
from connector.routing.assign import Lead, Router
from connector.routing.teams import apply_teams
from connector.shell.adapters import Adapters, adapter_for
from connector.writeback.dispatch import Dispatcher
from crm_adapters.batching import HUBSPOT_BATCH_MAX
from crm_sandboxes import HubSpotSandbox, SalesforceSandbox
from testbed.crm_orgs import hubspot_org, salesforce_org
from testbed.waiting import wait_until
from tests.helpers.clocks import Ticks


@given(st.floats(0.1, 1000), st.floats(0.05, 1.0))
def test_a_trickle_spends_the_share_of_the_budget(budget: float, share: float) -> None:
    """Three calls a cycle (read back, owner read, owner write), one cycle per cycle_s."""
    p = pacing_for(budget, share)
    assert CALLS_PER_CYCLE / p.cycle_s == pytest.approx(budget * share)


def test_figures_for_hubspot_tiers_and_salesforce(
    hs: HubSpotSandbox, sf: SalesforceSandbox
) -> None:
    # HubSpot's base budget, 100 calls per 10 s: 8 calls a second for the pipeline
    assert org_pacing(hubspot_org(hs, ["1"], limit_per_10s=100).crm).cycle_s == 0.375
    # 250 per 10 s (the API limit increase): cycles two and a half times closer together
    assert org_pacing(hubspot_org(hs, ["1"], limit_per_10s=250).crm).cycle_s == 0.15
    # Salesforce counts calls per day: paced as the nominal budget
    acme = salesforce_org(sf, [sf.add_user("Rep")], org="acme", obj="Lead")
    assert org_pacing(acme.crm) == pacing_for(NOMINAL_CALLS_PER_S)


def test_bad_budgets_are_refused() -> None:
    for budget, share in [(0, 0.8), (-1, 0.8), (10, 0), (10, 1.5), (math.nan, 0.8)]:
        with pytest.raises(ValueError, match="calls_per_s must be > 0"):
            pacing_for(budget, share)
    with pytest.raises(ValueError, match="interval must be >= 0"):
        Spacer(-0.1)


def test_a_shared_spacer_spaces_rounds_org_wide() -> None:
    clock = Ticks(100.0)
    s = Spacer(0.5, clock)
    assert s.reserve() == 0.0  # the first round starts at once
    assert s.reserve() == 0.5  # a second dispatcher asking at the same moment waits its turn
    assert s.reserve() == 1.0  # and a third one more
    clock.now += 2.0  # idle for a while: the next round starts at once again
    assert s.reserve() == 0.0
    clock.now += 0.2
    assert s.reserve() == pytest.approx(0.3)  # never closer than the interval to the last
    # Nudged rounds start at once and book no later turn: however many, the next round
    # started by a poll waits at most one interval (it used to drift a cycle per nudge).
    clock.now += 5.0
    for _ in range(10):
        s.note()
    assert s.reserve() == pytest.approx(0.5)
    # A dispatcher whose poll timed out books a turn, and the inbox's nudge then starts its
    # round before that turn: the booking is dropped, however many cycles that happens.
    clock.now += 5.0
    for _ in range(40):
        clock.now += 0.375  # an inbox cycle
        s.reserve()  # each of two dispatchers times out its poll and books a turn
        s.reserve()
        clock.now += 0.01
        s.note()  # the nudge comes first
    assert s.reserve() == pytest.approx(0.5)  # one interval after the last nudged round (was 25 s)


def test_nudges_wake_every_dispatcher_of_the_org_only() -> None:
    n = Nudges()
    a1, a2, b = n.listener("a"), n.listener("a"), n.listener("b")
    n.nudge("a")
    assert a1.is_set() and a2.is_set() and not b.is_set()
    n.nudge("nobody")  # an org without dispatchers here: nothing to wake
    n.wake_all()
    assert b.is_set()


def test_the_inbox_spaces_partial_claims_only(engine: Engine, hs: HubSpotSandbox) -> None:
    """A partial claim sets the org's next claim one spacing after the round started; a full
    claim (a backlog) leaves it due, so the backlog is claimed again at once."""
    owner = hs.add_owner("Rep")
    cfg = hubspot_org(hs, [owner])
    apply_teams(engine, cfg)
    configs = {cfg.org: cfg}
    adapters = Adapters(configs)
    worker = InboxWorker(
        engine,
        configs,
        {cfg.org: Router(engine, cfg)},
        adapters.get,
        Metrics(engine, configs),
        batch_size=3,
        spacing={cfg.org: 7.0},
    )
    assert worker.spacing == {cfg.org: 7.0}
    ids = [hs.add_record("contacts", owner_id=None) for _ in range(4)]
    with engine.begin() as conn:
        store_events(conn, cfg, [f"e{i}" for i in ids], ids)
    assert worker.drain_once([cfg.org], started=50.0) == 3  # full: still due
    assert worker._next_claim[cfg.org] == -math.inf
    assert worker.drain_once([cfg.org], started=51.0) == 1  # partial: spaced
    assert worker._next_claim[cfg.org] == 58.0
    assert worker.drain_once([cfg.org], started=52.0) == 0  # an empty claim is spaced too
    assert worker._next_claim[cfg.org] == 59.0
    # a round that routed something tells the org's dispatchers (connector run)
    routed: list[str] = []
    worker.on_routed = routed.append
    with engine.begin() as conn:
        store_events(conn, cfg, ["e-last"], [hs.add_record("contacts", owner_id=None)])
    assert worker.drain_once([cfg.org], started=60.0) == 1
    assert routed == [cfg.org]
    assert worker.drain_once([cfg.org], started=61.0) == 0 and routed == [cfg.org]
    # a paced claim of more than one CRM read takes whole reads only; drain() takes all
    worker.spacing[cfg.org], worker.batch_size = 0.0, 7
    worker.read_units[cfg.org] = 2
    with engine.begin() as conn:
        store_events(
            conn, cfg, [f"u{i}" for i in range(5)], [hs.add_record("contacts") for _ in range(5)]
        )
    assert worker.drain_once([cfg.org], started=70.0) == 4  # two whole reads of 2
    assert worker.drain_once([cfg.org], started=71.0) == 1  # what is left fits one read
    with engine.begin() as conn:
        store_events(
            conn, cfg, [f"v{i}" for i in range(5)], [hs.add_record("contacts") for _ in range(5)]
        )
    assert worker.drain_once() == 5
    assert worker.read_units == {cfg.org: 2}
    # by default the spacing comes from the org's budget
    default = InboxWorker(engine, configs, {}, adapters.get, Metrics(engine, configs), batch_size=3)
    assert default.spacing == {cfg.org: org_pacing(cfg.crm).cycle_s}
    assert default.read_units == {cfg.org: HUBSPOT_BATCH_MAX}


def _outbox_states(engine: Engine) -> dict[str, int]:
    with engine.connect() as conn:
        return dict(conn.execute(text("SELECT state, count(*) FROM outbox GROUP BY state")).all())


def _nudged_dispatcher(
    engine: Engine, hs: HubSpotSandbox, spacer: Spacer | None = None
) -> tuple[str, Router, Nudges, Dispatcher]:
    """A HubSpot org's team and router, and one dispatcher of it woken by ``Nudges``."""
    owners = [hs.add_owner(f"Rep{i}") for i in range(2)]
    cfg = hubspot_org(hs, owners)
    apply_teams(engine, cfg)
    nudges = Nudges()
    d = Dispatcher(
        engine,
        cfg.org,
        adapter_for(cfg),
        intake_owner_ids=cfg.intake_owner_ids,
        nudge=nudges.listener(cfg.org),
        spacer=spacer,
    )
    return cfg.org, Router(engine, cfg), nudges, d


def test_a_nudged_dispatcher_writes_after_the_inbox_round_not_before(
    engine: Engine, hs: HubSpotSandbox
) -> None:
    """`connector run`: after a partial round a dispatcher with a nudge waits for it (here the
    poll is an hour, so only the nudge can wake it), then writes what the round routed."""
    org, router, nudges, d = _nudged_dispatcher(engine, hs)
    stop = threading.Event()
    rounds: list[int] = []
    t = threading.Thread(
        target=d.run_forever,
        kwargs={
            "stop": stop,
            "poll_interval": 3600,
            "on_stats": lambda s: rounds.append(s.claimed),
        },
    )
    first = [hs.add_record("contacts") for _ in range(3)]
    router.assign_many([Lead(i, {}) for i in first], "import")
    nudges.nudge(org)  # the first round goes at once
    t.start()
    try:
        # (a round's stats are reported after its rows are finished: wait for both)
        wait_until(lambda: _outbox_states(engine) == {"sent": 3}, 30, "the first round sent")
        wait_until(lambda: rounds == [3], 30, "the first round reported")
        later = [hs.add_record("contacts") for _ in range(2)]
        router.assign_many([Lead(i, {}) for i in later], "import")
        assert _outbox_states(engine) == {"sent": 3, "pending": 2}  # waiting for the nudge
        assert rounds == [3]
        nudges.nudge(org)
        wait_until(lambda: _outbox_states(engine) == {"sent": 5}, 30, "the nudged round sent")
        wait_until(lambda: len(rounds) == 2, 30, "the nudged round reported")
        assert rounds == [3, 2]
    finally:
        stop.set()
        nudges.wake_all()  # as the service does when it stops
        t.join(10)
    assert not t.is_alive()


def test_a_dispatcher_nudged_for_a_while_still_polls_within_a_cycle_after(
    engine: Engine, hs: HubSpotSandbox
) -> None:
    """Nudges every 0.1 s for 3 s, each after the dispatcher's poll (0.05 s) timed out and it
    booked a turn on its spacer (1 s apart). Then a row with no nudge (as from an import or
    a retry coming due) is written by a poll round within a turn or two: before the fix each
    of those cycles left its booked turn behind, 30 turns of 1 s."""
    spacer = Spacer(1.0)
    org, router, nudges, d = _nudged_dispatcher(engine, hs, spacer)
    stop = threading.Event()
    t = threading.Thread(target=d.run_forever, kwargs={"stop": stop, "poll_interval": 0.05})
    t.start()
    try:
        for _ in range(30):
            time.sleep(0.1)  # the scenario: an inbox round every 0.1 s, not synchronisation
            nudges.nudge(org)
        # The next turn is at most two intervals away (the last nudged round's, or one the
        # dispatcher booked since its poll timed out, and this one); the drift made it ~27 s.
        assert spacer.reserve() <= 2.0
        rid = hs.add_record("contacts")
        router.assign_many([Lead(rid, {})], "import")  # no nudge
        wait_until(lambda: _outbox_states(engine) == {"sent": 1}, 20, "a poll round sent it")
    finally:
        stop.set()
        nudges.wake_all()
        t.join(10)
    assert not t.is_alive()
