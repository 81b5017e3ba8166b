"""Benchmark: sustained signed HubSpot webhook load against `connector serve`.

    .venv/bin/python -m bench.webhook [--quick] [--receivers N] [--run]

Four separate processes on this machine: the HubSpot sandbox (`connector sandbox hubspot`,
its real 100-per-10-s limit), `connector serve` (the receiver), `connector dispatch` (the
write-back), and this load generator. The generator is open-loop: request i is due at
t0 + i / rate and its latency is measured from that due time, so a slow server cannot hide
its queueing (no coordinated omission). Each request is one signed webhook with one
contact.creation event, i.e. one new lead. The receiver stores the event and acks; its inbox
worker reads the contact back from the sandbox (batch read) and routes it; the dispatcher reads
the current owners again and writes. Lead-to-CRM is measured from the due time to the moment
the sandbox accepted the owner write (outbox.finished_at). Each `serve` process gets its own
admin port (/healthz, readiness). Writes bench/results/webhook.json. With ``--run`` the
receivers are `connector run` processes (receiver, inbox worker and dispatchers sharing one
HubSpot rate budget, the production default) and no separate dispatch process runs; that
writes bench/results/webhook-run.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import text

from connector.intake.signatures import sign_v3
from connector.shell.store import make_engine
from tests.pg import DatabaseFactory, server_url

RESULTS = Path(__file__).parent / "results"
SECRET = "bench-webhook-secret"
TOKEN = "sandbox-token"


PORTAL = 62515


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(url: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            httpx.get(url, timeout=2)
            return
        except httpx.HTTPError:
            time.sleep(0.2)
    raise SystemExit(f"{url} did not come up")


def pct(xs: list[float], p: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, int(p / 100 * len(s)))]


def config_yaml(sandbox: str, owners: list[str]) -> str:
    members = "\n".join(f'      - {{crm_user_id: "{o}", name: "Owner {o}"}}' for o in owners)
    return f"""
org: bench-hs
crm:
  kind: hubspot
  base_url: {sandbox}
  auth: {{access_token: "${{BENCH_HS_TOKEN}}"}}
  object: contacts
  limit_per_10s: 100
  webhook_secrets: ["${{BENCH_HS_SECRET}}"]
  portal_id: {PORTAL}
poll: {{enabled: false}}
teams:
  - name: inbound
    members:
{members}
rules:
  - {{team: inbound}}
