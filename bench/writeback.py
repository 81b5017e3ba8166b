"""Benchmark: CRM write-back, naive per-record parallel writes vs the outbox dispatcher.

    .venv/bin/python -m bench.writeback [--quick] [--records N] [--crm salesforce|hubspot]
                                        [--skip-naive]

Salesforce: N Contacts over 50 Accounts, one Account holding 30% of them, on the Salesforce
sandbox with its lock model (lock wait scaled down from 10 s to LOCK_WAIT_S so a run takes
seconds). Naive: 16 threads, one PATCH per record, up to 3 retries on UNABLE_TO_LOCK_ROW.
Dispatcher: the leads are assigned in Postgres, then 2 dispatchers drain the outbox; each
write request is preceded by one read of its records' current owners (DispatchStats.reads).
HubSpot: the same Contacts on the HubSpot sandbox under its 100-per-10-s limit; naive sends
one-record batch updates from 16 threads (bounded by a time budget), the dispatcher sends
100-record batches. Writes bench/results/writeback.json.

Every dispatcher write request is logged on the client side (``Recorder``): its size, which
dispatcher sent it and how many other requests were in flight, and any parent that two
requests in flight at the same time both carried (an overlap; the client's interval of a
request contains the server's, so none seen here means none on the server). The run prints
the count against ceil(N / max_batch) and every request that was not full.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import platform
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import requests

from connector.routing.assign import Lead, Router
from connector.routing.teams import apply_teams
from connector.shell.adapters import adapter_for
from connector.shell.store import make_engine
from connector.writeback.dispatch import Dispatcher
from connector.writeback.stats import DispatchStats
from crm_adapters.base import CrmAdapter, CrmRecord, OwnerWrite, WriteOutcome
from crm_sandboxes import HubSpotSandbox, SalesforceSandbox
from testbed.crm_orgs import hubspot_org, salesforce_org
from testbed.pg import DatabaseFactory, server_url

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


@dataclass(frozen=True)
class SentRequest:
    """One write request as a dispatcher sent it."""

    dispatcher: int
    size: int
    others_in_flight: int  # write requests of any dispatcher in flight when it started


# request_log in the JSON: [dispatcher, size, others in flight] per write request, in order


@dataclass
class Recorder:
    """The write requests of one run, in the order they started, and parent overlaps (the
    JSON's ``request_log``: [dispatcher, size, others in flight] per request, in order)."""

    requests: list[SentRequest] = field(default_factory=list)
    overlaps: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _seq: Iterator[int] = field(default_factory=itertools.count)
    _in_flight: dict[int, frozenset[str]] = field(default_factory=dict)

    def start(self, dispatcher: int, batch: Sequence[OwnerWrite]) -> int:
        parents = frozenset(w.parent_id for w in batch if w.parent_id)
        with self._lock:
            seq = next(self._seq)
            for held in self._in_flight.values():
                self.overlaps += sorted(parents & held)
            self.requests.append(SentRequest(dispatcher, len(batch), len(self._in_flight)))
            self._in_flight[seq] = parents
            return seq

    def end(self, seq: int) -> None:
        with self._lock:
            del self._in_flight[seq]

    def partial(self, max_batch: int) -> list[dict[str, int]]:
        """Every request that was not full: its position, dispatcher, size, others in flight."""
        return [
            {"n": i + 1, "dispatcher": r.dispatcher, "size": r.size, "others": r.others_in_flight}
            for i, r in enumerate(self.requests)
            if r.size < max_batch
        ]


class RecordingAdapter:
    """A CrmAdapter that tells a Recorder about every write request of one dispatcher."""

    def __init__(self, inner: CrmAdapter, recorder: Recorder, dispatcher: int) -> None:
        self.inner = inner
        self.recorder = recorder
        self.dispatcher = dispatcher
        self.kind = inner.kind
        self.max_batch = inner.max_batch
        self.owner_field = inner.owner_field

    def write_owners(self, batch: Sequence[OwnerWrite]) -> list[WriteOutcome]:
        seq = self.recorder.start(self.dispatcher, batch)
        try:
            return self.inner.write_owners(batch)
        finally:
            self.recorder.end(seq)

    def changed_since(
        self, since: datetime, until: datetime | None = None, page_size: int = 200
    ) -> Iterator[list[CrmRecord]]:
        return self.inner.changed_since(since, until, page_size)

    def fetch_records(self, ids: Sequence[str], fields: Sequence[str]) -> list[CrmRecord]:
        return self.inner.fetch_records(ids, fields)

    def check_owners(self, owner_ids: Sequence[str]) -> dict[str, str | None]:
        return self.inner.check_owners(owner_ids)

    def usage(self) -> dict[str, object]:
        return self.inner.usage()


def drain(
    engine: Any, cfg: Any, dispatchers: int, recorder: Recorder
) -> tuple[float, DispatchStats]:
    total = DispatchStats()
    lock = threading.Lock()

    def one(i: int) -> None:
        adapter = RecordingAdapter(adapter_for(cfg), recorder, i)
        s = Dispatcher(engine, cfg.org, adapter, intake_owner_ids=cfg.intake_owner_ids).drain(
            timeout=900
        )
        with lock:
            total.add(s)

    t0 = time.perf_counter()
    ts = [threading.Thread(target=one, args=(i,)) for i in range(dispatchers)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return time.perf_counter() - t0, total


def salesforce(factory: DatabaseFactory, n: int, naive: bool = True) -> dict[str, Any]:
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

        if naive:  # one PATCH per record, 16 threads, 3 retries on lock errors
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
        recorder = Recorder()
        seconds, d = drain(engine, cfg, DISPATCHERS, recorder)
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
            "ratio_to_minimum": round(d.requests / math.ceil(n / 200), 3),
            "parent_overlaps": len(recorder.overlaps),
            "requests_by_dispatcher": {
                str(i): sum(1 for r in recorder.requests if r.dispatcher == i)
                for i in range(DISPATCHERS)
            },
            "partial_requests": recorder.partial(200),
            "request_log": [[r.dispatcher, r.size, r.others_in_flight] for r in recorder.requests],
        }
        engine.dispose()
        print(
            f"salesforce dispatcher {n} records: {d.requests} write requests "
            f"(minimum {math.ceil(n / 200)}, {d.requests / math.ceil(n / 200):.3f}x), "
            f"{d.reads} owner reads, {c['total_calls'] - calls_before} CRM calls, "
            f"{c.get('lock_errors', 0)} lock errors, {len(recorder.overlaps)} parent overlaps, "
            f"{d.retried} retries, {d.dead} dead, {seconds:.1f} s",
            flush=True,
        )
        print(
            f"  requests not full (n-th request, dispatcher, size, others in flight): "
            f"{recorder.partial(200)}",
            flush=True,
        )
    if naive:
        out["speedup"] = round(out["naive"]["seconds"] / max(out["dispatcher"]["seconds"], 1e-9), 1)
    return out


def hubspot_naive(hs: HubSpotSandbox, n: int, naive_budget_s: float) -> dict[str, Any]:
    """One-record batch updates from NAIVE_THREADS threads, for a time budget."""
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
    out = {
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
    return out


def hubspot(
    factory: DatabaseFactory, n: int, naive_budget_s: float, naive: bool = True
) -> dict[str, Any]:
    out: dict[str, Any] = {"records": n, "limit_per_10s": 100}
    with HubSpotSandbox(limit_per_10s=100) as hs:
        hs.start()
        if naive:
            out["naive"] = hubspot_naive(hs, n, naive_budget_s)
            hs.reset()
        owners = [hs.add_owner(f"Rep{i}") for i in range(8)]
        ids = [hs.add_record("contacts") for _ in range(n)]
        engine = make_engine(factory.new())
        cfg = hubspot_org(hs, owners, org="bench_hs", limit_per_10s=100)
        apply_teams(engine, cfg)
        router = Router(engine, cfg)
        for i in range(0, n, 1000):
            router.assign_many([Lead(r, {}) for r in ids[i : i + 1000]], "import")
        recorder = Recorder()
        seconds, d = drain(engine, cfg, DISPATCHERS, recorder)
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
            "ratio_to_minimum": round(d.requests / requests_needed, 3),
            "partial_requests": recorder.partial(100),
            "request_log": [[r.dispatcher, r.size, r.others_in_flight] for r in recorder.requests],
        }
        engine.dispose()
        print(
            f"hubspot dispatcher    {n} records: {d.requests} write requests "
            f"(minimum {requests_needed}, {d.requests / requests_needed:.3f}x), "
            f"{d.reads} owner reads, "
            f"{c.get('rate_limited', 0)} x 429, {d.dead} dead, "
            f"{seconds:.1f} s (theoretical minimum {windows * 10.0:.0f} s + request time)",
            flush=True,
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="2,000 records instead of 10,000")
    ap.add_argument("--records", type=int, help="this many records (overrides --quick)")
    ap.add_argument("--crm", choices=["salesforce", "hubspot"], help="only this CRM")
    ap.add_argument("--skip-naive", action="store_true", help="only the dispatcher")
    args = ap.parse_args()
    n = args.records or (2000 if args.quick else 10_000)
    naive = not args.skip_naive
    url = os.environ.get("BENCH_DATABASE_URL") or server_url()
    factory = DatabaseFactory(url)
    t0 = time.time()
    try:
        result: dict[str, Any] = {
            "benchmark": "writeback",
            "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
            "quick": args.quick,
            "records": n,
            "naive": naive,
        }
        if args.crm in (None, "salesforce"):
            result["salesforce"] = salesforce(factory, n, naive)
        if args.crm in (None, "hubspot"):
            budget = 15 if n <= 2000 else 30
            result["hubspot"] = hubspot(factory, n, naive_budget_s=budget, naive=naive)
    finally:
        factory.drop_all()
    result["seconds_total"] = round(time.time() - t0, 1)
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / "writeback.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    speedup = result.get("salesforce", {}).get("speedup")
    if speedup is not None:
        print(f"salesforce speedup vs naive: {speedup}x")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
