"""Benchmark: sustained signed HubSpot webhook load against `connector serve`.

    .venv/bin/python -m bench.webhook [--quick] [--receivers N] [--run] [--rates 100,500]
        [--seconds S] [--spans] [--connector-root CHECKOUT] [--out FILE]

Four separate processes on this machine: the HubSpot sandbox (`connector sandbox hubspot`, its
real 100-per-10-s limit), `connector serve` (the receiver), `connector dispatch` (the
write-back), and this load generator. The generator is open-loop: request i is due at t0 + i /
rate and its latency is measured from that due time, so a slow server cannot hide its queueing
(no coordinated omission). It is one asyncio loop on raw sockets with every request signed and
rendered before the clock starts, so that it takes little of the two cores it shares with the
system under test. Each request is one signed webhook with one contact.creation event, i.e. one
new lead. The receiver stores the event and acks; its inbox worker reads the contact back from
the sandbox (batch read) and routes it; the dispatcher reads the current owners again and
writes. Lead-to-CRM is measured from the due time to the moment the sandbox accepted the owner
write (outbox.finished_at). Each `serve` process and the `dispatch` process get an admin port
of their own; load starts once each /healthz says ok, the dispatch process's once it listens
for the inbox's announcements (so ``--connector-root`` needs a checkout whose `connector
dispatch` takes ``--admin-port``). Each row also reports the CPU each process used during the
step (% of one core, from /proc; "postgres" is the server backends of the benchmark's database)
and the load average. Writes bench/results/webhook.json. With ``--run`` the receivers are
`connector run` processes (receiver, inbox worker and dispatchers sharing one HubSpot rate
budget, the production default) and no separate dispatch process runs; that writes
bench/results/webhook-run.json. ``--spans`` runs the receivers under bench/webhook_spans.py
(time per handler step, event-loop lag, GC pauses); ``--connector-root`` runs the connector
processes from another checkout (its .venv) with this generator, to compare two versions in one
sitting.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
from sqlalchemy import text

from connector.intake.hubspot_events import creation_events, events_body
from connector.intake.signatures import sign_v3
from connector.shell.store import make_engine
from testbed.pg import DatabaseFactory, server_url

RESULTS = Path(__file__).parent / "results"
SECRET = "bench-webhook-secret"
TOKEN = "sandbox-token"


PORTAL = 62515


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pct(xs: list[float], p: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, int(p / 100 * len(s)))]


def config_yaml(sandbox: str, owners: list[str], limit_per_10s: int = 100) -> str:
    members = "\n".join(f'      - {{crm_user_id: "{o}", name: "Owner {o}"}}' for o in owners)
    return f"""
org: bench-hs
crm:
  kind: hubspot
  base_url: {sandbox}
  auth: {{access_token: "${{BENCH_HS_TOKEN}}"}}
  object: contacts
  limit_per_10s: {limit_per_10s}
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


