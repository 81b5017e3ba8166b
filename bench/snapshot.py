"""Benchmark: sustained ingest and dispatch while one transaction holds its snapshot open.

    .venv/bin/python -m bench.snapshot [--minutes 10] [--no-hold] [--interval 60]

A snapshot held open (a long report, a forgotten BEGIN in a psql session) stops VACUUM from
removing the row versions that every queue update leaves behind, so the heads of the queue
tables (intake_events, outbox) fill with dead rows that each claim has to step over. This
bench runs the connector's whole pipeline in one process against one database: a producer
stores pushes in the intake inbox (as the receivers do, with a bounded backlog), the inbox
worker reads each record back from an in-memory CRM (crm_adapters.memory, no network) and
routes it, and 2 dispatchers write the owners back. A second connection opens a REPEATABLE
READ transaction at the start and holds it for the whole run (unless --no-hold). Every
interval it prints the leads routed and owner writes sent in that interval; the last
interval's rate over the first one's is the loss. Writes bench/results/snapshot[-nohold].json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import threading
import time
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, text

from connector.core.config import OrgConfig
from connector.core.config_loading import parse_config
from connector.core.metrics import Metrics
from connector.intake.inbox import InboxWorker, store_events
from connector.routing.assign import Router
from connector.routing.teams import apply_teams
from connector.shell.store import make_engine
from connector.writeback.dispatch import Dispatcher
from crm_adapters.memory import MemoryCrm
from testbed.pg import DatabaseFactory, server_url

RESULTS = Path(__file__).parent / "results"
INTAKE = "005000000000000AAA"
BACKLOG = 2000  # the producer waits while this many pushes are pending
BATCH = 50


def org_config(rep_ids: list[str]) -> OrgConfig:
    reps = "\n".join(
        f'      - {{crm_user_id: "{uid}", name: "Rep {i}"}}' for i, uid in enumerate(rep_ids)
    )
    return parse_config(
        f"""
org: snap
crm:
  kind: salesforce
  instance_url: https://snap.my.salesforce.com
  auth: {{method: session, access_token: "${{TOKEN}}"}}
  object: Contact
intake_owner_ids: ["{INTAKE}"]
teams:
  - name: all
    members:
{reps}
rules:
  - {{team: all}}
