"""connector.core.pacing: the spacing of CRM calls under a trickle, from the org's budget (pure),
and how the inbox worker applies it (real Postgres, the HubSpot simulator over real HTTP)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import Engine

from connector.core.metrics import Metrics
from connector.core.pacing import (
    NOMINAL_CALLS_PER_S,
    SHARE,
    Pacing,
    Spacer,
    org_pacing,
    pacing_for,
)
from connector.intake.inbox import InboxWorker, store_events
from connector.routing.assign import Router
from connector.routing.teams import apply_teams
from connector.shell.adapters import Adapters
from crm_sandboxes import HubSpotSandbox, SalesforceSandbox
from tests.crm_orgs import hubspot_org, salesforce_org


def calls_per_s(p: Pacing) -> float:
    """What a trickle costs: one read per inbox claim, an owner read and a write per round."""
    return 1 / p.inbox_s + 2 / p.dispatch_s


@given(st.floats(0.1, 1000), st.floats(0.05, 1.0))
def test_the_spacing_spends_the_share_of_the_budget(budget: float, share: float) -> None:
    p = pacing_for(budget, share)
    assert calls_per_s(p) == pytest.approx(budget * share)
    assert p.dispatch_s == pytest.approx(math.sqrt(2) * p.inbox_s)


@given(st.floats(1, 100), st.floats(0.05, 0.95))
def test_no_other_split_of_that_budget_adds_less_latency(budget: float, f: float) -> None:
    """Any (inbox, dispatch) that spends the same calls waits at least as long in all."""
    p = pacing_for(budget)
    c = budget * SHARE
    inbox = (1 + 1e-9) / (c * f)  # a share f of the calls goes to the inbox's reads
    dispatch = 2 / (c * (1 - f))
    assert 1 / inbox + 2 / dispatch == pytest.approx(c, rel=1e-6)
    assert inbox + dispatch >= p.inbox_s + p.dispatch_s - 1e-9


def test_figures_for_hubspot_tiers_and_salesforce(
    hs: HubSpotSandbox, sf: SalesforceSandbox
) -> None:
    # HubSpot's base budget, 100 calls per 10 s: 8 calls a second for the pipeline
    base = org_pacing(hubspot_org(hs, ["1"], limit_per_10s=100).crm)
    assert base.inbox_s == pytest.approx(0.3018, abs=1e-4)
    assert base.dispatch_s == pytest.approx(0.4268, abs=1e-4)
    # 250 per 10 s (the API limit increase): two and a half times closer together
    fast = org_pacing(hubspot_org(hs, ["1"], limit_per_10s=250).crm)
    assert fast.inbox_s == pytest.approx(base.inbox_s / 2.5)
    # Salesforce counts calls per day: paced as the nominal budget
    acme = salesforce_org(sf, [sf.add_user("Rep")], org="acme", obj="Lead")
    assert org_pacing(acme.crm) == pacing_for(NOMINAL_CALLS_PER_S)


def test_bad_budgets_are_refused() -> None:
    for budget, share in [(0, 0.8), (-1, 0.8), (10, 0), (10, 1.5), (math.nan, 0.8)]:
        with pytest.raises(ValueError, match="calls_per_s must be > 0"):
            pacing_for(budget, share)
    with pytest.raises(ValueError, match="interval must be >= 0"):
        Spacer(-0.1)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_shared_spacer_spaces_rounds_org_wide() -> None:
    clock = Clock()
    s = Spacer(0.5, clock)
    assert s.reserve() == 0.0  # the first round starts at once
    assert s.reserve() == 0.5  # a second dispatcher asking at the same moment waits its turn
    assert s.reserve() == 1.0  # and a third one more
    clock.now += 2.0  # idle for a while: the next round starts at once again
    assert s.reserve() == 0.0
    clock.now += 0.2
    assert s.reserve() == pytest.approx(0.3)  # never closer than the interval to the last


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
    assert worker.drain_once([cfg.org], started=52.0) == 0  # nothing claimed: unchanged
    assert worker._next_claim[cfg.org] == 58.0
    # by default the spacing comes from the org's budget
    default = InboxWorker(engine, configs, {}, adapters.get, Metrics(engine, configs), batch_size=3)
    assert default.spacing == {cfg.org: org_pacing(cfg.crm).inbox_s}
