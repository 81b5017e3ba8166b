"""CONNECTOR_DB_POOL_SIZE: the engine pool's size (and overflow), refused in one line when it
is not a whole number from 1 to 100, before anything touches the database."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.pool import QueuePool

from connector.core.config import ConfigError
from connector.shell.cli import main
from connector.shell.store import make_engine, pool_size_from
from testbed.pg import DatabaseFactory, blank_database
from tests.helpers.sample_org import SAMPLE_ENV, SAMPLE_YAML


def test_the_default_and_a_chosen_size() -> None:
    assert pool_size_from({}) == 5
    assert pool_size_from({"CONNECTOR_DB_POOL_SIZE": ""}) == 5
    assert pool_size_from({"CONNECTOR_DB_POOL_SIZE": " 12 "}) == 12
    assert pool_size_from({"CONNECTOR_DB_POOL_SIZE": "100"}) == 100


@pytest.mark.parametrize("value", ["0", "101", "-3", "five", "2.5"])
def test_values_outside_1_to_100_are_refused(value: str) -> None:
    with pytest.raises(ConfigError) as exc:
        pool_size_from({"CONNECTOR_DB_POOL_SIZE": value})
    assert str(exc.value) == (
        f"CONNECTOR_DB_POOL_SIZE: {value!r} is not a whole number from 1 to 100"
    )


def test_the_engine_takes_its_pool_size_from_the_environment(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CONNECTOR_DB_POOL_SIZE", "3")
    engine = make_engine(db_url)
    try:
        assert isinstance(engine.pool, QueuePool)
        assert (engine.pool.size(), engine.pool._max_overflow) == (3, 3)
        with engine.connect() as conn:
            assert conn.execute(text("SELECT 1")).scalar_one() == 1
    finally:
        engine.dispose()
    assert make_engine(db_url, pool_size=7).pool.size() == 7  # an explicit size wins


def test_a_bad_size_is_refused_before_the_database_is_touched(
    databases: DatabaseFactory,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    url = blank_database(databases, "pool_size_refused")
    config = tmp_path / "acme.yaml"
    config.write_text(SAMPLE_YAML)
    for name, value in SAMPLE_ENV.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("DATABASE_URL", url)
    monkeypatch.setenv("CONNECTOR_DB_POOL_SIZE", "500")
    assert main(["--config", str(config), "migrate"]) == 2
    out, err = capsys.readouterr()
    assert (out, err) == (
        "",
        "connector: CONNECTOR_DB_POOL_SIZE: '500' is not a whole number from 1 to 100\n",
    )
    engine = make_engine(url, pool_size=1)
    try:
        with engine.connect() as conn:
            tables = conn.execute(
                text("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'")
            ).scalar_one()
    finally:
        engine.dispose()
    assert tables == 0  # nothing was migrated
