"""Benchmark: the server's instructions per lead, counted by valgrind (callgrind), which do not
move with the machine's load as seconds do.

Two single-lead statements are each run as a prepared statement, ``--calls LO,HI`` times
(default 200 and 1,200), in ``postgres --single`` under ``valgrind --tool=callgrind``, every
call its own transaction:

* ``project``: the router's one call for a new lead (``route_new_lead``, db/routing.sql), with
  the parameters ``Router`` sends for a lead of the bench's rule;
* ``ceiling``: the one-statement ceiling (testbed/ceiling.sql ``one``), the same work without
  rules, caps or availability.

Both run in a fresh cluster whose database the project migrated and gave the bench's team (10
equal reps, ``testbed.harness.team_yaml``), not analyzed, as ``bench.assign``'s databases are.
Per call = (total at HI - total at LO) / (HI - LO): start-up and the first calls' planning
cancel out. Prints both and their ratio; writes bench/results/instructions.json.

Needs valgrind and PostgreSQL's server programs (``initdb``, ``pg_ctl``, ``postgres``: on
PATH, else in ``pg_config --bindir``, else the newest /usr/lib/postgresql/*/bin). PostgreSQL
does not run as root: run as root, the cluster belongs to the user ``BENCH_PG_USER`` (default
``postgres``) and its programs run as that user (``runuser``).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import pwd
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg

import db
from connector.core.config_loading import parse_config
from connector.routing.assign import _ROUTE_LEAD, Lead, Router
from connector.routing.teams import apply_teams
from connector.shell.migrations import migrate
from connector.shell.store import make_engine
from testbed.harness import CEILING, ENV, team_yaml

RESULTS = Path(__file__).parent / "results"
MARK = "bench-crm-id-placeholder"


def server_bindir() -> Path:
    found = shutil.which("initdb")
    if found:
        return Path(found).resolve().parent
    if shutil.which("pg_config"):
        out = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True)
        if out.returncode == 0 and (Path(out.stdout.strip()) / "initdb").exists():
            return Path(out.stdout.strip())
    dirs = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda d: int(d.split("/")[-2]))
    if dirs:
        return Path(dirs[-1])
    raise SystemExit("bench.instructions: PostgreSQL's initdb is not on this machine")


class Cluster:
    """A throw-away cluster in ``root``, owned by ``user`` when this runs as root."""

    def __init__(self, root: Path, bindir: Path) -> None:
        self.root = root
        self.bin = bindir
        self.data = root / "data"
        self.port = 5432  # its socket only, in root: no other server can hold it
        self.user = os.environ.get("BENCH_PG_USER", "postgres") if os.geteuid() == 0 else None
        if self.user is not None:
            pw = pwd.getpwnam(self.user)
            os.chown(root, pw.pw_uid, pw.pw_gid)

    def as_owner(self, argv: list[str]) -> list[str]:
        return ["runuser", "-u", self.user, "--", *argv] if self.user else argv

    def run(self, argv: list[str], **kwargs: Any) -> None:
        subprocess.run(self.as_owner(argv), check=True, **kwargs)

    def init(self) -> None:
        self.run(
            [str(self.bin / "initdb"), "-D", str(self.data), "-A", "trust", "-U", "bench"],
            stdout=subprocess.DEVNULL,
        )

    def start(self) -> None:
        opts = f"-p {self.port} -k {self.root} -c listen_addresses='' -c autovacuum=off"
        self.run(
            [str(self.bin / "pg_ctl"), "-D", str(self.data), "-o", opts, "-w", "start"],
            stdout=subprocess.DEVNULL,
        )

    def stop(self) -> None:
        self.run([str(self.bin / "pg_ctl"), "-D", str(self.data), "-w", "stop"],
                 stdout=subprocess.DEVNULL)  # fmt: skip

    def url(self, database: str) -> str:
        return f"postgresql://bench@/{database}?host={self.root}&port={self.port}"


def prepared_scripts(cluster: Cluster, low: int, high: int) -> dict[str, dict[int, str]]:
    """Migrate a database, give it the bench's team, and write each statement's scripts:
    PREPARE, then ``n`` EXECUTEs with new CRM ids, one line each (one transaction each)."""
    with psycopg.connect(cluster.url("postgres"), autocommit=True) as conn:
        conn.execute("CREATE DATABASE bench")
    engine = make_engine(cluster.url("bench"), pool_size=1)
    try:
        migrate(engine)
        cfg = parse_config(team_yaml(10), "bench.yaml", ENV)
        apply_teams(engine, cfg)
        params = Router(engine, cfg)._single_params(Lead(MARK, {}), "api")
        assert params is not None, "the bench's rule routes to its team"
        params["crm_id"] = MARK
        today = params["day"]
        ceiling = db.pyformat(db.parse_named(CEILING.read_text(encoding="utf-8"))["one"])
        ceiling_params = {"org": cfg.org, "team": "team", "day": today, "week": today,
                          "crm_id": MARK}  # fmt: skip
        with psycopg.connect(cluster.url("bench")) as conn:
            cur = psycopg.ClientCursor(conn)
            bodies = {
                "project": cur.mogrify(_ROUTE_LEAD, params),
                "ceiling": cur.mogrify(ceiling, ceiling_params),
            }
    finally:
        engine.dispose()
    scripts: dict[str, dict[int, str]] = {}
    for name, body in bodies.items():
        one_line = " ".join(
            line for line in body.splitlines() if not line.lstrip().startswith("--")
        ).replace(f"'{MARK}'", "$1")
        one_line = re.sub(r"\s+", " ", one_line)
        assert "$1" in one_line, name
        scripts[name] = {}
        for n in (low, high):
            path = cluster.root / f"{name}-{n}.sql"
            lines = [f"PREPARE lead(text) AS {one_line};"]
            lines += [f"EXECUTE lead('00Q{name[:2]}{i:013d}');" for i in range(n)]
            path.write_text("\n".join(lines) + "\n", encoding="utf-8")
            scripts[name][n] = str(path)
    return scripts


def instructions(cluster: Cluster, script: str, label: str) -> int:
    """Callgrind's total for one single-user run of ``script`` in a copy of the cluster."""
    copy = cluster.root / "run"
    if copy.exists():
        shutil.rmtree(copy)
    cluster.run(["cp", "-a", str(cluster.data), str(copy)])
    out = cluster.root / f"{label}.callgrind"
    with open(script, "rb") as stdin:
        done = subprocess.run(
            cluster.as_owner(
                [
                    "valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
                    str(cluster.bin / "postgres"), "--single", "-D", str(copy),
                    "-c", "autovacuum=off", "bench",
                ]
            ),
            stdin=stdin, capture_output=True, text=True, check=False,
        )  # fmt: skip
    if "ERROR" in done.stdout:
        raise SystemExit(f"{label}: the statement failed: {done.stdout[-800:]}")
    for line in out.read_text(encoding="utf-8").splitlines():
        if line.startswith(("totals:", "summary:")):
            return int(line.split()[1])
    raise SystemExit(f"{label}: no total in callgrind's output ({done.stderr[-400:]})")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", default="200,1200", metavar="LO,HI",
                    help="the two run lengths whose difference is measured")  # fmt: skip
    args = ap.parse_args()
    low, high = (int(x) for x in args.calls.split(","))
    if not 0 < low < high:
        ap.error("--calls: LO and HI with 0 < LO < HI")
    if not shutil.which("valgrind"):
        raise SystemExit("bench.instructions: valgrind is not on this machine")
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="bench-instr-") as tmp:
        root = Path(tmp)
        root.chmod(0o755)
        cluster = Cluster(root, server_bindir())
        cluster.init()
        cluster.start()
        try:
            scripts = prepared_scripts(cluster, low, high)
        finally:
            cluster.stop()
        per_call: dict[str, float] = {}
        for name, runs in scripts.items():
            totals = {n: instructions(cluster, path, f"{name}-{n}") for n, path in runs.items()}
            per_call[name] = (totals[high] - totals[low]) / (high - low)
            print(f"{name:<8} {per_call[name] / 1e6:6.3f} M instructions per lead", flush=True)
    ratio = round(per_call["project"] / per_call["ceiling"], 3)
    print(f"project / ceiling: {ratio}")
    RESULTS.mkdir(exist_ok=True)
    out = {
        "benchmark": "instructions",
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "postgres": str(server_bindir()),
        "calls": [low, high],
        "per_lead": {k: round(v) for k, v in per_call.items()},
        "project_vs_ceiling": ratio,
        "seconds_total": round(time.time() - t0, 1),
    }
    path = RESULTS / "instructions.json"
    path.write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
