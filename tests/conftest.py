from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from connector.core.config import OrgConfig
from connector.core.config_loading import parse_config
from connector.routing.teams import apply_teams
from connector.shell.store import make_engine
from crm_sandboxes import HubSpotSandbox, SalesforceSandbox
from testbed.pg import DatabaseFactory, test_server
from tests.helpers.faults import DedicatedPostgres, TwoOrgs, open_two_orgs
from tests.helpers.sample_org import SAMPLE_ENV, SAMPLE_YAML

SLOW_TIMEOUT_S = 900  # pytest-timeout for tests marked slow (pyproject: 300 for the others)


@pytest.fixture(scope="session")
def databases() -> Iterator[DatabaseFactory]:
    url, in_memory = test_server()
    factory = DatabaseFactory(url, drop_released=in_memory)
    yield factory
    if os.environ.get("TEST_DATABASE_URL"):
        factory.drop_all()  # a shared server keeps nothing of ours
    else:
        # The embedded server and its data dir are deleted at exit; dropping its hundreds of
        # databases one by one first took up to 80 s at the end of a worker's session.
        factory.close()


@pytest.fixture
def db_url(databases: DatabaseFactory) -> Iterator[str]:
    """A fresh, migrated database for this test (dropped after it when the server is in
    memory: see testbed/pg.py)."""
    url = databases.new()
    yield url
    databases.release(url)


@pytest.fixture
def engine(db_url: str) -> Iterator[Engine]:
    eng = make_engine(db_url)
    yield eng
    eng.dispose()


@pytest.fixture
def sample_cfg() -> OrgConfig:
    return parse_config(SAMPLE_YAML, "acme.yaml", SAMPLE_ENV)


@pytest.fixture
def applied(engine: Engine, sample_cfg: OrgConfig) -> OrgConfig:
    apply_teams(engine, sample_cfg)
    return sample_cfg


@pytest.fixture
def sf() -> Iterator[SalesforceSandbox]:
    """A fresh Salesforce simulator (short lock waits, a little work per saved record)."""
    box = SalesforceSandbox(lock_wait_s=0.3, record_work_ms=0.5).start()
    yield box
    box.stop()


@pytest.fixture
def hs() -> Iterator[HubSpotSandbox]:
    """A fresh HubSpot simulator with a budget no test exhausts by accident."""
    box = HubSpotSandbox(limit_per_10s=1000).start()
    yield box
    box.stop()


@pytest.fixture
def two_orgs(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[TwoOrgs]:
    """The fault suite's two demo orgs on recording sandboxes (see ``open_two_orgs``); a test
    passes options with ``@pytest.mark.two_orgs(sf={...}, hs={...}, poll=False, ...)``."""
    marker = request.node.get_closest_marker("two_orgs")
    with open_two_orgs(tmp_path, **(marker.kwargs if marker else {})) as orgs:
        yield orgs


@pytest.fixture
def dedicated_pg() -> Iterator[DedicatedPostgres]:
    """An embedded PostgreSQL of the test's own, in a temp dir, which it may stop and
    restart (even when TEST_DATABASE_URL is set: a shared server is never crashed)."""
    root = Path(tempfile.mkdtemp(prefix="lrc-fault-pg-"))
    try:
        pg = DedicatedPostgres(root)
        try:
            yield pg
        finally:
            pg.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)  # the server's cleanup leaves its folder


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "databases" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.db)
        if item.get_closest_marker("slow") and not item.get_closest_marker("timeout"):
            # multi-process tests: a minute on a quiet machine, several on a crowded one
            item.add_marker(pytest.mark.timeout(SLOW_TIMEOUT_S))
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # Under xdist the slow tests go first (a stable sort: every worker collects the same
        # order). Without TEST_DATABASE_URL dev.py gives cores + 4 workers `--maxschedchunk
        # 1` (each holds its running test and one more), so the slow ones spread over the
        # workers as they come free and the short ones fill in at the end. (With xdist's
        # default blocks of consecutive tests they all landed on one worker: 250 s of slow
        # tests in a row, the run's critical path.)
        items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(autouse=True)
def _database_outage_record_up() -> None:
    """Each test starts with the process's outage record up: one test's outage must not
    silence the next test's first warning (the record is process-wide, as in the service)."""
    from connector.core import outage

    outage.DATABASE.down_since = None