def _request_bytes(url: str, body: bytes, ts: int) -> tuple[str, int, bytes]:
    """(host, port, the whole HTTP/1.1 request) for one signed webhook, built once."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    head = (
        f"POST {parts.path} HTTP/1.1\r\n"
        f"Host: {parts.netloc}\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n"
        f"X-HubSpot-Signature-v3: {sign_v3(SECRET, 'POST', url, body, ts)}\r\n"
        f"X-HubSpot-Request-Timestamp: {ts}\r\n\r\n"
    )
    return host, port, head.encode() + body


def _event_body(rid: str, ts: int) -> bytes:
    return events_body(creation_events(PORTAL, "contacts", [int(rid)], 10_000_000 + int(rid), ts))


Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]
KEEP_ALIVE_SECONDS = 2.0
"""An idle connection older than this is not reused (the receiver closes them after 5 s)."""


async def _exchange(conn: Conn, request: bytes) -> tuple[int, bool]:
    """Send one request on a keep-alive connection; (status, whether it may be reused)."""
    reader, writer = conn
    writer.write(request)
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    length, reuse = 0, True
    for line in lines[1:]:
        name, _, value = line.partition(":")
        name = name.strip().lower()
        if name == "content-length":
            length = int(value)
        elif name == "connection" and value.strip().lower() == "close":
            reuse = False
    if length:
        await reader.readexactly(length)
    return status, reuse


async def _open_loop(
    prepared: list[tuple[str, int, bytes]], rate: float, max_connections: int = 256
) -> tuple[list[float], list[float], list[int]]:
    """Send each prepared request at its due time (t0 + i / rate) whatever the answers do;
    (due times, ACK latencies in ms, non-200 statuses, 0 for a transport error)."""
    idle: dict[tuple[str, int], list[tuple[Conn, float]]] = {}
    slots = asyncio.Semaphore(max_connections)
    lat: list[float] = []
    errors: list[int] = []
    loop = asyncio.get_running_loop()
    t0 = loop.time() + 0.2
    wall0 = time.time() + 0.2
    due = [wall0 + i / rate for i in range(len(prepared))]

    async def one(i: int) -> None:
        host, port, request = prepared[i]
        when = t0 + i / rate
        async with slots:
            pool = idle.setdefault((host, port), [])
            conn = None
            while pool and conn is None:
                conn, used = pool.pop()
                if loop.time() - used > KEEP_ALIVE_SECONDS:  # the server may be closing it
                    conn[1].close()
                    conn = None
            try:
                if conn is None:
                    conn = await asyncio.open_connection(host, port)
                status, reuse = await _exchange(conn, request)
            except (OSError, asyncio.IncompleteReadError, ValueError, IndexError):
                status, reuse = 0, False
            lat.append((loop.time() - when) * 1000)
            if status != 200:
                errors.append(status)
            if conn is not None:
                if reuse:
                    pool.append((conn, loop.time()))
                else:
                    conn[1].close()

    tasks = []
    for i in range(len(prepared)):
        delay = t0 + i / rate - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(i)))
    await asyncio.gather(*tasks)
    for pool in idle.values():
        for (_, writer), _ in pool:
            writer.close()
    return due, lat, errors


def step(urls: list[str], ids: list[str], rate: float) -> dict[str, Any]:
    """Send len(ids) one-event webhooks at `rate` per second, round robin over the receivers
    in `urls` (a load balancer's job); return ACK figures.

    Every request is signed and rendered to bytes before the clock starts (a signature stays
    valid for 5 minutes), and the generator is one asyncio loop on raw sockets (uvloop when
    installed): it shares the two cores with the system under test, so it must stay cheap.
    """
    ts = int(time.time() * 1000)
    prepared = [
        _request_bytes(urls[n % len(urls)], _event_body(rid, ts), ts) for n, rid in enumerate(ids)
    ]
    started = time.time()
    due, lat, errors = _run(_open_loop(prepared, rate))
    elapsed = time.time() - started - 0.2
    return {
        "due": dict(zip(ids, due, strict=True)),
        "ack_ms": lat,
        "errors": errors,
        "achieved_rps": len(ids) / elapsed,
    }


def cpu_seconds(pid: int) -> tuple[int, float]:
    """(start time, user + system CPU seconds so far) of a process (Linux /proc); (0, 0.0)
    if it is gone. The start time tells a reused pid apart."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return 0, 0.0
    return int(fields[19]), (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def backend_pids(engine: Any) -> list[int]:
    """The PostgreSQL server processes serving the benchmark's database (a local server)."""
    with engine.connect() as conn:
        return list(
            conn.execute(
                text(
                    "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                    "AND pid <> pg_backend_pid()"
                )
            ).scalars()
        )


def cpu_shares(
    roles: dict[str, list[int]], before: dict[int, tuple[int, float]], seconds: float
) -> dict[str, float]:
    """Per role, the percentage of one core its processes used over ``seconds`` (a process
    gone meanwhile cannot be read any more and is left out)."""
    shares = {}
    for role, pids in roles.items():
        used = 0.0
        for pid in pids:
            started, now = cpu_seconds(pid)
            if not started:
                continue
            was_started, was = before.get(pid, (started, 0.0))
            used += now - (was if was_started == started else 0.0)
        shares[role] = round(used / seconds * 100, 1)
    return shares


def _run(coro: Any) -> Any:
    try:
        import uvloop

        return uvloop.run(coro)
    except ImportError:
        return asyncio.run(coro)


def wait_ready(url: str, timeout: float = 60.0) -> None:
    """Wait until ``url`` answers 200 (the sandbox, each /healthz). `connector dispatch`'s
    /healthz says ok only once it listens for the inbox's announcements: load sent before
    that loses the first announcements, and those leads' owners wait for the dispatchers' own
    cycle (lead-to-CRM p99 548-818 ms at 200 req/s instead of about 424 ms, a trace of
    2026-12-04)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise SystemExit(f"{url} was not ready after {timeout:.0f} s")


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
    ap.add_argument(
        "--rates",
        default=None,
        help="comma-separated target req/s (default 50,100,200,300,500; --quick 50,100,200)",
    )
    ap.add_argument("--seconds", type=float, default=None, help="seconds per rate (15; quick 5)")
    ap.add_argument(
        "--connector-root",
        type=Path,
        default=None,
        help="run the connector processes from this checkout and its .venv (e.g. main's, to "
        "compare two versions with the same generator); default: this one",
    )
    ap.add_argument(
        "--spans",
        action="store_true",
        help="run the receivers under bench/webhook_spans.py (timing spans per step, event "
        "loop lag); their summaries go beside --out as *-spans-N.json",
    )
    ap.add_argument(
        "--limit-per-10s",
        type=int,
        default=100,
        help="the HubSpot budget of the sandbox and the org (100, HubSpot's base tier; 190 "
        "Professional/Enterprise; 250 with the API limit increase)",
    )
    ap.add_argument(
        "--crm-latency-ms",
        type=float,
        default=0.0,
        help="the sandbox waits this long before each API answer (a CRM a network away; the "
        "local sandbox answers in 0.5-2 ms)",
    )
    ap.add_argument("--out", type=Path, default=None, help="results file (default below)")
    args = ap.parse_args()
    default_rates = "50,100,200" if args.quick else "50,100,200,300,500"
    rates = [int(r) for r in (args.rates or default_rates).split(",")]
    seconds = args.seconds or (5 if args.quick else 15)
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
    root = args.connector_root.resolve() if args.connector_root else None
    python = str(root / ".venv" / "bin" / "python") if root else sys.executable
    cli = [python, "-m", "connector"]
    rows = []
    try:
        sb_port = free_port()
        # (only when asked: a --connector-root checkout from before the option lacks it)
        limit_args = (
            ["--limit-per-10s", str(args.limit_per_10s)] if args.limit_per_10s != 100 else []
        )
        procs.append(
            subprocess.Popen(
                [*cli, "sandbox", "hubspot", "--port", str(sb_port), *limit_args],
                env=env,
                cwd=root,
                stderr=subprocess.DEVNULL,
            )
        )
        sandbox = f"http://127.0.0.1:{sb_port}"
        wait_ready(f"{sandbox}/_sandbox/counters")
        total = sum(int(r * seconds) for r in rates)
        seeded = httpx.post(
            f"{sandbox}/_sandbox/seed",
            timeout=120,
            json={
                "owners": [{"first_name": f"Rep{i}"} for i in range(8)],
                "records": [{"object": "contacts"} for _ in range(total)],
            },
        ).json()
        if args.crm_latency_ms:
            httpx.post(
                f"{sandbox}/_sandbox/faults", json={"latency_ms": args.crm_latency_ms}
            ).raise_for_status()
        (tmp / "bench.yaml").write_text(config_yaml(sandbox, seeded["owners"], args.limit_per_10s))
        ports = [free_port() for _ in range(args.receivers)]
        admin_ports = [free_port() for _ in range(args.receivers)]
        out_path = args.out or RESULTS / ("webhook-run.json" if args.run else "webhook.json")
        for n, (port, admin) in enumerate(zip(ports, admin_ports, strict=True)):
            spans = out_path.with_name(f"{out_path.stem}-spans-{n}.json")
            receiver_cli = (
                [python, str(Path(__file__).with_name("webhook_spans.py")), str(spans), "--"]
                if args.spans
                else cli
            )
            procs.append(
                subprocess.Popen(
                    [
                        *receiver_cli,
                        "--config",
                        str(tmp),
                        "run" if args.run else "serve",
                        "--port",
                        str(port),
                        "--admin-port",
                        str(admin),
                    ],
                    env=env,
                    cwd=root,
                )
            )
        for admin in admin_ports:
            wait_ready(f"http://127.0.0.1:{admin}/healthz")
        if not args.run:
            dispatch_admin = free_port()
            procs.append(
                subprocess.Popen(
                    [
                        *cli,
                        "--config",
                        str(tmp),
                        "dispatch",
                        "--concurrency",
                        "2",
                        "--admin-port",
                        str(dispatch_admin),
                    ],
                    env=env,
                    cwd=root,
                )
            )
            wait_ready(f"http://127.0.0.1:{dispatch_admin}/healthz")
        hooks = [f"http://127.0.0.1:{port}/webhooks/hubspot/bench-hs" for port in ports]
        engine = make_engine(db_url)
        ids: list[str] = seeded["records"]
        offset = 0
        for rate in rates:
            chunk = ids[offset : offset + int(rate * seconds)]
            offset += len(chunk)
            roles = {
                "generator": [os.getpid()],
                "sandbox": [procs[0].pid],
                "receiver": [p.pid for p in procs[1 : 1 + args.receivers]],
                "dispatcher": [p.pid for p in procs[1 + args.receivers :]],
                "postgres": backend_pids(engine),
            }
            before = {pid: cpu_seconds(pid) for pids in roles.values() for pid in pids}
            calls_before = httpx.get(f"{sandbox}/_sandbox/counters").json()
            began = time.time()
            res = step(hooks, chunk, rate)
            roles["postgres"] = sorted({*roles["postgres"], *backend_pids(engine)})
            cpu = cpu_shares(roles, before, time.time() - began)
            deadline = time.time() + 60
            while time.time() < deadline:
                with engine.connect() as conn:
                    # events not yet read back and routed, then owner writes not yet sent
                    left = conn.execute(
                        text(
                            "SELECT (SELECT count(*) FROM intake_events WHERE state = 'pending'"
                            " OR (state = 'claimed' AND lease_until IS NOT NULL))"
                            " + (SELECT count(*) FROM outbox WHERE finished_at IS NULL)"
                        )
                    ).scalar_one()
                if left == 0:
                    break
                time.sleep(0.2)
            drained = time.time()
            calls_after = httpx.get(f"{sandbox}/_sandbox/counters").json()
            crm_calls = calls_after["total_calls"] - calls_before["total_calls"]
            limited = calls_after.get("rate_limited", 0) - calls_before.get("rate_limited", 0)
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
                "error_statuses": dict(Counter(res["errors"])),
                "written_back": len(finished),
                "routed_p50_ms": round(pct(l2r, 50), 1),
                "routed_p99_ms": round(pct(l2r, 99), 1),
                "lead_to_crm_p50_ms": round(pct(l2c, 50), 1),
                "lead_to_crm_p99_ms": round(pct(l2c, 99), 1),
                # HubSpot calls from the first request until the queues were empty
                "crm_calls": crm_calls,
                "crm_calls_per_s": round(crm_calls / max(drained - began, 1e-9), 2),
                "rate_limited": limited,
                "cpu_pct": cpu,
                "load_avg": os.getloadavg()[0],
            }
            rows.append(row)
            print(
                f"{rate:>4} req/s x {seconds} s: achieved {row['achieved_rps']:>6}/s  "
                f"ACK p50 {row['ack_p50_ms']:>6} ms p99 {row['ack_p99_ms']:>7} ms  "
                f"errors {row['errors']} {row['error_statuses'] or ''}  "
                f"routed p50 {row['routed_p50_ms']} ms "
                f"p99 {row['routed_p99_ms']} ms  "
                f"lead-to-CRM p50 {row['lead_to_crm_p50_ms']} ms "
                f"p99 {row['lead_to_crm_p99_ms']} ms  ({row['written_back']}/"
                f"{len(chunk)} written back)\n      HubSpot calls {crm_calls} "
                f"({row['crm_calls_per_s']}/s, {limited} answered 429)  CPU % of one core: {cpu}  "
                f"load {row['load_avg']:.2f}",
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
        shutil.rmtree(tmp, ignore_errors=True)  # the run's config folder
    out = {
        "benchmark": "webhook",
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "quick": args.quick,
        "receivers": args.receivers,
        "mode": "run" if args.run else "serve+dispatch",
        "limit_per_10s": args.limit_per_10s,
        "crm_latency_ms": args.crm_latency_ms,
        "connector_root": str(root) if root else None,
        "rows": rows,
        "sandbox_counters": counters,
    }
    RESULTS.mkdir(exist_ok=True)
    (args.out or RESULTS).parent.mkdir(parents=True, exist_ok=True)
    path = args.out or RESULTS / ("webhook-run.json" if args.run else "webhook.json")
    if args.spans:
        for n in range(args.receivers):
            spans = path.with_name(f"{path.stem}-spans-{n}.json")
            if spans.exists():
                print(f"receiver {n} spans ({spans}):")
                for name, fig in json.loads(spans.read_text()).items():
                    figures = fig.items() if name != "heap" else [("", fig)]
                    print(f"  {name:>22}: " + "  ".join(f"{k} {v}" for k, v in figures))
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"HubSpot 429s: {counters.get('rate_limited', 0)}; wrote {path}")


if __name__ == "__main__":
    main()
