"""One CRM budget per org shared by every process (connector/core/budget.py): the budget in
PostgreSQL under concurrent takers, and three real processes against the HubSpot sandbox at
its limit (bench/budget.py, shortened)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from connector.core.budget import SharedBudget, padded_window
from tests.helpers.faults import ROOT


def test_three_takers_share_one_budget(engine: Engine) -> None:
    """Three takers (each its own SharedBudget, as three processes would have) together get
    at most the limit in any window, and the limit in each: not three times it."""
    limit, window = 8, 1.0
    takers = [SharedBudget(engine, "acme", limit, window) for _ in range(3)]
    run_s = 3.2
    stamps: list[list[float]] = [[], [], []]
    start = time.monotonic()

    def take(i: int) -> None:
        while time.monotonic() - start < run_s:
            takers[i].acquire()
            stamps[i].append(time.monotonic())

    threads = [threading.Thread(target=take, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    calls = sorted(t for s in stamps for t in s)
    windows = math.ceil((calls[-1] - calls[0]) / padded_window(window)) + 1
    assert len(calls) <= limit * windows, (len(calls), windows)
    assert len(calls) >= limit * math.floor(run_s / padded_window(window)), len(calls)
    assert min(len(s) for s in stamps) > 0  # every taker got calls
    with engine.connect() as conn:
        assert conn.execute(text("SELECT org FROM crm_budgets")).scalars().all() == ["acme"]


def test_budget_arguments_are_checked(engine: Engine) -> None:
    with pytest.raises(ValueError):
        SharedBudget(engine, "acme", 0)


@pytest.mark.slow
def test_three_processes_at_the_sandbox_limit_get_no_429(tmp_path: Path) -> None:
    out = tmp_path / "budget.json"
    subprocess.run(
        [sys.executable, "-m", "bench.budget", "--seconds", "12", "--out", str(out)],
        cwd=ROOT,
        check=True,
        capture_output=True,
        timeout=300,
    )
    result = json.loads(out.read_text())
    assert result["refused_429"] == 0, result
    assert result["busiest_rolling_10s"] <= result["limit_per_10s"], result
    assert result["calls_per_10s"][0] >= 0.8 * result["limit_per_10s"], result  # paced, not idle
    assert min(result["calls_per_process"]) > 0, result
