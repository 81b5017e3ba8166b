"""Benchmark: time to first byte of the dashboard's pages with 1,000,000 stored leads.

    .venv/bin/python -m bench.dashboard [--quick] [--leads N] [--runs N] [--keep NAME]

One org, two teams of 10 reps, 1,000,000 leads received over 30 days (each with a few CRM
fields, about 150 bytes, as routed leads carry), each assigned, with its outbox row (sent
within a few seconds; 0.1 % dead, 0.5 % superseded, the newest 1,000 still pending). The
rows are generated in SQL (the routing path is measured by bench.assign), then VACUUM
ANALYZE. The admin app runs in this process (uvicorn in a thread, as under `connector run`);
each page is fetched several times over HTTP and the time to the first byte of the answer
is reported (median and p95). EXPLAIN (ANALYZE, BUFFERS) of every query the dashboard's
pages run (the totals page's are `connector status`'s, db/status.sql) is written to
bench/results/dashboard_plans.txt, and each query is then run QUERY_RUNS more times on its
own (median and fastest). Prints tables and writes bench/results/dashboard.json.

Seeding 1,000,000 leads takes minutes. With ``--keep NAME`` the data goes into the database
NAME on the server, which is kept and labelled (a database comment: seed version, lead
count): a later run with the same NAME and lead count migrates it (new migrations, e.g. an
index) and reuses the rows instead of seeding again. Without it, a
throw-away database is created and dropped.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import statistics
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from sqlalchemy import Connection, Engine, text

import db
from connector.core.config import OrgConfig
from connector.core.config_loading import parse_config
from connector.core.database import create_engine
from connector.core.metrics import Metrics
from connector.routing.teams import apply_teams
from connector.shell.admin import create_admin_app
from connector.shell.dashboard import data
from connector.shell.dashboard.figures import hour_slots, start_of_day
from connector.shell.migrations import migrate
from connector.shell.service import serve_in_thread
from connector.shell.store import make_engine, sqlalchemy_url
from testbed.harness import ENV
from testbed.pg import DatabaseFactory, server_url, with_database

RESULTS = Path(__file__).parent / "results"
ORG = "bench"
DAYS = 30


def config() -> OrgConfig:
    def team(name: str, base: int) -> str:
        members = "\n".join(
            f'      - {{crm_user_id: "005{base + i:015d}", name: "Rep {base + i}", '
            f"weight: {1 + i % 3}}}"
            for i in range(10)
        )
        return f"  - name: {name}\n    members:\n{members}\n"

    yaml = (
        "org: bench\ncrm:\n  kind: salesforce\n  instance_url: https://bench.my.salesforce.com\n"
        '  auth: {method: session, access_token: "${BENCH_TOKEN}"}\n  object: Lead\n'
        "teams:\n" + team("americas", 0) + team("emea", 100) + "rules:\n"
        "  - {team: emea, when: {Country: [DE]}}\n  - {team: americas}\n"
    )
    return parse_config(yaml, "bench.yaml", ENV)


SEED = [
    # leads: evenly over the last DAYS days, the newest now
    """
    INSERT INTO leads (org, crm_object, crm_id, fields, source, received_at)
    SELECT 'bench', 'Lead', '00Q' || lpad(g::text, 15, '0'),
           jsonb_build_object('Company', 'Company ' || g, 'Country',
                              CASE WHEN g % 4 = 0 THEN 'DE' ELSE 'US' END,
                              'Email', 'lead' || g || '@example.com', 'LeadSource', 'Web',
                              'Status', 'Open - Not Contacted', 'Title', 'Head of Operations'),
           'import',
           now() - (:n - g) * make_interval(secs => :step)
    FROM generate_series(1, :n) AS g
    """,
    # assignments: members in turn (the counts do not matter here, the row volume does)
    """
    WITH seats AS (
        SELECT m.id, m.team_id, m.crm_user_id,
               row_number() OVER (ORDER BY m.id) - 1 AS k, count(*) OVER () AS total
        FROM members m JOIN teams t ON t.id = m.team_id WHERE t.org = 'bench'
    )
    INSERT INTO assignments (lead_id, org, team_id, member_id, crm_user_id, epoch, rule_index,
                             rule_name, source, assigned_at)
    SELECT l.id, 'bench', s.team_id, s.id, s.crm_user_id, 1, 0, 'rule 1: default', 'import',
           l.received_at + interval '5 milliseconds'
    FROM leads l JOIN seats s ON s.k = l.id % s.total
    WHERE l.org = 'bench'
    """,
    # outbox: sent within 0.2-3 s; a few dead and superseded; the newest 1,000 pending
    """
    INSERT INTO outbox (org, lead_id, assignment_id, crm_object, crm_id, owner_id, state,
                        attempts, available_at, created_at, finished_at, last_error, found_owner,
                        lead_received_at)
    SELECT 'bench', a.lead_id, a.id, 'Lead', l.crm_id, a.crm_user_id, x.state,
           CASE WHEN x.state = 'pending' THEN 0 ELSE 1 END,
           a.assigned_at, a.assigned_at,
           CASE WHEN x.state = 'pending' THEN NULL
                ELSE a.assigned_at + make_interval(secs => 0.2 + (a.lead_id % 97) / 35.0) END,
           CASE WHEN x.state = 'dead' THEN 'ENTITY_IS_DELETED: entity is deleted' END,
           CASE WHEN x.state = 'superseded' THEN '005999999999999999' END,
           l.received_at
    FROM assignments a JOIN leads l ON l.id = a.lead_id
    CROSS JOIN LATERAL (SELECT CASE
        WHEN a.lead_id > :n - 1000 THEN 'pending'
        WHEN a.lead_id % 1000 = 7 THEN 'dead'
        WHEN a.lead_id % 200 = 3 THEN 'superseded'
        ELSE 'sent' END AS state) x
    WHERE a.org = 'bench'
    """,
]


def seed(engine: Engine, leads: int) -> float:
    t0 = time.perf_counter()
    step = DAYS * 86400 / leads
    with engine.begin() as conn:
        for sql in SEED:
            conn.execute(text(sql), {"n": leads, "step": step})
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE"))
    return time.perf_counter() - t0


def ttfb(base: str, path: str) -> tuple[float, int, int]:
    """Seconds from sending the request to the first byte of the answer; status; body size."""
    u = urlsplit(base)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=120)
    try:
        conn.connect()
        t0 = time.perf_counter()
        conn.request("GET", path)
        resp = conn.getresponse()  # returns once the status line has arrived
        first = time.perf_counter() - t0
        body = resp.read()
        return first, resp.status, len(body)
    finally:
        conn.close()


QUERY_RUNS = 7


def dashboard_queries(now: datetime, lead_id: int) -> list[tuple[str, str, dict[str, Any]]]:
    """(label, SQL, parameters) of every query the pages run, as the pages run them."""
    q = db.queries("dashboard")
    slots = hour_slots(now, data.LATENCY_HOURS)
    crm_id = {"org": ORG, "crm_id": "00Q000000000000001", "crm_object": "Lead"}
    params: dict[str, dict[str, Any]] = {
        "members": {"org": ORG},
        "window_counts": {"org": ORG, "since": now - timedelta(days=7)},
        "latency_buckets": {"org": ORG, "since": slots[0], "bucket": "1 hour", "origin": slots[0]},
        "outbox_depth": {"org": ORG},
        "oldest_open": {"org": ORG},
        "finished_rows": {"org": ORG, "state": "superseded", "limit": data.PROBLEM_ROWS},
        "recent_decisions": {"org": ORG, "limit": data.RECENT_DECISIONS},
        "lead": {"org": ORG, "lead_id": lead_id},
        "lead_assignment": {"lead_id": lead_id},
        "lead_outbox": {"lead_id": lead_id},
        "lead_events": crm_id,
        "lead_skipped": crm_id,
    }
    out = [(name, q[name], p) for name, p in params.items()]
    today = {"org": ORG, "since": start_of_day(now)}
    out.insert(2, ("window_counts (today)", q["window_counts"], today))
    # the totals page: `connector status` (connector/shell/status.py)
    out += [(f"status.{name}", sql, {"org": ORG}) for name, sql in db.queries("status").items()]
    return out


def on_page_terms(conn: Connection, name: str) -> Connection:
    """The dashboard's queries run with JIT off, as the org page runs them (db/dashboard.sql
    no_jit; the lead page's are far below jit_above_cost anyway); `status`'s as it runs them."""
    if not name.startswith("status."):
        conn.execute(text(db.queries("dashboard")["no_jit"]))
    return conn


def plans(engine: Engine, queries: list[tuple[str, str, dict[str, Any]]]) -> str:
    out = []
    for name, sql, p in queries:
        with engine.connect() as conn:
            on_page_terms(conn, name)
            rows = conn.execute(text("EXPLAIN (ANALYZE, BUFFERS) " + sql), p).all()
        out.append(f"-- {name}\n" + "\n".join(r[0] for r in rows) + "\n")
    return "\n".join(out)


def query_times(
    engine: Engine, queries: list[tuple[str, str, dict[str, Any]]]
) -> dict[str, dict[str, float]]:
    """Each query run QUERY_RUNS times, rows fetched: median and fastest ms (without
    EXPLAIN's per-node clock reads)."""
    times: dict[str, dict[str, float]] = {}
    for name, sql, p in queries:
        samples = []
        with engine.connect() as conn:
            on_page_terms(conn, name)
            for _ in range(QUERY_RUNS):
                t0 = time.perf_counter()
                conn.execute(text(sql), p).all()
                samples.append((time.perf_counter() - t0) * 1000)
        median, fastest = statistics.median(samples), min(samples)
        times[name] = {"median": round(median, 2), "min": round(fastest, 2)}
        print(
            f"  {name:<24} median {times[name]['median']:>8.2f} ms  min "
            f"{times[name]['min']:>8.2f} ms",
            flush=True,
        )
    return times


SEED_VERSION = 3  # bump when SEED changes: a kept database of another version is re-seeded


def seed_label(leads: int) -> str:
    return f"bench.dashboard seed {SEED_VERSION}: {leads} leads"


def kept_database(url: str, name: str, leads: int) -> tuple[str, bool]:
    """The URL of the kept database NAME, and whether it already holds this seed of
    ``leads`` leads (its comment says so; it is then migrated and reused). Otherwise it is
    (re)created empty and migrated; ``label_kept`` marks it once seeded."""
    if not name.isidentifier() or not name.islower():
        raise SystemExit(f"--keep: {name!r} is not a plain lower-case database name")
    admin = create_engine(sqlalchemy_url(url), isolation_level="AUTOCOMMIT", pool_size=1)
    target = with_database(url, name)
    try:
        with admin.connect() as conn:
            label = conn.execute(
                text(
                    "SELECT coalesce(shobj_description(oid, 'pg_database'), '') "
                    "FROM pg_database WHERE datname = :n"
                ),
                {"n": name},
            ).scalar()
        if label == seed_label(leads):
            engine = make_engine(target, pool_size=1)
            migrate(engine)
            engine.dispose()
            return target, True
        if label is not None:
            print(f"{name} holds {label or 'something else'!r}: seeding it again", flush=True)
        with admin.connect() as conn:
            conn.execute(text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
            conn.execute(text(f"CREATE DATABASE {name}"))
        engine = make_engine(target, pool_size=1)
        migrate(engine)
        engine.dispose()
        return target, False
    finally:
        admin.dispose()


def label_kept(url: str, name: str, leads: int) -> None:
    admin = create_engine(sqlalchemy_url(url), isolation_level="AUTOCOMMIT", pool_size=1)
    try:
        with admin.connect() as conn:
            # the name was checked by kept_database; a comment takes no bind parameter
            conn.execute(text(f"COMMENT ON DATABASE {name} IS '{seed_label(leads)}'"))
    finally:
        admin.dispose()


def p95(samples: list[float]) -> float:
    """The 95th percentile (linear interpolation between the closest ranks)."""
    if len(samples) < 2:
        return samples[0]
    return statistics.quantiles(samples, n=20, method="inclusive")[18]


def measure(base: str, label: str, path: str, runs: int) -> dict[str, Any]:
    ttfb(base, path)  # warm: connections, plans, templates
    samples = []
    for _ in range(runs):
        first, status, size = ttfb(base, path)
        assert status == 200, (path, status)
        samples.append(first)
    row = {
        "page": label,
        "path": path,
        "runs": len(samples),
        "ttfb_ms_median": round(statistics.median(samples) * 1000, 1),
        "ttfb_ms_p95": round(p95(samples) * 1000, 1),
        "ttfb_ms_min": round(min(samples) * 1000, 1),
        "ttfb_ms_max": round(max(samples) * 1000, 1),
        "bytes": size,
    }
    print(
        f"{label:<28} median {row['ttfb_ms_median']:>8.1f} ms  p95 {row['ttfb_ms_p95']:>8.1f} ms"
        f"  min {row['ttfb_ms_min']:>8.1f} ms  max {row['ttfb_ms_max']:>8.1f} ms"
        f"  {size:>7,} bytes",
        flush=True,
    )
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="100,000 leads (a smoke run)")
    ap.add_argument("--leads", type=int, default=None)
    ap.add_argument("--runs", type=int, default=20, help="requests per page (after one warm-up)")
    ap.add_argument(
        "--keep",
        metavar="NAME",
        help="seed into the database NAME and keep it; reuse it when it holds the same leads",
    )
    args = ap.parse_args()
    leads = args.leads or (100_000 if args.quick else 1_000_000)
    url = os.environ.get("BENCH_DATABASE_URL") or server_url()
    t_start = time.time()
    load_start = os.getloadavg()
    factory = None if args.keep else DatabaseFactory(url)
    try:
        if args.keep:
            target, reused = kept_database(url, args.keep, leads)
        else:
            assert factory is not None
            target, reused = factory.new(), False
        engine = make_engine(target, pool_size=4)
        cfg = config()
        apply_teams(engine, cfg)
        if reused:
            seeded = None
            with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                conn.execute(text("VACUUM ANALYZE"))  # cheap when nothing changed
            print(f"reused {args.keep} ({leads:,} leads)", flush=True)
        else:
            seeded = seed(engine, leads)
            if args.keep:
                label_kept(url, args.keep, leads)
            print(f"seeded {leads:,} leads (+ assignments, outbox) in {seeded:.1f} s", flush=True)
        app = create_admin_app(engine, Metrics(), configs={ORG: cfg})
        lead_id = leads // 2
        pages = {
            "org (main page)": f"/dashboard/org/{ORG}",
            "lead (explanation)": f"/dashboard/org/{ORG}/lead/{lead_id}",
            "totals (= connector status)": f"/dashboard/org/{ORG}/totals",
            "index": "/dashboard/",
        }
        with serve_in_thread(app) as base:
            rows = [measure(base, label, path, args.runs) for label, path in pages.items()]
        queries = dashboard_queries(datetime.now(UTC), lead_id)
        plan_text = plans(engine, queries)
        print(f"each query alone ({QUERY_RUNS} runs):", flush=True)
        timings = query_times(engine, queries)
        engine.dispose()
    finally:
        if factory is not None:
            factory.drop_all()
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "dashboard_plans.txt").write_text(plan_text)
    big = ("leads", "assignments", "outbox")  # teams, members: a few rows; read whole
    seq = [
        ln.strip()
        for ln in plan_text.splitlines()
        if "Seq Scan" in ln and any(f" on {t} " in ln for t in big)
    ]
    print("sequential scans of leads/assignments/outbox:", "none" if not seq else "; ".join(seq))
    load = os.getloadavg()
    out = {
        "benchmark": "dashboard",
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "loadavg_at_start": [round(x, 1) for x in load_start],
            "loadavg_at_end": [round(x, 1) for x in load],
        },
        "database": "BENCH_DATABASE_URL" if os.environ.get("BENCH_DATABASE_URL") else "embedded",
        "kept_database": args.keep,
        "leads": leads,
        "seed_seconds": round(seeded, 1) if seeded is not None else None,
        "rows": rows,
        "query_ms": timings,
        "seq_scans": seq,
        "seconds_total": round(time.time() - t_start, 1),
    }
    path = RESULTS / "dashboard.json"
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"load average at the end: {load[0]:.1f}; wrote {path} and dashboard_plans.txt")


if __name__ == "__main__":
    main()
