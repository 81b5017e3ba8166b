"""Benchmark: does one hostile sender with a valid secret slow everyone else's webhooks?

    .venv/bin/python -m bench.hostile [--rate 50] [--seconds 10] [--connections 4]
        [--out FILE]

Processes on this machine: the HubSpot sandbox, one `connector serve` (one HubSpot org, one
Salesforce org), the open-loop generator of bench/webhook.py sending one-event signed HubSpot
deliveries at ``--rate`` per second, and, in the second phase, a hostile sender (a process of
its own): ``--connections`` keep-alive connections that post, back to back, Outbound Messages
under every cap of the Salesforce endpoint with its valid URL secret, each as costly to parse
as the caps allow (49,000 elements with one attribute each, under 1 MiB: a wrong
OrganizationId makes them refused after the full parse, so nothing is stored). Phase one
measures the other senders' ACK latency alone, phase two with the hostile sender running;
phases alternate for ``--rounds`` pairs (the machine's other load drifts), and the figure is
the ratio of the median p50 attacked to the median p50 alone. Prints the figures and writes
bench/results/hostile.json. ``--sender URL`` is the hostile sender's own entry point.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from bench.webhook import RESULTS, SECRET, TOKEN, config_yaml, free_port, pct, step, wait_ready
from connector.intake.soap import DEFAULT_MAX_ELEMENTS, SOBJECT_NS, build_outbound_message
from testbed.pg import DatabaseFactory, server_url

SF_ORG_ID = "00D5g000004ABCDEAA"
SF_SECRET = "bench-hostile-outbound-secret-0123456789"
SF_YAML = f"""
org: bench-sf
crm:
  kind: salesforce
  instance_url: http://127.0.0.1:9
  auth:
    method: client_credentials
    client_id: "${{BENCH_SF_ID}}"
    client_secret: "${{BENCH_SF_SECRET}}"
  object: Lead
  organization_id: {SF_ORG_ID}
  outbound_secrets: ["${{BENCH_SF_OUTBOUND}}"]
teams:
  - name: all
    members:
      - {{crm_user_id: "0055g00000AbCdEAAV", name: Ada}}
rules:
  - {{team: all}}
"""


def hostile_body() -> bytes:
    """An Outbound Message under every cap, as costly as they allow: 49,000 fields of one
    attribute each, under another org's id (refused after the parse)."""
    base = build_outbound_message(
        "00D5g000009WXYZAAA", [("04l000000000000001", "Lead", {"Id": "00Q5g000001abcdEAA"})]
    )
    fields = b'<sf:X a="1"/>' * (DEFAULT_MAX_ELEMENTS - 1_000)
    body = base.replace(b"</sObject>", fields + b"</sObject>", 1)
    assert SOBJECT_NS.encode() in body and len(body) < 1_048_576
    return body


