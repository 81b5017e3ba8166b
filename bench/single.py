"""Benchmark: where one lead's time goes, call by call.

    .venv/bin/python -m bench.single [--calls N]

One process, one fresh database (the embedded PostgreSQL, or BENCH_DATABASE_URL), one team of
10 equal-weight reps (a plain team: no caps, no catch-up, nobody away). Each round makes one
call of each kind below in turn, so the machine's noise falls on all of them alike. Prints
each kind's median and p90 in microseconds and its ratio to the faster ceiling's median (as
bench.assign measures), and writes
bench/results/single.json with the load average before and after.

* ``ceiling``: the one-statement ceiling (testbed/ceiling.sql ``one``) on a held connection,
  exactly as bench.assign's ceiling workers send it; ``ceiling_fn`` the two-statement one
  (``one_fn``: the same work in a function, no row lock on the members).
* ``route_new_lead call``: the connector's call on a held connection, with the parameters
  ``Router`` computed once: the server's part, plus the driver's.
* ``assign``: ``Router.assign``, which also matches the rules, computes the parameters and
  takes a pooled connection.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import psycopg

from connector.core.config_loading import parse_config
from connector.routing import assign
from connector.routing.teams import apply_teams
from connector.shell.store import make_engine
from testbed.harness import ENV, CeilingRouter, prepare_ceiling_fn, team_yaml
from testbed.pg import DatabaseFactory, server_url

RESULTS = Path(__file__).parent / "results"


def measure(calls: int) -> dict[str, list[float]]:
    url = os.environ.get("BENCH_DATABASE_URL") or server_url()
    factory = DatabaseFactory(url)
    try:
        db_url = factory.new()
        cfg = parse_config(team_yaml(10), "bench.yaml", ENV)
        engine = make_engine(db_url, pool_size=1)
        apply_teams(engine, cfg)
        prepare_ceiling_fn(db_url)
        plain = assign.Router(engine, cfg)
        libpq = db_url.replace("postgresql+psycopg://", "postgresql://", 1)
        with (
            psycopg.connect(libpq, autocommit=True) as held,
            psycopg.connect(libpq) as ceiling_conn,
        ):
            ceiling = CeilingRouter(ceiling_conn, "bench")
            params = plain._single_params(assign.Lead("x", {}), "api")
            assert params is not None

            def call(sql: str) -> Callable[[str], None]:
                def run(crm_id: str) -> None:
                    row = held.execute(sql, {**params, "crm_id": crm_id}, prepare=True).fetchone()
                    assert row is not None and row[0] == "routed" and row[6][0] is not None, row

                return run

            def routed(router: assign.Router) -> Callable[[str], None]:
                def run(crm_id: str) -> None:
                    outcome = router.assign(assign.Lead(crm_id, {}), "api")
                    assert outcome.status == "assigned", outcome

                return run

            kinds: dict[str, Callable[[str], None]] = {
                "ceiling": ceiling.assign,
                "ceiling_fn": ceiling.assign_fn,
                "route_new_lead call": call(assign._ROUTE_LEAD),
                "assign": routed(plain),
            }
            times: dict[str, list[float]] = {k: [] for k in kinds}
            for i in range(calls + 200):  # the first 200 rounds warm up (plans, caches)
                for n, (kind, fn) in enumerate(kinds.items()):
                    crm_id = f"00Q{n}{i:012d}"
                    t = time.perf_counter()
                    fn(crm_id)
                    if i >= 200:
                        times[kind].append(time.perf_counter() - t)
        engine.dispose()
        return times
    finally:
        factory.drop_all()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=3000, help="measured calls of each kind")
    args = ap.parse_args()
    if args.calls < 1:
        ap.error("--calls must be positive")
    load_before = os.getloadavg()
    times = measure(args.calls)
    # the faster of the two ceilings, as bench.assign measures against
    base = min(statistics.median(times["ceiling"]), statistics.median(times["ceiling_fn"]))
    rows = []
    for kind, ts in times.items():
        med = statistics.median(ts)
        p90 = statistics.quantiles(ts, n=10)[-1]
        rows.append(
            {
                "kind": kind,
                "median_us": round(med * 1e6),
                "p90_us": round(p90 * 1e6),
                "ceiling_over_this": round(base / med, 3),
            }
        )
        print(
            f"{kind:<22} median {med * 1e6:>6.0f} us  p90 {p90 * 1e6:>6.0f} us  "
            f"ceiling / this {base / med:.2f}",
            flush=True,
        )
    RESULTS.mkdir(exist_ok=True)
    out = {
        "benchmark": "single",
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "database": "BENCH_DATABASE_URL" if os.environ.get("BENCH_DATABASE_URL") else "embedded",
        "calls": args.calls,
        "rows": rows,
        "load_average": {"before": load_before, "after": os.getloadavg()},
    }
    path = RESULTS / "single.json"
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
