"""`connector demo`: a burst of concurrent leads, routed on an embedded PostgreSQL.

It needs nothing installed: a throw-away embedded server starts in a temporary folder, a
sample org config is written beside it, and worker processes send the same burst a webinar
would (with repeats) through the real assignment code, then the fairness table is printed
from the database. Exit status 0 means every guarantee held.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from sqlalchemy import text

from connector.config import OrgConfig, load_configs
from connector.routing import Lead, Router
from connector.status import org_status
from connector.store import make_engine, migrate, start_embedded
from connector.teams import apply_teams

DEMO_YAML = """\
# Written by `connector demo`. The secret is a reference, resolved from the environment.
org: demo
crm:
  kind: salesforce
  instance_url: https://demo.my.salesforce.com
  auth: {method: client_credentials, client_id: "${DEMO_SF_CLIENT_ID}",
         client_secret: "${DEMO_SF_CLIENT_SECRET}"}
  object: Lead
teams:
  - name: na_ae
    members:
      - {crm_user_id: "005000000000001AAA", name: Ada Lovelace, weight: 1}
      - {crm_user_id: "005000000000002AAA", name: Alan Turing, weight: 1}
      - {crm_user_id: "005000000000003AAA", name: Grace Hopper, weight: 2}
  - name: emea_ae
    members:
      - {crm_user_id: "005000000000004AAA", name: Edsger Dijkstra}
      - {crm_user_id: "005000000000005AAA", name: Barbara Liskov}
      - {crm_user_id: "005000000000006AAA", name: Tony Hoare}
      - {crm_user_id: "005000000000007AAA", name: Frances Allen}
rules:
  - {name: north america, team: na_ae, when: {Country: [US, CA]}}
  - {name: everyone else, team: emea_ae}
"""
DEMO_ENV = {"DEMO_SF_CLIENT_ID": "demo-client", "DEMO_SF_CLIENT_SECRET": "demo-secret"}
COUNTRIES = ["US", "CA", "us", "DE", "FR", "GB", "NL", "SE"]


def _burst(n: int, seed: int = 7) -> list[tuple[str, dict[str, str]]]:
    rng = random.Random(seed)
    leads = [
        (f"00Q{i:015d}", {"Country": rng.choice(COUNTRIES), "Company": f"Co {i}"}) for i in range(n)
    ]
    repeats = rng.sample(leads, k=n // 10)  # deliveries repeat: 10% arrive twice
    burst = leads + repeats
    rng.shuffle(burst)
    return burst


def _worker(
    url: str, config_path: str, share: list[tuple[str, dict[str, str]]], barrier: Any, out: Any
) -> None:
    os.environ.update(DEMO_ENV)
    cfg = load_configs(config_path)["demo"]
    engine = make_engine(url, pool_size=1)
    router = Router(engine, cfg)
    latencies: list[float] = []
    statuses: dict[str, int] = {}
    barrier.wait()
    for crm_id, fields in share:
        t0 = time.perf_counter()
        outcome = router.assign(Lead(crm_id, fields), "api")
        latencies.append(time.perf_counter() - t0)
        statuses[outcome.status] = statuses.get(outcome.status, 0) + 1
    engine.dispose()
    out.put((latencies, statuses))


def _table(status: dict[str, Any], cfg: OrgConfig) -> list[str]:
    lines = []
    for team in status["teams"]:
        members = team["members"]
        total = sum(m["assigned"] for m in members)
        weight = sum(m["weight"] for m in members if m["active"])
        lines.append(f"team {team['name']}: {total} leads")
        lines.append(f"  {'rep':<18} {'weight':>6} {'leads':>7} {'fair share':>11} {'off by':>7}")
        for m in members:
            share = total * m["weight"] / weight if weight else 0.0
            lines.append(
                f"  {m['name']:<18} {m['weight']:>6} {m['assigned']:>7} "
                f"{share:>11.2f} {m['assigned'] - share:>+7.2f}"
            )
    return lines


def run_demo(workers: int = 8, leads: int = 2000) -> int:
    """Run the burst and print the figures; 0 when every guarantee held."""
    root = Path(tempfile.mkdtemp(prefix="connector-demo-"))
    try:
        t_start = time.perf_counter()
        print(f"starting an embedded PostgreSQL in {root} ...")
        url = start_embedded(root / "pgdata", cleanup_mode="delete")
        (root / "config").mkdir()
        config_path = root / "config" / "demo.yaml"
        config_path.write_text(DEMO_YAML, encoding="utf-8")
        os.environ.update(DEMO_ENV)
        cfg = load_configs(config_path)["demo"]
        engine = make_engine(url)
        migrate(engine)
        apply_teams(engine, cfg)

        burst = _burst(leads)
        print(
            f"sending {len(burst)} deliveries ({leads} leads, {len(burst) - leads} repeats) "
            f"from {workers} processes at once ..."
        )
        ctx = mp.get_context("spawn")
        barrier, out = ctx.Barrier(workers + 1), ctx.Queue()
        procs = [
            ctx.Process(
                target=_worker, args=(url, str(config_path), burst[i::workers], barrier, out)
            )
            for i in range(workers)
        ]
        for p in procs:
            p.start()
        barrier.wait(timeout=120)
        t0 = time.perf_counter()
        results = [out.get(timeout=300) for _ in procs]
        elapsed = time.perf_counter() - t0
        for p in procs:
            p.join(timeout=30)
        latencies = sorted(x for lat, _ in results for x in lat)
        statuses: dict[str, int] = {}
        for _, st in results:
            for k, v in st.items():
                statuses[k] = statuses.get(k, 0) + v

        status = org_status(engine, cfg)
        with engine.connect() as conn:
            double = conn.execute(
                text(
                    "SELECT count(*) FROM (SELECT lead_id FROM assignments GROUP BY lead_id "
                    "HAVING count(*) > 1) x"
                )
            ).scalar_one()
        engine.dispose()

        print()
        print("\n".join(_table(status, cfg)))
        print()
        p50 = statistics.median(latencies) * 1000
        p99 = latencies[int(0.99 * (len(latencies) - 1))] * 1000
        print(
            f"deliveries: {len(burst)} in {elapsed:.2f} s ({len(burst) / elapsed:,.0f}/s); "
            f"assign+commit latency p50 {p50:.1f} ms, p99 {p99:.1f} ms"
        )
        print(
            f"new leads {statuses.get('assigned', 0) + statuses.get('unassigned', 0)}, "
            f"repeats ignored {statuses.get('duplicate', 0)}, leads with two owners {double}, "
            f"outbox rows waiting for the CRM {status['outbox']['pending']}"
        )
        ok = status["leads"]["assigned"] == leads and double == 0 and _within_one(status)
        print(
            "guarantees: "
            + (
                "HELD (every lead one owner; every rep within one lead of its weighted share)"
                if ok
                else "VIOLATED"
            )
        )
        print(f"demo finished in {time.perf_counter() - t_start:.1f} s")
        return 0 if ok else 1
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _within_one(status: dict[str, Any]) -> bool:
    for team in status["teams"]:
        members = [m for m in team["members"] if m["active"]]
        total = sum(m["assigned"] for m in members)
        weight = sum(m["weight"] for m in members)
        if any(abs(m["assigned"] - total * m["weight"] / weight) >= 1 for m in members):
            return False
    return True
