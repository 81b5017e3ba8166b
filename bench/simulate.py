"""Benchmark: `connector simulate` replaying 100,000 stored leads.

    .venv/bin/python -m bench.simulate [--leads N]

Routes N leads (default 100,000) into a fresh database through the project's batched path, two
teams and three rules, a daily cap on one team that overflows into the other and working hours
for one rep (the router's clock moves 15 minutes a batch from a Monday 00:00 UTC, so the caps
are hit and reset and the rep goes off shift), then times the what-if replay the way the
command runs it: the READ ONLY read of the window (load_history), the replay with the config
that ran (which must reproduce every recorded owner and unassigned reason) and with a changed
config, and the report. The floor it is compared
against in the same run is reading the same rows with psycopg alone (no Python objects built):
what any replay has to pay. Prints a table and writes bench/results/simulate.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg

import db
from connector.core.config import OrgConfig
from connector.core.config_loading import parse_config
from connector.routing.assign import Lead, Router
from connector.routing.replay_read import load_history
from connector.routing.replay_report import report
from connector.routing.simulate import simulate
from connector.routing.teams import apply_teams
from connector.shell.store import make_engine
from testbed.pg import DatabaseFactory, server_url

RESULTS = Path(__file__).parent / "results"
ENV = {"BENCH_TOKEN": "unused"}
COUNTRIES = ("US", "DE", "CA", "FR", "US", "JP", "US", "BR", "GB", "US")


START = datetime(2026, 12, 7, 0, 0, tzinfo=UTC)  # a Monday
STEP = timedelta(minutes=15)  # the router's clock, per batch
HOURS = ', hours: {timezone: UTC, mon-fri: "08:00-18:00"}'


def org_yaml(na_weights: tuple[int, ...], row_reps: int, cap: int = 7000) -> str:
    na = "\n".join(
        f'      - {{crm_user_id: "005{i:015d}", name: "NA {i}", weight: {w}}}'
        for i, w in enumerate(na_weights)
    )
    row = "\n".join(
        f'      - {{crm_user_id: "005{100 + i:015d}", name: "ROW {i}"{HOURS if i == 0 else ""}}}'
        for i in range(row_reps)
    )
    return f"""
org: bench
crm:
  kind: salesforce
  instance_url: https://bench.my.salesforce.com
  auth: {{method: session, access_token: "${{BENCH_TOKEN}}"}}
  object: Lead
teams:
  - name: na
    caps: {{per_day: {cap}}}
    overflow_team: row
    members:
{na}
  - name: row
    members:
{row}
rules:
  - {{team: na, when: {{Country: [US, CA]}}}}
  - {{team: row, when: {{Country: [DE, FR, GB]}}}}
  - {{team: row}}
"""


class StepClock:
    def __init__(self) -> None:
        self.n = 0

    def __call__(self) -> datetime:
        self.n += 1
        return START + self.n * STEP


def fill(router: Router, n: int, batch: int = 1000) -> float:
    t0 = time.perf_counter()
    for start in range(0, n, batch):
        leads = [
            Lead(f"00Q{i:012d}", {"Country": COUNTRIES[i % len(COUNTRIES)], "LastName": f"L{i}"})
            for i in range(start, min(start + batch, n))
        ]
        router.assign_many(leads, "import")
    return time.perf_counter() - t0


def raw_read(url: str, since: datetime) -> float:
    """The floor: the same history query through psycopg, rows fetched as tuples."""
    sql = (
        db.queries("simulate")["history"].replace(":org", "%(org)s").replace(":since", "%(since)s")
    )
    t0 = time.perf_counter()
    with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://", 1)) as conn:
        rows = conn.execute(sql, {"org": "bench", "since": since}).fetchall()
    assert rows
    return time.perf_counter() - t0


def timed_replay(engine: Any, cfg: OrgConfig, since: datetime) -> dict[str, Any]:
    t0 = time.perf_counter()
    history = load_history(engine, cfg, since)
    t1 = time.perf_counter()
    sim = simulate(cfg, history)
    t2 = time.perf_counter()
    rep = report(cfg, history, sim, since)
    t3 = time.perf_counter()
    return {
        "read_s": round(t1 - t0, 3),
        "replay_s": round(t2 - t1, 3),
        "report_s": round(t3 - t2, 3),
        "total_s": round(t3 - t0, 3),
        "changed_rep": rep["changed_rep"],
        "leads": rep["leads"],
        "unassigned_before": rep["unassigned"]["before"],
        "unassigned_after": rep["unassigned"]["after"],
        "overflowed": rep["overflowed"],
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--leads", type=int, default=100_000)
    args = ap.parse_args()
    url = os.environ.get("BENCH_DATABASE_URL") or server_url()
    factory = DatabaseFactory(url)
    try:
        db_url = factory.new()
        engine = make_engine(db_url, pool_size=2)
        ran = parse_config(org_yaml((1, 2, 1, 1), 6), "bench.yaml", ENV)
        apply_teams(engine, ran)
        fill_s = fill(Router(engine, ran, clock=StepClock()), args.leads)
        since = datetime.now(UTC) - timedelta(days=1)
        floor = min(raw_read(db_url, since) for _ in range(3))
        same = min((timed_replay(engine, ran, since) for _ in range(3)), key=lambda r: r["total_s"])
        if same["changed_rep"] != 0 or same["unassigned_before"] != same["unassigned_after"]:
            raise SystemExit(
                f"replay with the config that ran changed {same['changed_rep']} reps, "
                f"unassigned {same['unassigned_before']} -> {same['unassigned_after']}"
            )
        proposed = parse_config(org_yaml((1, 1, 1, 1, 1), 5), "proposed.yaml", ENV)
        changed = min(
            (timed_replay(engine, proposed, since) for _ in range(3)), key=lambda r: r["total_s"]
        )
        engine.dispose()
    finally:
        factory.drop_all()
    per_lead_us = same["total_s"] / same["leads"] * 1e6
    ratio = round(same["total_s"] / floor, 2)
    print(f"stored {args.leads:,} leads in {fill_s:.1f} s (batched assignment, 1,000 a batch)")
    print(f"floor: psycopg reads the window's rows        {floor:8.3f} s")
    for name, r in (("same config (must reproduce)", same), ("changed config", changed)):
        print(
            f"{name:<30} read {r['read_s']:6.3f} s  replay {r['replay_s']:6.3f} s  "
            f"report {r['report_s']:6.3f} s  total {r['total_s']:6.3f} s  "
            f"changed reps {r['changed_rep']:,}"
        )
    print(
        f"recorded: unassigned {same['unassigned_before']}, overflowed "
        f"{same['overflowed']['before']}; changed config: unassigned "
        f"{changed['unassigned_after']}, overflowed {changed['overflowed']['after']}"
    )
    print(f"per lead {per_lead_us:.1f} us; simulate / floor = {ratio}x (same run)")
    RESULTS.mkdir(exist_ok=True)
    out = {
        "benchmark": "simulate",
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "database": "BENCH_DATABASE_URL" if os.environ.get("BENCH_DATABASE_URL") else "embedded",
        "leads": args.leads,
        "fill_s": round(fill_s, 1),
        "floor_read_s": round(floor, 3),
        "same_config": same,
        "changed_config": changed,
        "per_lead_us": round(per_lead_us, 1),
        "ratio_vs_floor": ratio,
    }
    path = RESULTS / "simulate.json"
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
