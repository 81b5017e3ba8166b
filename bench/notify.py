"""Benchmark: rep notifications from assignment to Slack's acceptance.

    .venv/bin/python -m bench.notify [--rate 200] [--seconds 15] [--reps 10]
                                     [--one-channel-seconds 30] [--one-channel-rate 20]

One fresh database (the embedded PostgreSQL, or BENCH_DATABASE_URL), one Salesforce team,
notifications on for Slack only, and the Slack simulator (crm_sandboxes/slack.py) with its
default limit, Slack's own for chat.postMessage: about one message per second per channel,
a burst of 3. Leads are routed by ``Router.assign_many`` on a schedule of ``--rate`` leads a
second (a batch every 50 ms, from 4 threads); two notification dispatchers
(connector/notify/dispatch.py, defaults: claims of 200, 0.5 s between idle polls, one Pace
as `connector run` gives them) send what routing queued.

* ``spread``: ``--reps`` reps share the leads (each rep's direct message is one channel).
* ``one_channel``: every lead to one rep, ``--one-channel-rate`` a second: how many messages a
  minute one channel takes, and the grouping beyond it (leads a message).

For each lead: from its notification row's created_at (the routing transaction's now()) to
the simulator's acceptance of the first message that names it. Prints p50/p99/max, messages,
leads a message and messages a minute a channel, and writes bench/results/notify.json with
the load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import threading
import time
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, text

from connector.notify.dispatch import NotifyDispatcher, Pace
from connector.notify.settings import apply_notify_settings
from connector.routing.assign import Lead, Router
from connector.routing.teams import apply_teams
from connector.shell.store import make_engine
from crm_sandboxes.slack import SlackSandbox
from testbed.notify_org import contacts_of, many_reps, members_of, notify_cfg
from testbed.pg import DatabaseFactory, server_url

RESULTS = Path(__file__).parent / "results"
LINK = re.compile(r"/lightning/r/Lead/(00Q[A-Za-z0-9]+)/view")


def produce(engine: Engine, cfg: Any, prefix: str, rate: float, seconds: float) -> int:
    """Route ``rate * seconds`` leads on schedule: every 50 ms the leads due then, as one
    ``Router.assign_many`` batch, the ticks shared by 4 threads; returns how many."""
    n = int(rate * seconds)
    tick = 0.05
    per_tick = max(1, round(rate * tick))
    ticks = (n + per_tick - 1) // per_tick
    start = time.monotonic() + 0.2
    threads = 4

    def work(k: int) -> None:
        router = Router(engine, cfg)
        for t in range(k, ticks, threads):
            wait = start + t * tick - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            batch = [
                Lead(f"{prefix}{i:06d}", {"Country": "US", "Company": f"C{i}"})
                for i in range(t * per_tick, min(n, (t + 1) * per_tick))
            ]
            router.assign_many(batch, "api")

    ts = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
    for th in ts:
        th.start()
    for th in ts:
        th.join()
    return n


def percentile(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def run_case(db_url: str, name: str, reps: int, rate: float, seconds: float) -> dict[str, Any]:
    slack = SlackSandbox().start()
    people = many_reps(reps)
    for _, _, email, uid in people:
        slack.add_user(email, uid)
    cfg = notify_cfg(slack.url, members=members_of(people), reps=contacts_of(people))
    engine = make_engine(db_url, pool_size=8)
    apply_teams(engine, cfg)
    apply_notify_settings(engine, cfg)
    stop = threading.Event()
    pace = Pace()  # as connector/shell/notifying.py gives an org's dispatchers
    dispatchers = [
        threading.Thread(target=NotifyDispatcher(engine, cfg, pace=pace).run_forever, args=(stop,))
        for _ in range(2)
    ]
    for d in dispatchers:
        d.start()
    t0 = time.monotonic()
    try:
        prefix = f"00Q{name[:3]}"
        n = produce(engine, cfg, prefix, rate, seconds)
        produced_s = time.monotonic() - t0
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            with engine.connect() as conn:
                left = conn.execute(
                    text("SELECT count(*) FROM notifications WHERE state <> 'sent'")
                ).scalar_one()
            if not left:
                break
            time.sleep(0.2)
    finally:
        stop.set()
        for d in dispatchers:
            d.join(30)
    with engine.connect() as conn:
        created = {
            r.crm_id: r.created_at.timestamp()
            for r in conn.execute(
                text(
                    "SELECT l.crm_id, n.created_at FROM notifications n "
                    "JOIN leads l ON l.id = n.lead_id"
                )
            )
        }
    messages = slack.messages()
    accepted: dict[str, float] = {}
    for m in messages:
        for crm_id in LINK.findall(m["text"]):
            accepted.setdefault(crm_id, m["accepted_at"])
    latencies = [accepted[k] - created[k] for k in created if k in accepted]
    per_channel: dict[str, list[float]] = {}
    for m in messages:
        per_channel.setdefault(m["channel"], []).append(m["accepted_at"])
    rates = [
        60.0 * (len(ts) - 1) / (max(ts) - min(ts))
        for ts in per_channel.values()
        if len(ts) > 1 and max(ts) > min(ts)
    ]
    engine.dispose()
    counters = slack.counters()
    slack.stop()
    return {
        "case": name,
        "reps": reps,
        "leads": n,
        "target_rate_per_s": rate,
        "achieved_rate_per_s": round(n / produced_s, 1),
        "notified": len(latencies),
        "lost": n - len(latencies),
        "p50_s": round(statistics.median(latencies), 3) if latencies else None,
        "p99_s": round(percentile(latencies, 0.99), 3) if latencies else None,
        "max_s": round(max(latencies), 3) if latencies else None,
        "messages": len(messages),
        "leads_per_message": round(len(latencies) / len(messages), 2) if messages else None,
        "messages_per_min_per_channel": round(statistics.median(rates), 1) if rates else None,
        "ratelimited_answers": counters.get("ratelimited", 0),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--rate", type=float, default=200.0)
    p.add_argument("--seconds", type=float, default=15.0)
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--one-channel-rate", type=float, default=20.0)
    p.add_argument("--one-channel-seconds", type=float, default=30.0)
    args = p.parse_args()
    url = os.environ.get("BENCH_DATABASE_URL") or server_url()
    factory = DatabaseFactory(url)
    load_before = os.getloadavg()
    try:
        cases = [
            run_case(factory.new(), "spread", args.reps, args.rate, args.seconds),
            run_case(
                factory.new(), "one_channel", 1, args.one_channel_rate, args.one_channel_seconds
            ),
        ]
    finally:
        factory.drop_all()
    for c in cases:
        print(
            f"{c['case']:<12} reps={c['reps']:<3} leads={c['leads']:<5} "
            f"rate={c['achieved_rate_per_s']}/s (target {c['target_rate_per_s']}) "
            f"p50 {c['p50_s']} s  p99 {c['p99_s']} s  max {c['max_s']} s  "
            f"messages {c['messages']}  leads/message {c['leads_per_message']}  "
            f"messages/min/channel {c['messages_per_min_per_channel']}  "
            f"429s {c['ratelimited_answers']}  lost {c['lost']}"
        )
    out = {
        "benchmark": "notify",
        "command": "python -m bench.notify "
        + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "database": "BENCH_DATABASE_URL" if os.environ.get("BENCH_DATABASE_URL") else "embedded",
        "load_before": load_before,
        "load_after": os.getloadavg(),
        "cases": cases,
    }
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / "notify.json"
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
