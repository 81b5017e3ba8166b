"""One HubSpot budget shared by N processes: N worker processes read contacts from one
HubSpot sandbox account (batch reads, as fast as their adapters allow) for a while, with the
org's budget shared through PostgreSQL (``adapter_for(cfg, engine)``, the default) or each
process on its own limiter only (``--per-process``, how it was before). Prints and writes
bench/results/budget.json: calls made, 429 answers, and the calls sent in each 10-s window
and in the busiest rolling 10 s, against the account's limit.

    .venv/bin/python -m bench.budget                      # 3 processes, 60 s, limit 100
    .venv/bin/python -m bench.budget --per-process        # the same without the shared budget
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"
WINDOW_S = 10.0


def busiest_window(stamps: list[float], window_s: float = WINDOW_S) -> int:
    """The most calls sent in any ``window_s`` (a rolling window, as HubSpot counts)."""
    stamps = sorted(stamps)
    best, lo = 0, 0
    for hi, t in enumerate(stamps):
        while t - stamps[lo] >= window_s:
            lo += 1
        best = max(best, hi - lo + 1)
    return best


def worker(base_url: str, token: str, db_url: str | None, limit: int, seconds: float) -> None:
    """One process: read as fast as the adapter allows; print the send times and refusals."""
    from connector.shell.adapters import adapter_for
    from connector.shell.store import make_engine
    from crm_adapters.base import RateLimitedError
    from testbed.crm_orgs import hubspot_org

    class _Box:  # the fields hubspot_org reads of a sandbox
        url = base_url
        access_token = token

    cfg = hubspot_org(_Box(), ["1"], limit_per_10s=limit)  # type: ignore[arg-type]
    engine = make_engine(db_url) if db_url else None
    adapter = adapter_for(cfg, engine)
    stamps: list[float] = []
    refused = 0
    end = time.time() + seconds
    while time.time() < end:
        try:
            adapter.fetch_records(["1"], [])
            stamps.append(time.time())
        except RateLimitedError:
            refused += 1
    print(json.dumps({"stamps": stamps, "refused": refused}))


def run(processes: int, seconds: float, limit: int, shared: bool) -> dict[str, Any]:
    from crm_sandboxes import HubSpotSandbox
    from testbed.pg import DatabaseFactory, server_url

    hs = HubSpotSandbox(limit_per_10s=limit).start()
    factory = DatabaseFactory(os.environ.get("BENCH_DATABASE_URL") or server_url())
    db_url = factory.new() if shared else None
    try:
        hs.add_record("contacts", properties={"country": "Canada"})
        args = [hs.url, hs.access_token, db_url or "", str(limit), str(seconds)]
        procs = [
            subprocess.Popen(
                [sys.executable, "-m", "bench.budget", "--worker", *args],
                stdout=subprocess.PIPE,
                cwd=Path(__file__).parents[1],
            )
            for _ in range(processes)
        ]
        outs = [json.loads(p.communicate(timeout=seconds + 120)[0]) for p in procs]
    finally:
        hs.stop()
        if db_url:
            factory.release(db_url)
    stamps = sorted(t for o in outs for t in o["stamps"])
    t0 = stamps[0] if stamps else 0.0
    per_window = Counter(int((t - t0) // WINDOW_S) for t in stamps)
    return {
        "processes": processes,
        "seconds": seconds,
        "limit_per_10s": limit,
        "shared_budget": shared,
        "calls": len(stamps),
        "refused_429": sum(o["refused"] for o in outs),
        "calls_per_10s": [per_window[i] for i in range(int(seconds // WINDOW_S))],
        "busiest_rolling_10s": busiest_window(stamps),
        "calls_per_process": [len(o["stamps"]) for o in outs],
    }


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        base_url, token, db_url, limit, seconds = sys.argv[2:7]
        worker(base_url, token, db_url or None, int(limit), float(seconds))
        return
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--processes", type=int, default=3)
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--limit", type=int, default=100, help="the account's calls per 10 s")
    p.add_argument("--per-process", action="store_true", help="no shared budget (before)")
    p.add_argument("--out", type=Path, default=RESULTS / "budget.json")
    a = p.parse_args()
    result = run(a.processes, a.seconds, a.limit, shared=not a.per_process)
    result["machine"] = {"cpus": os.cpu_count(), "python": platform.python_version()}
    print(json.dumps(result, indent=2))
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