def hostile_sender(url: str, connections: int) -> None:
    """Post the hostile body back to back on ``connections`` threads until killed."""
    import threading

    parts = urlsplit(url)
    body = hostile_body()
    request = (
        f"POST {parts.path} HTTP/1.1\r\nHost: {parts.netloc}\r\n"
        f'Content-Type: text/xml; charset=utf-8\r\nSOAPAction: ""\r\n'
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body

    def loop() -> None:
        while True:
            try:
                with socket.create_connection((parts.hostname, parts.port), timeout=30) as s:
                    while True:
                        s.sendall(request)
                        got = b""
                        while b"\r\n\r\n" not in got:
                            chunk = s.recv(65536)
                            if not chunk:
                                raise ConnectionError
                            got += chunk
                        head, _, rest = got.partition(b"\r\n\r\n")
                        length = 0
                        for line in head.split(b"\r\n")[1:]:
                            name, _, value = line.partition(b":")
                            if name.strip().lower() == b"content-length":
                                length = int(value)
                        while len(rest) < length:
                            rest += s.recv(65536)
                        if b"connection: close" in head.lower():
                            break
            except OSError:
                time.sleep(0.05)

    for _ in range(connections):
        threading.Thread(target=loop, daemon=True).start()
    while True:
        time.sleep(3600)


def refused_bodies(admin_url: str) -> int:
    """Outbound Messages the receiver has answered 403 so far (its /metrics): the hostile
    sender's bodies, each refused after its full parse."""
    text = httpx.get(f"{admin_url}/metrics", timeout=10).text
    return sum(
        int(float(line.rsplit(" ", 1)[1]))
        for line in text.splitlines()
        if line.startswith("connector_webhook_requests_total{")
        and 'endpoint="salesforce"' in line
        and 'code="403"' in line
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rate", type=float, default=50.0, help="the other senders' req/s")
    ap.add_argument("--seconds", type=float, default=10.0, help="per phase")
    ap.add_argument("--connections", type=int, default=4, help="the hostile sender's")
    ap.add_argument("--rounds", type=int, default=3, help="alone/attacked phase pairs")
    ap.add_argument("--sender", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, default=RESULTS / "hostile.json")
    args = ap.parse_args()
    if args.sender:
        hostile_sender(args.sender, args.connections)
        return
    factory = DatabaseFactory(os.environ.get("BENCH_DATABASE_URL") or server_url())
    db_url = factory.new()
    tmp = Path(tempfile.mkdtemp(prefix="bench-hostile-"))
    env = {
        **os.environ,
        "DATABASE_URL": db_url,
        "BENCH_HS_TOKEN": TOKEN,
        "BENCH_HS_SECRET": SECRET,
        "BENCH_SF_ID": "x",
        "BENCH_SF_SECRET": "x",
        "BENCH_SF_OUTBOUND": SF_SECRET,
        "CONNECTOR_LOG_LEVEL": "ERROR",
    }
    cli = [sys.executable, "-m", "connector"]
    procs: list[subprocess.Popen[bytes]] = []
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
        wait_ready(f"{sandbox}/_sandbox/counters")
        per_phase = int(args.rate * args.seconds)
        seeded = httpx.post(
            f"{sandbox}/_sandbox/seed",
            timeout=120,
            json={
                "owners": [{"first_name": f"Rep{i}"} for i in range(4)],
                "records": [
                    {"object": "contacts"} for _ in range((1 + 2 * args.rounds) * per_phase)
                ],
            },
        ).json()
        (tmp / "hs.yaml").write_text(config_yaml(sandbox, seeded["owners"]))
        (tmp / "sf.yaml").write_text(SF_YAML)
        port, admin = free_port(), free_port()
        procs.append(
            subprocess.Popen(
                [
                    *cli,
                    "--config",
                    str(tmp),
                    "serve",
                    "--port",
                    str(port),
                    "--admin-port",
                    str(admin),
                ],
                env=env,
            )
        )
        wait_ready(f"http://127.0.0.1:{admin}/healthz")
        hooks = [f"http://127.0.0.1:{port}/webhooks/hubspot/bench-hs"]
        ids: list[str] = seeded["records"]
        step(hooks, ids[:per_phase], args.rate)  # warm-up
        hostile_url = f"http://127.0.0.1:{port}/webhooks/salesforce/bench-sf/{SF_SECRET}"
        probe = httpx.post(
            hostile_url, content=hostile_body(), headers={"Content-Type": "text/xml"}, timeout=30
        )
        rounds = []
        offset = per_phase
        for _ in range(args.rounds):
            # alone, then attacked, in turn: the machine's other load drifts between phases
            alone = step(hooks, ids[offset : offset + per_phase], args.rate)
            offset += per_phase
            sender = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "bench.hostile",
                    "--connections",
                    str(args.connections),
                    "--sender",
                    hostile_url,
                ],
                env=env,
            )
            try:
                time.sleep(2.0)  # let the hostile sender reach its pace
                before = refused_bodies(f"http://127.0.0.1:{admin}")
                attacked = step(hooks, ids[offset : offset + per_phase], args.rate)
                attacked["hostile_bodies"] = refused_bodies(f"http://127.0.0.1:{admin}") - before
                offset += per_phase
            finally:
                sender.terminate()
                sender.wait(15)
            rounds.append((alone, attacked))
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
        factory.drop_all()
        shutil.rmtree(tmp, ignore_errors=True)

    def figures(res: dict[str, Any]) -> dict[str, Any]:
        lat = res["ack_ms"]
        out = {
            "requests": len(lat),
            "errors": len(res["errors"]),
            "ack_p50_ms": round(pct(lat, 50), 2),
            "ack_p90_ms": round(pct(lat, 90), 2),
            "ack_p99_ms": round(pct(lat, 99), 2),
        }
        if "hostile_bodies" in res:  # parsed and refused while the phase ran
            out["hostile_bodies"] = res["hostile_bodies"]
        return out

    result = {
        "benchmark": "hostile",
        "command": "python -m bench.hostile " + " ".join(sys.argv[1:]),
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "rate": args.rate,
        "seconds": args.seconds,
        "hostile_connections": args.connections,
        "hostile_body_bytes": len(hostile_body()),
        "hostile_answer": [
            probe.status_code,
            probe.json()
            if probe.headers.get("content-type", "").startswith("application/json")
            else probe.text[:120],
        ],
        "rounds": [{"alone": figures(a), "attacked": figures(b)} for a, b in rounds],
    }
    alone_p50 = statistics.median(r["alone"]["ack_p50_ms"] for r in result["rounds"])
    attacked_p50 = statistics.median(r["attacked"]["ack_p50_ms"] for r in result["rounds"])
    result["alone_p50_ms"] = alone_p50
    result["attacked_p50_ms"] = attacked_p50
    result["p50_ratio"] = round(attacked_p50 / alone_p50, 2)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(
        json.dumps(
            {
                k: result[k]
                for k in (
                    "rounds",
                    "alone_p50_ms",
                    "attacked_p50_ms",
                    "p50_ratio",
                    "hostile_answer",
                )
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
