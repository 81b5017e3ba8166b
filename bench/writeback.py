"""Benchmark: CRM write-back, naive per-record parallel writes vs the outbox dispatcher.

    .venv/bin/python -m bench.writeback [--quick]

Salesforce: N Contacts over 50 Accounts, one Account holding 30% of them, on the Salesforce
sandbox with its lock model (lock wait scaled down from 10 s to LOCK_WAIT_S so a run takes
seconds). Naive: 16 threads, one PATCH per record, up to 3 retries on UNABLE_TO_LOCK_ROW.
Dispatcher: the leads are assigned in Postgres, then 2 dispatchers drain the outbox; each
write request is preceded by one read of its records' current owners (DispatchStats.reads).
HubSpot: the same Contacts on the HubSpot sandbox under its 100-per-10-s limit; naive sends
one-record batch updates from 16 threads (bounded by a time budget), the dispatcher sends
100-record batches. Writes bench/results/writeback.json.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import requests

from connector.routing.assign import Lead, Router
from connector.routing.teams import apply_teams
from connector.shell.adapters import adapter_for
from connector.shell.store import make_engine
from connector.writeback.dispatch import Dispatcher, DispatchStats
from crm_sandboxes import HubSpotSandbox, SalesforceSandbox
from tests.crm_orgs import hubspot_org, salesforce_org
from tests.pg import DatabaseFactory, server_url

RESULTS = Path(__file__).parent / "results"
# Time scaled by 1/50 from a busy production org: 10 s lock wait, about 1 s per save for the
# triggers, flows and Account roll-ups, 25 ms per record on top.
LOCK_WAIT_S = 0.2
REQUEST_WORK_MS = 20.0
RECORD_WORK_MS = 0.5
NAIVE_THREADS = 16
DISPATCHERS = 2  # the default of `connector dispatch` and `connector run`


def skewed_accounts(n: int, accounts: list[str]) -> list[str]:
    """30% of the records on the first Account, the rest spread over the others."""
    heavy = int(n * 0.3)
    rest = accounts[1:]
    return [accounts[0]] * heavy + [rest[i % len(rest)] for i in range(n - heavy)]


def run_threads(items: list[Any], work: Callable[[Any], None], threads: int) -> float:
    lock = threading.Lock()
    queue = list(reversed(items))

    def loop() -> None:
        while True:
            with lock:
                if not queue:
                    return
                item = queue.pop()
            work(item)

    t0 = time.perf_counter()
    ts = [threading.Thread(target=loop) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return time.perf_counter() - t0


def drain(engine: Any, cfg: Any, dispatchers: int) -> tuple[float, DispatchStats]:
    total = DispatchStats()
    lock = threading.Lock()

    def one() -> None:
        s = Dispatcher(
            engine, cfg.org, adapter_for(cfg), intake_owner_ids=cfg.intake_owner_ids
        ).drain(timeout=900)
        with lock:
            total.add(s)

    t0 = time.perf_counter()
    ts = [threading.Thread(target=one) for _ in range(dispatchers)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return time.perf_counter() - t0, total


def salesforce(factory: DatabaseFactory, n: int) -> dict[str, Any]:
    out: dict[str, Any] = {
        "records": n,
        "accounts": 50,
        "heaviest_account_share": 0.3,
        "lock_wait_s": LOCK_WAIT_S,
        "record_work_ms": RECORD_WORK_MS,
        "request_work_ms": REQUEST_WORK_MS,
    }
    with SalesforceSandbox(
        lock_wait_s=LOCK_WAIT_S, record_work_ms=RECORD_WORK_MS, request_work_ms=REQUEST_WORK_MS
    ) as sf:
        sf.start()
        reps = [sf.add_user(f"Rep {i}") for i in range(8)]
        accts = [sf.add_account() for _ in range(50)]
        parents = skewed_accounts(n, accts)

        # naive: one PATCH per record, 16 threads, 3 retries on lock errors
        naive_ids = [sf.add_record("Contact", account_id=a) for a in parents]
        stats = {"calls": 0, "lock_errors": 0, "retries": 0, "failed": 0}
        slock = threading.Lock()
        session_local = threading.local()

        def patch(i_rid: tuple[int, str]) -> None:
            i, rid = i_rid
            s = getattr(session_local, "s", None) or requests.Session()
            session_local.s = s
            for attempt in range(4):
                r = s.patch(
                    f"{sf.url}/services/data/v62.0/sobjects/Contact/{rid}",
                    json={"OwnerId": reps[i % len(reps)]},
                    headers={"Authorization": f"Bearer {sf.session_token}"},
                    timeout=30,
                )
                with slock:
                    stats["calls"] += 1
                if r.status_code < 300:
                    return
                locked = "UNABLE_TO_LOCK_ROW" in r.text
                with slock:
                    stats["lock_errors"] += locked
                if not locked or attempt == 3:
                    with slock:
                        stats["failed"] += 1
                    return
                with slock:
                    stats["retries"] += 1

        seconds = run_threads(list(enumerate(naive_ids)), patch, NAIVE_THREADS)
        out["naive"] = {**stats, "seconds": round(seconds, 2)}
        print(
            f"salesforce naive      {n} records: {stats['calls']} calls, "
            f"{stats['lock_errors']} lock errors, {stats['retries']} retries, "
            f"{stats['failed']} terminal failures, {seconds:.1f} s",
            flush=True,
        )

        # the connector: assign in Postgres, then dispatch
        sf.reset()
        reps = [sf.add_user(f"Rep {i}") for i in range(8)]
        accts = [sf.add_account() for _ in range(50)]
        parents = skewed_accounts(n, accts)
        ids = [sf.add_record("Contact", account_id=a) for a in parents]
        engine = make_engine(factory.new())
        cfg = salesforce_org(sf, reps, org="bench_sf")
        apply_teams(engine, cfg)
        router = Router(engine, cfg)
        for i in range(0, n, 1000):
            router.assign_many(
                [
                    Lead(r, {"AccountId": a})
                    for r, a in zip(ids[i : i + 1000], parents[i : i + 1000], strict=True)
                ],
                "import",
            )
        before = sf.counters()
        calls_before = before["total_calls"]
        seconds, d = drain(engine, cfg, DISPATCHERS)
        c = sf.counters()
        by_endpoint = {
            k: v - before["calls"].get(k, 0)
            for k, v in c["calls"].items()
            if v - before["calls"].get(k, 0)
        }
        wrong = sum(1 for rid in ids if not sf.get_record(rid)["OwnerId"])  # type: ignore[index]
        out["dispatcher"] = {
            "calls": c["total_calls"] - calls_before,
            "calls_by_endpoint": by_endpoint,
            "write_requests": d.requests,
            "owner_reads": d.reads,
            "superseded": d.superseded,
            "lock_errors": c.get("lock_errors", 0),
            "retried": d.retried,
            "dead": d.dead,
            "sent": d.sent,
            "records_without_owner": wrong,
            "seconds": round(seconds, 2),
            "batch_minimum": math.ceil(n / 200),
        }
        engine.dispose()
        print(
            f"salesforce dispatcher {n} records: {d.requests} write requests "
            f"(minimum {math.ceil(n / 200)}), {d.reads} owner reads, "
            f"{c['total_calls'] - calls_before} CRM calls, {c.get('lock_errors', 0)} lock errors, "
            f"{d.retried} retries, {d.dead} dead, {seconds:.1f} s",
            flush=True,
        )
    out["speedup"] = round(out["naive"]["seconds"] / max(out["dispatcher"]["seconds"], 1e-9), 1)
    return out


def hubspot(factory: DatabaseFactory, n: int, naive_budget_s: float) -> dict[str, Any]:
    out: dict[str, Any] = {"records": n, "limit_per_10s": 100}
    with HubSpotSandbox(limit_per_10s=100) as hs:
        hs.start()
        owners = [hs.add_owner(f"Rep{i}") for i in range(8)]
        naive_ids = [hs.add_record("contacts") for _ in range(n)]
        stats = {"calls": 0, "429": 0, "done": 0}
        slock = threading.Lock()
        deadline = time.perf_counter() + naive_budget_s
        url = f"{hs.url}/crm/v3/objects/contacts/batch/update"

        def one(i_rid: tuple[int, str]) -> None:
            i, rid = i_rid
            while time.perf_counter() < deadline:
                r = requests.post(
                    url,
                    json={
                        "inputs": [
                            {"id": rid, "properties": {"hubspot_owner_id": owners[i % len(owners)]}}
                        ]
                    },
                    headers={"Authorization": f"Bearer {hs.access_token}"},
                    timeout=30,
                )
                with slock:
                    stats["calls"] += 1
                if r.status_code == 429:
                    with slock:
                        stats["429"] += 1
                    time.sleep(0.2)
                    continue
                with slock:
                    stats["done"] += 1
                return

        seconds = run_threads(list(enumerate(naive_ids)), one, NAIVE_THREADS)
        rate = stats["done"] / seconds if seconds else 0.0
        out["naive"] = {
            **stats,
            "seconds": round(seconds, 2),
            "budget_s": naive_budget_s,
            "records_per_s": round(rate, 1),
            "projected_seconds_for_all": round(n / rate, 1) if rate else None,
        }
        print(
            f"hubspot naive         {stats['done']}/{n} records in {seconds:.1f} s "
            f"(budget {naive_budget_s:.0f} s): {stats['calls']} calls, {stats['429']} x 429",
            flush=True,
        )

        hs.reset()
        owners = [hs.add_owner(f"Rep{i}") for i in range(8)]
        ids = [hs.add_record("contacts") for _ in range(n)]
        engine = make_engine(factory.new())
        cfg = hubspot_org(hs, owners, org="bench_hs", limit_per_10s=100)
        apply_teams(engine, cfg)
        router = Router(engine, cfg)
        for i in range(0, n, 1000):
            router.assign_many([Lead(r, {}) for r in ids[i : i + 1000]], "import")
        seconds, d = drain(engine, cfg, DISPATCHERS)
        c = hs.counters()
        requests_needed = math.ceil(n / 100)
        # each write request is preceded by one owner read: 2 calls per 100 records
        windows = math.ceil(2 * requests_needed / 100) - 1
        out["dispatcher"] = {
            "calls_by_endpoint": c["calls"],
            "write_requests": d.requests,
            "owner_reads": d.reads,
            "superseded": d.superseded,
            "429": c.get("rate_limited", 0),
            "dead": d.dead,
            "sent": d.sent,
            "seconds": round(seconds, 2),
            "theoretical_minimum_s": windows * 10.0,
            "batch_minimum": requests_needed,
        }
        engine.dispose()
        print(
            f"hubspot dispatcher    {n} records: {d.requests} write requests "
            f"(minimum {requests_needed}), {d.reads} owner reads, "
            f"{c.get('rate_limited', 0)} x 429, {d.dead} dead, "
            f"{seconds:.1f} s (theoretical minimum {windows * 10.0:.0f} s + request time)",
            flush=True,
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    n = 2000 if args.quick else 10_000
    url = os.environ.get("BENCH_DATABASE_URL") or server_url()
    factory = DatabaseFactory(url)
    t0 = time.time()
    try:
        result = {
            "benchmark": "writeback",
            "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
            "quick": args.quick,
            "salesforce": salesforce(factory, n),
            "hubspot": hubspot(factory, n, naive_budget_s=15 if args.quick else 30),
        }
    finally:
        factory.drop_all()
    result["seconds_total"] = round(time.time() - t0, 1)
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / "writeback.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"salesforce speedup vs naive: {result['salesforce']['speedup']}x; wrote {path}")


if __name__ == "__main__":
    main()