"""


def step(
    client: httpx.Client, urls: list[str], ids: list[str], rate: float, threads: int = 48
) -> dict[str, Any]:
    """Send len(ids) one-event webhooks at `rate` per second, round robin over the receivers
    in `urls` (a load balancer's job); return ACK figures."""
    due = {rid: 0.0 for rid in ids}
    lat: list[float] = []
    errors: list[int] = []
    lock = threading.Lock()
    nxt = iter(range(len(ids)))
    # Sign every request before the clock starts (a signature stays valid for 5 minutes), so
    # the generator spends its share of the two cores sending, not hashing.
    ts = int(time.time() * 1000)
    prepared: list[tuple[str, bytes, dict[str, str]]] = []
    for n, rid in enumerate(ids):
        url = urls[n % len(urls)]
        body = json.dumps(
            [
                {
                    "eventId": 10_000_000 + int(rid),
                    "subscriptionId": 1,
                    "portalId": PORTAL,
                    "appId": 1,
                    "occurredAt": ts,
                    "subscriptionType": "contact.creation",
                    "attemptNumber": 0,
                    "objectId": int(rid),
                    "changeSource": "CRM",
                }
            ]
        ).encode()
        prepared.append(
            (
                url,
                body,
                {
                    "Content-Type": "application/json",
                    "X-HubSpot-Signature-v3": sign_v3(SECRET, "POST", url, body, ts),
                    "X-HubSpot-Request-Timestamp": str(ts),
                },
            )
        )
    t0 = time.time() + 0.2

    def loop() -> None:
        while True:
            with lock:
                i = next(nxt, None)
            if i is None:
                return
            when = t0 + i / rate
            delay = when - time.time()
            if delay > 0:
                time.sleep(delay)
            rid = ids[i]
            url, body, headers = prepared[i]
            try:
                r = client.post(url, content=body, headers=headers)
                code = r.status_code
            except httpx.HTTPError:
                code = 0
            done = time.time()
            with lock:
                due[rid] = when
                lat.append((done - when) * 1000)
                if code != 200:
                    errors.append(code)

    ts_ = [threading.Thread(target=loop) for _ in range(threads)]
    for t in ts_:
        t.start()
    for t in ts_:
        t.join()
    elapsed = time.time() - t0
    return {"due": due, "ack_ms": lat, "errors": errors, "achieved_rps": len(ids) / elapsed}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument(
        "--receivers",
        type=int,
        default=1,
        help="`connector serve` processes, requests spread round robin",
    )
    ap.add_argument(
        "--run",
        action="store_true",
        help="`connector run` processes (receiver, inbox worker and dispatchers in one process, "
        "sharing one HubSpot rate budget) instead of `serve` + a separate `dispatch`",
    )
    args = ap.parse_args()
    rates = [50, 100, 200] if args.quick else [50, 100, 200, 300]
    seconds = 5 if args.quick else 15
    url = os.environ.get("BENCH_DATABASE_URL") or server_url()
    factory = DatabaseFactory(url)
    db_url = factory.new()
    tmp = Path(tempfile.mkdtemp(prefix="bench-webhook-"))
    procs: list[subprocess.Popen[bytes]] = []
    env = {
        **os.environ,
        "DATABASE_URL": db_url,
        "BENCH_HS_TOKEN": TOKEN,
        "BENCH_HS_SECRET": SECRET,
        "CONNECTOR_LOG_LEVEL": "WARNING",
    }
    cli = [sys.executable, "-m", "connector"]
    rows = []
    try:
        sb_port = free_port()
        procs.append(
            subprocess.Popen(
                [*cli, "sandbox", "hubspot", "--port", str(sb_port)],
                env=env,
                stderr=subprocess.DEVNULL,
            )
        )
        sandbox = f"http://127.0.0.1:{sb_port}"
        wait_http(f"{sandbox}/_sandbox/counters")
        total = sum(int(r * seconds) for r in rates)
        seeded = httpx.post(
            f"{sandbox}/_sandbox/seed",
            timeout=120,
            json={
                "owners": [{"first_name": f"Rep{i}"} for i in range(8)],
                "records": [{"object": "contacts"} for _ in range(total)],
            },
        ).json()
        (tmp / "bench.yaml").write_text(config_yaml(sandbox, seeded["owners"]))
        ports = [free_port() for _ in range(args.receivers)]
        admin_ports = [free_port() for _ in range(args.receivers)]
        for port, admin in zip(ports, admin_ports, strict=True):
            procs.append(
                subprocess.Popen(
                    [
                        *cli,
                        "--config",
                        str(tmp),
                        "run" if args.run else "serve",
                        "--port",
                        str(port),
                        "--admin-port",
                        str(admin),
                    ],
                    env=env,
                )
            )
        for admin in admin_ports:
            wait_http(f"http://127.0.0.1:{admin}/healthz")
        if not args.run:
            procs.append(
                subprocess.Popen(
                    [*cli, "--config", str(tmp), "dispatch", "--concurrency", "2"], env=env
                )
            )
        hooks = [f"http://127.0.0.1:{port}/webhooks/hubspot/bench-hs" for port in ports]
        engine = make_engine(db_url)
        ids: list[str] = seeded["records"]
        offset = 0
        limits = httpx.Limits(
            max_connections=64, max_keepalive_connections=64, keepalive_expiry=2.0
        )
        with httpx.Client(timeout=30, limits=limits) as client:
            for rate in rates:
                chunk = ids[offset : offset + int(rate * seconds)]
                offset += len(chunk)
                res = step(client, hooks, chunk, rate)
                deadline = time.time() + 60
                while time.time() < deadline:
                    with engine.connect() as conn:
                        # events not yet read back and routed, then owner writes not yet sent
                        left = conn.execute(
                            text(
                                "SELECT (SELECT count(*) FROM intake_events "
                                "WHERE state IN ('pending','claimed')) + (SELECT count(*) "
                                "FROM outbox WHERE state IN ('pending','claimed'))"
                            )
                        ).scalar_one()
                    if left == 0:
                        break
                    time.sleep(0.2)
                with engine.connect() as conn:
                    finished = dict(
                        conn.execute(
                            text(
                                "SELECT l.crm_id, extract(epoch FROM o.finished_at) FROM outbox o "
                                "JOIN leads l ON l.id = o.lead_id WHERE o.state = 'sent' "
                                "AND l.crm_id = ANY(:ids)"
                            ),
                            {"ids": chunk},
                        ).all()
                    )
                    # when the inbox worker had read the record back and routed it
                    routed: dict[str, Any] = dict(
                        conn.execute(
                            text(
                                "SELECT crm_id, extract(epoch FROM finished_at) FROM intake_events "
                                "WHERE state = 'done' AND crm_id = ANY(:ids)"
                            ),
                            {"ids": chunk},
                        ).all()
                    )
                l2c = [(float(finished[i]) - res["due"][i]) * 1000 for i in chunk if i in finished]
                l2r = [(float(routed[i]) - res["due"][i]) * 1000 for i in chunk if i in routed]
                row = {
                    "target_rps": rate,
                    "seconds": seconds,
                    "requests": len(chunk),
                    "achieved_rps": round(res["achieved_rps"], 1),
                    "ack_p50_ms": round(pct(res["ack_ms"], 50), 1),
                    "ack_p99_ms": round(pct(res["ack_ms"], 99), 1),
                    "errors": len(res["errors"]),
                    "written_back": len(finished),
                    "routed_p50_ms": round(pct(l2r, 50), 1),
                    "routed_p99_ms": round(pct(l2r, 99), 1),
                    "lead_to_crm_p50_ms": round(pct(l2c, 50), 1),
                    "lead_to_crm_p99_ms": round(pct(l2c, 99), 1),
                }
                rows.append(row)
                print(
                    f"{rate:>4} req/s x {seconds} s: achieved {row['achieved_rps']:>6}/s  "
                    f"ACK p50 {row['ack_p50_ms']:>6} ms p99 {row['ack_p99_ms']:>7} ms  "
                    f"errors {row['errors']}  routed p50 {row['routed_p50_ms']} ms "
                    f"p99 {row['routed_p99_ms']} ms  "
                    f"lead-to-CRM p50 {row['lead_to_crm_p50_ms']} ms "
                    f"p99 {row['lead_to_crm_p99_ms']} ms  ({row['written_back']}/"
                    f"{len(chunk)} written back)",
                    flush=True,
                )
        counters = httpx.get(f"{sandbox}/_sandbox/counters").json()
        engine.dispose()
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
        factory.drop_all()
    out = {
        "benchmark": "webhook",
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "quick": args.quick,
        "receivers": args.receivers,
        "mode": "run" if args.run else "serve+dispatch",
        "rows": rows,
        "sandbox_counters": counters,
    }
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / ("webhook-run.json" if args.run else "webhook.json")
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"HubSpot 429s: {counters.get('rate_limited', 0)}; wrote {path}")


if __name__ == "__main__":
    main()
