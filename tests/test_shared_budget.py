"""One CRM budget per org shared by every process (connector/core/budget.py): the bucket's
shape (pure), the bucket in PostgreSQL under concurrent takers, and three real processes
against the HubSpot sandbox at its limit (bench/budget.py, shortened)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from connector.core.budget import WINDOW_PAD, Bucket, SharedBudget, bucket_for
from tests.helpers.faults import ROOT


@pytest.mark.parametrize("limit", [1, 5, 10, 100, 190, 250])
def test_no_window_holds_more_than_the_limit(limit: int) -> None:
    b = bucket_for(limit)
    assert b.burst >= 1
    # what a bucket can give in any 10 s: the burst, and what refills meanwhile
    assert b.burst + b.rate * 10.0 <= limit or limit == 1
    assert b.rate * 10.0 * WINDOW_PAD >= limit - b.burst - 1e-9  # and it follows the limit
    with pytest.raises(ValueError):
        bucket_for(0)


def test_three_takers_share_one_bucket(engine: Engine) -> None:
    """Three takers (each its own SharedBudget, as three processes would have) together get
    what one bucket gives: its burst plus its rate for the time they ran, not three times."""
    bucket = Bucket(rate=20.0, burst=2.0)
    takers = [SharedBudget(engine, "acme", bucket) for _ in range(3)]
    run_s = 3.0
    taken = [0, 0, 0]
    start = time.monotonic()

    def take(i: int) -> None:
        while time.monotonic() - start < run_s:
            takers[i].acquire()
            taken[i] += 1

    threads = [threading.Thread(target=take, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - start
    total = sum(taken)
    # at most the burst plus the rate over the time they took for (the last take may end
    # after run_s), at least most of the rate: the pace follows the budget
    assert total <= bucket.burst + bucket.rate * elapsed + 3, (taken, elapsed)
    assert total >= 0.8 * bucket.rate * run_s, (taken, elapsed)
    assert min(taken) > 0  # every taker got calls
    with engine.connect() as conn:
        assert conn.execute(text("SELECT org FROM crm_budgets")).scalars().all() == ["acme"]


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
