"""The scheduled poll: watermark, overlap, owned records left alone, one poller per org."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, text

from connector.core.config import OrgConfig
from connector.intake.poller import Poller, poll_window
from connector.routing.teams import apply_teams
from connector.shell.adapters import adapter_for
from connector.shell.store import make_engine
from crm_sandboxes import SalesforceSandbox
from testbed.crm_orgs import salesforce_org
from testbed.harness import worker_context
from testbed.waiting import wait_until


@pytest.fixture
def sf() -> Iterator[SalesforceSandbox]:
    box = SalesforceSandbox(record_work_ms=0).start()
    yield box
    box.stop()


def _cfg(sf: SalesforceSandbox, reps: list[str], intake: str) -> OrgConfig:
    cfg = salesforce_org(sf, reps, obj="Lead", intake=[intake])
    return cfg.model_copy(update={"poll": cfg.poll.model_copy(update={"overlap_seconds": 60})})


def _watermark(engine: Engine, org: str) -> datetime | None:
    with engine.connect() as conn:
        return conn.execute(
            text("SELECT watermark FROM poll_watermarks WHERE org = :o"), {"o": org}
        ).scalar_one_or_none()


def _leads(engine: Engine) -> dict[str, str]:
    with engine.connect() as conn:
        return dict(conn.execute(text("SELECT crm_id, source FROM leads")).all())


def test_poll_window_is_pure() -> None:
    now = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
    assert poll_window(None, now, 120, 3600) == now - timedelta(hours=1)
    assert poll_window(now, now, 120, 3600) == now - timedelta(seconds=120)


def test_poll_routes_new_unowned_records_and_advances_the_watermark(
    engine: Engine, sf: SalesforceSandbox
) -> None:
    reps = [sf.add_user("A"), sf.add_user("B")]
    intake = sf.add_user("Intake")
    cfg = _cfg(sf, reps, intake)
    apply_teams(engine, cfg)
    queued = [sf.add_record("Lead", owner_id=intake) for _ in range(450)]  # > 1 page
    owned = sf.add_record("Lead", owner_id=reps[0])  # a person already owns it
    poller = Poller(engine, cfg, adapter_for(cfg))

    first = poller.poll_once()
    assert first.ran and first.pages >= 2
    assert first.new == 450 and first.skipped_owned == 1
    assert set(_leads(engine)) == set(queued)
    assert owned not in _leads(engine)
    mark = _watermark(engine, cfg.org)
    assert mark is not None

    # the overlap re-reads the last minute: repeats, nothing new, watermark never goes back
    again = poller.poll_once()
    assert again.new == 0 and again.duplicate == 450
    assert _watermark(engine, cfg.org) == mark

    late = sf.add_record("Lead", owner_id=intake)
    third = poller.poll_once()
    assert third.new == 1
    assert _leads(engine)[late] == "poll"
    assert _watermark(engine, cfg.org) >= mark  # type: ignore[operator]


def test_a_failed_page_does_not_move_the_watermark(engine: Engine, sf: SalesforceSandbox) -> None:
    reps = [sf.add_user("A")]
    intake = sf.add_user("Intake")
    cfg = _cfg(sf, reps, intake)
    apply_teams(engine, cfg)
    for _ in range(5):
        sf.add_record("Lead", owner_id=intake)
    sf.inject_failures(10, status=503, path_contains="query")
    with pytest.raises(Exception):  # noqa: B017 - the adapter's retryable error
        Poller(engine, cfg, adapter_for(cfg)).poll_once()
    assert _watermark(engine, cfg.org) is None
    assert _leads(engine) == {}
    sf.clear_faults()
    assert Poller(engine, cfg, adapter_for(cfg)).poll_once().new == 5


def _hold_poll_lock(db_url: str, org: str, ready: Any, release: Any) -> None:
    engine = make_engine(db_url, pool_size=1)
    with engine.connect() as conn:
        conn.execute(
            text("SELECT pg_advisory_lock(hashtext('lead-routing-connector:poll'), hashtext(:o))"),
            {"o": org},
        )
        conn.commit()
        ready.set()
        release.wait(30)
    engine.dispose()


def _one_lead_and_a_lock_holder(
    engine: Engine, db_url: str, sf: SalesforceSandbox
) -> tuple[OrgConfig, Any, Any]:
    """One routable lead in the CRM, and another process holding the org's poll lock."""
    reps = [sf.add_user("A")]
    intake = sf.add_user("Intake")
    cfg = _cfg(sf, reps, intake)
    apply_teams(engine, cfg)
    sf.add_record("Lead", owner_id=intake)
    ctx = worker_context()  # forked from the fork server: no interpreter start
    ready, release = ctx.Event(), ctx.Event()
    other = ctx.Process(target=_hold_poll_lock, args=(db_url, cfg.org, ready, release))
    other.start()
    assert ready.wait(30)
    return cfg, other, release


def test_only_one_process_polls_an_org_at_a_time(
    engine: Engine, db_url: str, sf: SalesforceSandbox
) -> None:
    cfg, other, release = _one_lead_and_a_lock_holder(engine, db_url, sf)
    try:
        skipped = Poller(engine, cfg, adapter_for(cfg)).poll_once()
        assert not skipped.ran
        assert _leads(engine) == {}
    finally:
        release.set()
        other.join(30)
    # the other poller is gone (its connection closed): the lock is free again
    assert Poller(engine, cfg, adapter_for(cfg)).poll_once().new == 1


def test_a_poller_that_dies_releases_the_org(
    engine: Engine, db_url: str, sf: SalesforceSandbox
) -> None:
    cfg, other, _ = _one_lead_and_a_lock_holder(engine, db_url, sf)
    other.kill()  # SIGKILL: no cleanup at all
    other.join(30)
    poller = Poller(engine, cfg, adapter_for(cfg))
    results: list[Any] = []

    def ran() -> bool:  # the server notices the dead connection within moments
        results.append(poller.poll_once())
        return bool(results[-1].ran)

    wait_until(ran, 10, "the dead poller's lock to be released", interval=0.1)
    result = results[-1]
    assert result.ran and result.new == 1