""",
        "snap.yaml",
        {"TOKEN": "unused"},
    )


def counts(engine: Engine) -> tuple[int, int]:
    with engine.connect() as conn:
        row = conn.execute(
            text(
                "SELECT (SELECT count(*) FROM assignments) AS routed,"
                " (SELECT count(*) FROM outbox WHERE state = 'sent') AS sent"
            )
        ).one()
    return int(row.routed), int(row.sent)


def routed_so_far(engine: Engine) -> int:
    """Leads inserted so far, from their id sequence. (The producer used to count the pending
    events, a scan that, with the snapshot held, read every dead version at the head of the
    inbox: up to half the database's active time in the held runs, which no real producer
    spends. Every pushed record here is new, so each routed event is one lead.)"""
    with engine.connect() as conn:
        return int(
            conn.execute(
                text("SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM leads_id_seq")
            ).scalar_one()
        )


def produce(engine: Engine, cfg: OrgConfig, crm: MemoryCrm, worker: InboxWorker,
            parents: list[str], stop: threading.Event) -> None:  # fmt: skip
    n = 0
    while not stop.is_set():
        if n - routed_so_far(engine) > BACKLOG:  # pushed and not yet routed
            stop.wait(0.05)
            continue
        ids = [
            crm.add_record(owner_id=INTAKE, parent_id=parents[(n + i) % len(parents)])
            for i in range(BATCH)
        ]
        with engine.begin() as conn:
            store_events(conn, cfg, [f"ev-{n + i}" for i in range(BATCH)], ids)
        n += BATCH
        worker.wake()


def hold_snapshot(engine: Engine, ready: threading.Event, stop: threading.Event) -> None:
    with engine.connect() as conn:
        conn.execute(text("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ"))
        conn.execute(text("SELECT count(*) FROM leads")).scalar_one()  # takes the snapshot
        ready.set()
        stop.wait()
        conn.rollback()


def table_sizes(engine: Engine) -> dict[str, Any]:
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT relname, n_live_tup, n_dead_tup,"
                " pg_total_relation_size(relid) AS bytes"
                " FROM pg_stat_user_tables WHERE relname IN ('intake_events', 'outbox')"
            )
        ).all()
    return {r.relname: {"live": r.n_live_tup, "dead": r.n_dead_tup, "bytes": r.bytes} for r in rows}


def run(minutes: float, interval: float, hold: bool) -> dict[str, Any]:
    url = os.environ.get("BENCH_DATABASE_URL") or server_url()
    factory = DatabaseFactory(url)
    stop = threading.Event()
    try:
        db_url = factory.new()
        engine = make_engine(db_url, pool_size=8)
        crm = MemoryCrm("salesforce")
        cfg = org_config([crm.add_user() for _ in range(10)])
        apply_teams(engine, cfg)
        parents = [crm.add_parent() for _ in range(300)]
        router = Router(engine, cfg)
        worker = InboxWorker(
            engine, {cfg.org: cfg}, {cfg.org: router}, lambda org: crm, Metrics(engine)
        )
        dispatchers = [
            Dispatcher(engine, cfg.org, crm, intake_owner_ids=[INTAKE]) for _ in range(2)
        ]
        threads = [threading.Thread(target=d.run_forever, args=(stop,)) for d in dispatchers]
        held = threading.Event()
        holder_stop = threading.Event()
        if hold:
            holder = threading.Thread(target=hold_snapshot, args=(engine, held, holder_stop))
            holder.start()
            held.wait()
        worker.start()
        for t in threads:
            t.start()
        producer = threading.Thread(
            target=produce, args=(engine, cfg, crm, worker, parents, stop), daemon=True
        )
        producer.start()
        rows: list[dict[str, Any]] = []
        last = counts(engine)
        t0 = time.monotonic()
        for k in range(1, int(minutes * 60 / interval) + 1):
            time.sleep(max(0.0, t0 + k * interval - time.monotonic()))
            now = counts(engine)
            row = {
                "t_s": round(time.monotonic() - t0),
                "routed_per_s": round((now[0] - last[0]) / interval, 1),
                "sent_per_s": round((now[1] - last[1]) / interval, 1),
                **{f"{t}_{k2}": v for t, d in table_sizes(engine).items() for k2, v in d.items()},
            }
            rows.append(row)
            print(
                f"t={row['t_s']:>5}s  routed {row['routed_per_s']:>7.1f}/s  "
                f"sent {row['sent_per_s']:>7.1f}/s  "
                f"dead tuples: inbox {row.get('intake_events_dead', 0):>8,} "
                f"outbox {row.get('outbox_dead', 0):>8,}",
                flush=True,
            )
            last = now
        stop.set()
        holder_stop.set()
        worker.stop()
        for t in threads:
            t.join(timeout=30)
        engine.dispose()
    finally:
        stop.set()
        factory.drop_all()
    first, final = rows[0], rows[-1]
    loss = {
        "routed": round(first["routed_per_s"] / max(final["routed_per_s"], 0.1), 2),
        "sent": round(first["sent_per_s"] / max(final["sent_per_s"], 0.1), 2),
    }
    return {"rows": rows, "loss_first_over_last": loss}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--interval", type=float, default=60.0, help="seconds per printed row")
    ap.add_argument("--no-hold", action="store_true", help="the control run: no held snapshot")
    args = ap.parse_args()
    hold = not args.no_hold
    print(f"{'holding' if hold else 'not holding'} a snapshot for {args.minutes:g} minutes")
    result = run(args.minutes, args.interval, hold)
    loss = result["loss_first_over_last"]
    print(f"first interval / last interval: routed {loss['routed']}x, sent {loss['sent']}x")
    RESULTS.mkdir(exist_ok=True)
    out = {
        "benchmark": "snapshot",
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "database": "BENCH_DATABASE_URL" if os.environ.get("BENCH_DATABASE_URL") else "embedded",
        "held_snapshot": hold,
        "minutes": args.minutes,
        "interval_s": args.interval,
        **result,
    }
    path = RESULTS / ("snapshot.json" if hold else "snapshot-nohold.json")
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
