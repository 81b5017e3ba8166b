"""Benchmark: assignment speed and fairness vs the one-statement ceiling and the naive rotation.

    .venv/bin/python -m bench.assign [--quick] [--only MODE:WORKERS[:LEADS[:BATCH]] ...]

Every configuration runs in a fresh database on the same server in the same run (the
embedded PostgreSQL, or BENCH_DATABASE_URL), one team of 10 equal-weight reps, workers as
separate processes released together. The ceiling (``ceiling``, ``ceiling_batch``) is the same
work as one prepared statement a call (bench/ceiling.sql, see bench/harness.py). Prints a
table and the ratios project / ceiling, and writes bench/results/assign.json (with the load
average before and after, since other work on the machine moves these figures).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

from bench.harness import ENV, RunResult, fairness, run, team_yaml
from connector.core.config import parse_config
from connector.routing.teams import apply_teams
from connector.shell.store import make_engine
from tests.pg import DatabaseFactory, server_url

RESULTS = Path(__file__).parent / "results"


def one(
    factory: DatabaseFactory, mode: str, workers: int, leads: int, batch: int = 1
) -> dict[str, Any]:
    url = factory.new()
    yaml_text = team_yaml(10)
    engine = make_engine(url, pool_size=1)
    apply_teams(engine, parse_config(yaml_text, "bench.yaml", ENV))
    ids = [f"00Q{mode[:2]}{i:010d}" for i in range(leads)]
    result: RunResult = run(mode, url, yaml_text, ids, workers, batch=batch)
    report = fairness(engine, "bench")
    engine.dispose()
    if result.errors:
        raise SystemExit(f"{mode} x{workers}: worker failed: {result.errors[0]}")
    row = {
        "mode": mode,
        "workers": workers,
        "leads": leads,
        "batch": batch,
        "seconds": round(result.seconds, 3),
        "leads_per_s": round(result.leads_per_s, 1),
        "p50_ms": round(result.percentile(50) * 1000, 2),
        "p99_ms": round(result.percentile(99) * 1000, 2),
        "spread": report["spread"],
        "double_owners": report["double_owners"],
        "assigned": report["assigned"],
    }
    print(
        f"{mode:<14} workers={workers:<3} batch={batch:<4} leads={leads:<6} "
        f"{row['leads_per_s']:>9,.0f}/s  p50 {row['p50_ms']:>7.2f} ms  "
        f"p99 {row['p99_ms']:>7.2f} ms  spread {row['spread']:>4}  "
        f"double owners {row['double_owners']}",
        flush=True,
    )
    return row


def adhoc(specs: list[str]) -> None:
    """Run the given configurations (e.g. ``ceiling:4:600`` or ``project_batch:1:5000:500``)."""
    factory = DatabaseFactory(os.environ.get("BENCH_DATABASE_URL") or server_url())
    try:
        for spec in specs:
            mode, workers, *rest = spec.split(":")
            leads = int(rest[0]) if rest else 600
            batch = int(rest[1]) if len(rest) > 1 else 1
            one(factory, mode, int(workers), leads, batch=batch)
    finally:
        factory.drop_all()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer leads (a smoke run)")
    ap.add_argument(
        "--only",
        nargs="+",
        metavar="MODE:WORKERS[:LEADS[:BATCH]]",
        help="run just these configurations, print them, write nothing",
    )
    args = ap.parse_args()
    if args.only:
        adhoc(args.only)
        return
    per_lead = 600 if args.quick else 3000
    batched = 5000 if args.quick else 40_000
    url = os.environ.get("BENCH_DATABASE_URL") or server_url()
    factory = DatabaseFactory(url)
    rows: list[dict[str, Any]] = []
    t0 = time.time()
    load_before = os.getloadavg()
    try:
        for workers in (1, 4, 16):
            for mode in ("ceiling", "project", "naive"):
                rows.append(one(factory, mode, workers, per_lead))
        for workers in (1, 4, 16):
            for mode in ("ceiling_batch", "project_batch"):
                rows.append(one(factory, mode, workers, batched, batch=500))
    finally:
        factory.drop_all()

    def find(mode: str, workers: int) -> dict[str, Any]:
        return next(r for r in rows if r["mode"] == mode and r["workers"] == workers)

    ratios = {}
    for workers in (1, 4, 16):
        ratios[f"per_lead_vs_ceiling_x{workers}"] = round(
            find("project", workers)["leads_per_s"] / find("ceiling", workers)["leads_per_s"], 3
        )
        ratios[f"batch_vs_ceiling_batch_x{workers}"] = round(
            find("project_batch", workers)["leads_per_s"]
            / find("ceiling_batch", workers)["leads_per_s"],
            3,
        )
    print(
        "ratios (project / one-statement ceiling, same run):",
        ", ".join(f"{k}={v}" for k, v in ratios.items()),
    )
    RESULTS.mkdir(exist_ok=True)
    out = {
        "benchmark": "assign",
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "database": "BENCH_DATABASE_URL" if os.environ.get("BENCH_DATABASE_URL") else "embedded",
        "quick": args.quick,
        "rows": rows,
        "ratios": ratios,
        "load_average": {"before": load_before, "after": os.getloadavg()},
        "seconds_total": round(time.time() - t0, 1),
    }
    path = RESULTS / "assign.json"
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
