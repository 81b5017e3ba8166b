"""Benchmark: assignment speed and fairness vs the one-statement ceiling and the naive rotation.

    .venv/bin/python -m bench.assign [--quick] [--history N] [--repeat N]
                                     [--only MODE:WORKERS[:LEADS[:BATCH]] ...]

Every configuration runs in a fresh database on the same server in the same run (the
embedded PostgreSQL, or BENCH_DATABASE_URL), one team of 10 equal-weight reps, workers as
separate processes released together. The ceiling (``ceiling``, ``ceiling_batch``) is the same
work as one prepared statement a call (testbed/ceiling.sql, see testbed/harness.py); per lead
there are three: one statement sent by pgbench's C client (``ceiling_pgbench``, when pgbench
is on the machine: no Python client's CPU competes with the server for the cores), one
statement sent from Python (``ceiling``) and two statements in a server-side function sent
from Python (``ceiling_fn``, no row lock on the members). The project per lead is measured
against the pgbench ceiling (``per_lead_vs_pgbench_ceiling``) and against the faster of the
two Python-driven ones (``per_lead_vs_ceiling``). Each row also prints the CPU a lead cost
in the timed part, in the workers' processes (pgbench's, for its row) and in their server
processes (read from /proc, so only for a server on this machine). Prints a table and the
ratios project / ceiling, and writes bench/results/assign.json (or
assign-history-N.json with ``--history N``), with the load average before and after, since
other work on the machine moves these figures.

``--history N`` first gives the team N earlier leads, assigned round robin, and ANALYZEs (as
autovacuum would): a database in production holds many assignments, and the planner's
estimates, so its choice of plans, follow the table's size.

``ceiling_batch+cpu`` is a diagnostic, not a ceiling: the batched ceiling again, its workers
first spending the CPU a batch that the project's workers used beyond the ceiling's own in the
same run (the difference of their client CPU a lead, times 500, busy-looping outside the team
lock). At 16 workers on two cores
that CPU competes with the lock holder, so this row says how much of the project's distance
to the ceiling its client's CPU explains (``batch_vs_ceiling_batch_plus_client_cpu``).

``--repeat N`` runs the whole table N times in turn and reports each ratio's median with
every run's value: on two shared cores one run's ratio at 16 workers moves by 0.1 or more
from run to run, mostly with the ceiling's own throughput.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, text

from connector.core.config_loading import parse_config
from connector.routing.teams import apply_teams
from connector.shell.store import make_engine
from testbed.harness import ENV, RunResult, fairness, run, run_pgbench, team_yaml
from testbed.pg import DatabaseFactory, server_url

RESULTS = Path(__file__).parent / "results"

# The team's earlier leads: N leads assigned round robin over its reps (N a multiple of their
# number, so the counts stay equal and the fairness check still applies), counts bumped.
HISTORY = """
WITH m AS (
    SELECT mb.id, mb.crm_user_id, mb.team_id, t.epoch,
           row_number() OVER (ORDER BY mb.id) - 1 AS k, count(*) OVER () AS n
    FROM members mb JOIN teams t ON t.id = mb.team_id
), l AS (
    INSERT INTO leads (org, crm_object, crm_id, fields, source)
    SELECT 'bench', 'Lead', 'H' || lpad(g::text, 10, '0'), '{}', 'import'
    FROM generate_series(0, :n - 1) AS g
    RETURNING id, crm_id
), a AS (
    INSERT INTO assignments (lead_id, org, team_id, member_id, crm_user_id, epoch,
                             rule_index, rule_name, source)
    SELECT l.id, 'bench', m.team_id, m.id, m.crm_user_id, m.epoch, 0, 'rule 0: default',
           'import'
    FROM l JOIN m ON m.k = CAST(substr(l.crm_id, 2) AS bigint) % m.n
    RETURNING member_id
)
UPDATE members mb SET assigned_in_epoch = mb.assigned_in_epoch + c.n
FROM (SELECT member_id, count(*) AS n FROM a GROUP BY member_id) c
WHERE mb.id = c.member_id
"""


def seed_history(engine: Engine, n: int) -> None:
    with engine.begin() as conn:
        conn.execute(text(HISTORY), {"n": n})
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("ANALYZE"))


def one(
    factory: DatabaseFactory,
    mode: str,
    workers: int,
    leads: int,
    batch: int = 1,
    history: int = 0,
    burn_ms: float = 0.0,
) -> dict[str, Any]:
    """One configuration in a fresh database. ``ceiling_batch+cpu`` is ``ceiling_batch`` whose
    workers first spend ``burn_ms`` of CPU per batch (see the module's docstring)."""
    label = mode
    if mode == "ceiling_batch+cpu":
        mode = "ceiling_batch"
    url = factory.new()
    yaml_text = team_yaml(10)
    engine = make_engine(url, pool_size=1)
    apply_teams(engine, parse_config(yaml_text, "bench.yaml", ENV))
    if history:
        seed_history(engine, history)
    ids = [f"00Q{mode[:2]}{i:010d}" for i in range(leads)]
    if mode == "ceiling_pgbench":
        pg = run_pgbench(url, "bench", "team", leads, workers, datetime.now(UTC).date())
        result = RunResult(mode, workers, pg.leads, pg.seconds, [], [], client_cpu=pg.client_cpu)
        leads = pg.leads
    else:
        result = run(mode, url, yaml_text, ids, workers, batch=batch, burn_ms=burn_ms)
    report = fairness(engine, "bench")
    engine.dispose()
    if result.errors:
        raise SystemExit(f"{mode} x{workers}: worker failed: {result.errors[0]}")
    if report["assigned"] - history != leads:
        raise SystemExit(f"{mode} x{workers}: {report['assigned'] - history} of {leads} assigned")
    row = {
        "mode": label,
        "workers": workers,
        "leads": leads,
        "batch": batch,
        "seconds": round(result.seconds, 3),
        "leads_per_s": round(result.leads_per_s, 1),
        # pgbench's run gives no latency per lead
        "p50_ms": round(result.percentile(50) * 1000, 2) if result.latencies else None,
        "p99_ms": round(result.percentile(99) * 1000, 2) if result.latencies else None,
        "spread": report["spread"],
        "double_owners": report["double_owners"],
        "assigned": report["assigned"] - history,  # this run's leads only
        "history": history,
        "burn_ms_per_batch": burn_ms,
        # CPU per lead in the timed part: the workers' processes, and their server processes'
        # (None when the server's processes cannot be read from this machine)
        "client_cpu_us": round(result.client_cpu / leads * 1e6, 1),
        "server_cpu_us": (
            None if result.server_cpu is None else round(result.server_cpu / leads * 1e6, 1)
        ),
    }
    cpu = f"cpu/lead client {row['client_cpu_us']:>6.0f} us"
    if row["server_cpu_us"] is not None:
        cpu += f"  server {row['server_cpu_us']:>6.0f} us"
    print(
        f"{label:<17} workers={workers:<3} batch={batch:<4} leads={leads:<6} "
        f"{row['leads_per_s']:>9,.0f}/s  p50 {_ms(row['p50_ms'])} ms  "
        f"p99 {_ms(row['p99_ms'])} ms  spread {row['spread']:>4}  "
        f"double owners {row['double_owners']}  {cpu}",
        flush=True,
    )
    return row


def _ms(value: float | None) -> str:
    return "      -" if value is None else f"{value:>7.2f}"


def ratios_of(rows: list[dict[str, Any]]) -> dict[str, float]:
    """One run's ratios: the project per lead against the faster of the two ceilings in each
    row (one statement, or two in a function), and batched against the batched ceiling."""

    def find(mode: str, workers: int) -> dict[str, Any]:
        return next(r for r in rows if r["mode"] == mode and r["workers"] == workers)

    ratios = {}
    for workers in (1, 4, 16):
        best = max(find(m, workers)["leads_per_s"] for m in ("ceiling", "ceiling_fn"))
        ratios[f"per_lead_vs_ceiling_x{workers}"] = round(
            find("project", workers)["leads_per_s"] / best, 3
        )
        if any(r["mode"] == "ceiling_pgbench" for r in rows):
            ratios[f"per_lead_vs_pgbench_ceiling_x{workers}"] = round(
                find("project", workers)["leads_per_s"]
                / find("ceiling_pgbench", workers)["leads_per_s"],
                3,
            )
        ratios[f"batch_vs_ceiling_batch_x{workers}"] = round(
            find("project_batch", workers)["leads_per_s"]
            / find("ceiling_batch", workers)["leads_per_s"],
            3,
        )
        ratios[f"batch_vs_ceiling_batch_plus_client_cpu_x{workers}"] = round(
            find("project_batch", workers)["leads_per_s"]
            / find("ceiling_batch+cpu", workers)["leads_per_s"],
            3,
        )
    return ratios


def adhoc(specs: list[str], history: int = 0) -> None:
    """Run the given configurations (e.g. ``ceiling:4:600`` or ``project_batch:1:5000:500``)."""
    factory = DatabaseFactory(os.environ.get("BENCH_DATABASE_URL") or server_url())
    try:
        for spec in specs:
            mode, workers, *rest = spec.split(":")
            leads = int(rest[0]) if rest else 600
            batch = int(rest[1]) if len(rest) > 1 else 1
            burn = float(rest[2]) if len(rest) > 2 else 0.0
            one(factory, mode, int(workers), leads, batch=batch, history=history, burn_ms=burn)
    finally:
        factory.drop_all()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer leads (a smoke run)")
    ap.add_argument(
        "--only",
        nargs="+",
        metavar="MODE:WORKERS[:LEADS[:BATCH[:BURN_MS]]]",
        help="run just these configurations, print them, write nothing",
    )
    ap.add_argument(
        "--history",
        type=int,
        default=0,
        metavar="N",
        help="give the team N earlier assigned leads first (a multiple of its 10 reps)",
    )
    ap.add_argument(
        "--repeat",
        type=int,
        default=1,
        metavar="N",
        help="run the whole table N times in turn; report each ratio's median",
    )
    args = ap.parse_args()
    if args.history < 0 or args.history % 10:
        ap.error("--history must be 0 or a positive multiple of the team's 10 reps")
    if args.repeat < 1:
        ap.error("--repeat must be at least 1")
    if args.only:
        adhoc(args.only, args.history)
        return
    per_lead = 600 if args.quick else 3000
    batched = 5000 if args.quick else 40_000
    url = os.environ.get("BENCH_DATABASE_URL") or server_url()
    factory = DatabaseFactory(url)
    rows: list[dict[str, Any]] = []
    each: list[dict[str, float]] = []  # every run's ratios
    per_lead_modes = ["ceiling", "ceiling_fn", "project", "naive"]
    if shutil.which("pgbench"):
        per_lead_modes.insert(0, "ceiling_pgbench")
    else:
        print("pgbench is not on this machine: no pgbench-driven ceiling", flush=True)
    t0 = time.time()
    load_before = os.getloadavg()
    try:
        for run_no in range(args.repeat):
            run_rows: list[dict[str, Any]] = []
            for workers in (1, 4, 16):
                for mode in per_lead_modes:
                    run_rows.append(one(factory, mode, workers, per_lead, history=args.history))
            for workers in (1, 4, 16):
                for mode in ("ceiling_batch", "project_batch"):
                    run_rows.append(
                        one(factory, mode, workers, batched, batch=500, history=args.history)
                    )
                # the ceiling again, its workers spending the CPU a batch the project's
                # workers used beyond the ceiling's own
                ceiling_row, project_row = run_rows[-2], run_rows[-1]
                extra_us = max(project_row["client_cpu_us"] - ceiling_row["client_cpu_us"], 0.0)
                burn = extra_us * 500 / 1000
                run_rows.append(
                    one(
                        factory,
                        "ceiling_batch+cpu",
                        workers,
                        batched,
                        batch=500,
                        history=args.history,
                        burn_ms=burn,
                    )
                )
            each.append(ratios_of(run_rows))
            print(
                f"ratios of run {run_no + 1} (project / the ceiling named):",
                ", ".join(f"{k}={v}" for k, v in each[-1].items()),
                flush=True,
            )
            rows.extend({**r, "run": run_no + 1} for r in run_rows)
    finally:
        factory.drop_all()
    ratios = {k: round(statistics.median(r[k] for r in each), 3) for k in each[0]}
    if args.repeat > 1:
        print(
            f"median ratios of {args.repeat} runs:",
            ", ".join(f"{k}={v}" for k, v in ratios.items()),
        )
    RESULTS.mkdir(exist_ok=True)
    out = {
        "benchmark": "assign",
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "database": "BENCH_DATABASE_URL" if os.environ.get("BENCH_DATABASE_URL") else "embedded",
        "quick": args.quick,
        "history": args.history,
        "rows": rows,
        "ratios": ratios,  # the median of the runs' (one run: its own)
        "ratios_each_run": each,
        "load_average": {"before": load_before, "after": os.getloadavg()},
        "seconds_total": round(time.time() - t0, 1),
    }
    path = RESULTS / ("assign.json" if not args.history else f"assign-history-{args.history}.json")
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
