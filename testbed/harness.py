"""Concurrency harness shared by the tests and the benchmarks.

Workers are separate processes (forked from a fork server), each with its own connection,
released together by a barrier. Three ways to do the same work are measured side by side:

* ``project``/``project_batch``: the connector's own Router (per lead, or batched);
* ``ceiling``/``ceiling_batch``: the ONE-STATEMENT CEILING (``testbed/ceiling.sql``): the same
  work per lead (lead, team lock, pick, assignment, counts, outbox row, a compact decision
  row) as one prepared statement in autocommit, one round trip: what the project is compared
  against;
* ``ceiling_fn``: the same work as ``ceiling`` in a server-side function of two statements,
  still one round trip: no row lock on the members, so faster when leads queue for the team
  lock. The project is measured against the faster of the two;
* ``naive_caps``: **DELIBERATELY WRONG, kept to prove the cap test can fail.** The project's
  Router, except that each member's leads of the day and week are read before the team lock
  is taken (in their own snapshot), not under it: a cap counted outside the lock.
* ``naive``: **DELIBERATELY WRONG, kept to prove the tests can fail.** The seed article's
  first sample: ``ORDER BY last_assigned_at LIMIT 1 FOR UPDATE``, then ``last_assigned_at =
  NOW()``. At READ COMMITTED a waiter re-checks the row it waited for but does not re-sort,
  and NOW() is the transaction's start time, so concurrent transactions hand several leads to
  the same rep and skip others.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import resource
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from sqlalchemy import Engine, text

import db
from connector.core.config_loading import parse_config
from connector.routing.assign import Lead, Router
from connector.routing.availability import Window, periods
from connector.shell.store import make_engine

MODES = (
    "project",
    "project_batch",
    "ceiling",
    "ceiling_fn",
    "ceiling_batch",
    "naive",
    "naive_caps",
)
CEILING = Path(__file__).with_name("ceiling.sql")


def team_yaml(reps: int, weights: list[int] | None = None, org: str = "bench") -> str:
    weights = weights or [1] * reps
    members = "\n".join(
        f'      - {{crm_user_id: "005{i:015d}", name: "Rep {i}", weight: {w}}}'
        for i, w in enumerate(weights)
    )
    return f"""
org: {org}
crm:
  kind: salesforce
  instance_url: https://bench.my.salesforce.com
  auth: {{method: session, access_token: "${{BENCH_TOKEN}}"}}
  object: Lead
teams:
  - name: team
    members:
{members}
rules:
  - {{team: team}}
"""


ENV = {"BENCH_TOKEN": "unused"}
# record_assignments (the server's recorder) for a pick that uses no rotation credits, caps
# counters or decisions: the naive rotation's
NAIVE_RECORD = """
SELECT record_assignments(
    %(org)s, 'Lead', 'api', %(team_id)s, %(epoch)s, true, CAST(%(day)s AS date),
    CAST(%(day)s AS date), ARRAY[%(lead_id)s]::bigint[], ARRAY[%(member_id)s]::bigint[],
    ARRAY[(SELECT crm_user_id FROM members WHERE id = %(member_id)s)],
    ARRAY[%(crm_id)s]::text[], ARRAY[NULL]::text[], ARRAY[0], ARRAY['rule 0: default'],
    ARRAY[NULL]::integer[], NULL, '{}', '{}', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)
"""


@dataclass(frozen=True)
class Job:
    mode: str
    db_url: str
    yaml: str
    ids: list[str]
    batch: int = 1
    # the instant the workers judge caps, working hours and time off at (None: the clock)
    at: datetime.datetime | None = None
    # ceiling_batch only: CPU burnt in the worker before each batch, in milliseconds (the
    # client work a caller of the project does per batch, outside the team lock)
    burn_ms: float = 0.0


def _libpq_url(sqlalchemy_url: str) -> str:
    return sqlalchemy_url.replace("postgresql+psycopg://", "postgresql://", 1)


NAIVE_TABLE = """
CREATE TABLE IF NOT EXISTS naive_rotation (
    member_id        bigint PRIMARY KEY,
    last_assigned_at timestamptz NOT NULL DEFAULT '-infinity'
)
"""


def prepare_naive(db_url: str, org: str) -> None:
    """The naive rotation's own state: the seed article's round_robin_members table."""
    with psycopg.connect(_libpq_url(db_url)) as conn:
        conn.execute(NAIVE_TABLE)
        conn.execute(
            "INSERT INTO naive_rotation (member_id) SELECT m.id FROM members m "
            "JOIN teams t ON t.id = m.team_id WHERE t.org = %s AND m.active "
            "ON CONFLICT DO NOTHING",
            (org,),
        )


def prepare_ceiling_fn(db_url: str) -> None:
    """The two-statement ceiling's function (testbed/ceiling.sql ``one_fn_setup``)."""
    setup = db.parse_named(CEILING.read_text(encoding="utf-8"))["one_fn_setup"]
    with psycopg.connect(_libpq_url(db_url), autocommit=True) as conn:
        conn.execute(setup.encode())


def _naive_assign(conn: psycopg.Connection[Any], org: str, crm_id: str) -> None:
    """THE NAIVE ROTATION (wrong on purpose), exactly the seed article's first sample:
    ORDER BY last_assigned_at LIMIT 1 FOR UPDATE, then last_assigned_at = NOW(). A waiter
    re-checks the row it waited for but does not re-sort, and NOW() is its transaction's
    start, so a rep can come straight back to the front of the line."""
    with conn.transaction():
        row = conn.execute(
            "INSERT INTO leads (org, crm_object, crm_id, fields, source) "
            "VALUES (%s, 'Lead', %s, '{}', 'api') ON CONFLICT DO NOTHING RETURNING id",
            (org, crm_id),
        ).fetchone()
        if row is None:
            return
        team_id, epoch = conn.execute(
            "SELECT id, epoch FROM teams WHERE org = %s AND name = 'team'", (org,)
        ).fetchone()
        member_id = conn.execute(
            "SELECT member_id FROM naive_rotation ORDER BY last_assigned_at LIMIT 1 FOR UPDATE"
        ).fetchone()[0]
        conn.execute(
            "UPDATE naive_rotation SET last_assigned_at = NOW() WHERE member_id = %s",
            (member_id,),
        )
        conn.execute(
            NAIVE_RECORD,
            {
                "org": org,
                "team_id": team_id,
                "epoch": epoch,
                "day": datetime.date(2000, 1, 3),
                "lead_id": row[0],
                "member_id": member_id,
                "crm_id": crm_id,
            },
        )


def _psycopg_sql(sql: str) -> str:
    """Named SQL uses :name binds (SQLAlchemy); psycopg wants %(name)s."""
    import re

    return re.sub(r"(?<![:\w]):([a-z_]+)\b(?!:)", r"%(\1)s", sql)


class CeilingRouter:
    """The one-statement ceiling: each call is ONE prepared statement in autocommit."""

    def __init__(self, conn: psycopg.Connection[Any], org: str) -> None:
        conn.autocommit = True
        self.conn, self.org = conn, org
        text_ = CEILING.read_text(encoding="utf-8")
        self.sql = {k: _psycopg_sql(v) for k, v in db.parse_named(text_).items()}
        day = periods(datetime.datetime.now(datetime.UTC), "UTC")
        self.params: dict[str, Any] = {"org": org, "team": "team", "day": day.day}
        self.params["week"] = day.week

    def assign(self, crm_id: str) -> None:
        self.conn.execute(self.sql["one"], {**self.params, "crm_id": crm_id}, prepare=True)

    def assign_fn(self, crm_id: str) -> None:
        self.conn.execute(self.sql["one_fn"], {**self.params, "crm_id": crm_id}, prepare=True)

    def assign_batch(self, crm_ids: list[str]) -> None:
        self.conn.execute(self.sql["batch"], {**self.params, "crm_ids": crm_ids}, prepare=True)


class NaiveCapsRouter(Router):
    """A CAP COUNTED OUTSIDE THE LOCK (wrong on purpose): the day and week counts are read in
    a separate snapshot before the batch's call, and a rep found at its cap there is kept
    from the lead in the call's inputs (as if away), with no cap left for the server to
    check under the lock: so concurrent workers all see a rep below its cap and all give it
    a lead. Every lead takes the batch's plan (one lead of it is a batch of one)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.configured = dict(self.teams)

    def _single_params(self, lead: Any, source: str) -> None:
        return None

    def assign_in_deferred(self, conn: Any, leads: Any, source: str) -> Any:
        now = self.clock()
        with self.engine.connect() as other:
            day = periods(now, "UTC")
            stale = {
                r.crm_user_id: (r.day, r.week)
                for r in other.execute(
                    text(
                        "SELECT m.crm_user_id, "
                        "coalesce(sum(l.assigned) FILTER (WHERE period = 'day'), 0) AS day, "
                        "coalesce(sum(l.assigned) FILTER (WHERE period = 'week'), 0) AS week "
                        "FROM member_load l JOIN members m ON m.id = l.member_id "
                        "WHERE (period = 'day' AND starts_on = :day) "
                        "OR (period = 'week' AND starts_on = :week) GROUP BY m.crm_user_id"
                    ),
                    {"day": day.day, "week": day.week},
                )
            }
        always = (Window(now - datetime.timedelta(days=1), now + datetime.timedelta(days=1)),)
        for name, inputs in self.configured.items():
            full = [
                (d is not None and stale.get(u, (0, 0))[0] >= d)
                or (w is not None and stale.get(u, (0, 0))[1] >= w)
                for u, d, w in zip(inputs.users, inputs.per_day, inputs.per_week, strict=True)
            ]
            self.teams[name] = dataclasses.replace(
                inputs,
                windows=tuple(
                    always if f else ws for f, ws in zip(full, inputs.windows, strict=True)
                ),
                per_day=(None,) * len(inputs.users),
                per_week=(None,) * len(inputs.users),
                team_per_day=None,
                team_per_week=None,
                unscheduled=False,
            )
        return super().assign_in_deferred(conn, leads, source)


def _backend_cpu(pid: int | None) -> float | None:
    """CPU seconds (user + system) a server process has used so far, read from /proc: only
    when the server runs on this machine and its processes are readable, else None. A
    server in a container reports pids of its own namespace, which here may name another
    process: a pid whose command line is not a postgres process's counts as unreadable."""
    if pid is None:
        return None
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii")
    except OSError:
        return None
    if not cmdline.startswith(b"postgres"):
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class CpuMeter:
    """The CPU a worker's share costs: its own process (``time.process_time``) and its
    server process's, between ``start`` (after the barrier) and ``stop``."""

    def __init__(self, backend_pid: int | None) -> None:
        self.backend_pid = backend_pid
        self.client = 0.0
        self.server: float | None = None

    def start(self) -> None:
        self._client0 = time.process_time()
        self._server0 = _backend_cpu(self.backend_pid)

    def stop(self) -> None:
        self.client = time.process_time() - self._client0
        end = _backend_cpu(self.backend_pid)
        if self._server0 is not None and end is not None:
            self.server = end - self._server0


def _burn(seconds: float) -> None:
    """Spend ``seconds`` of this process's CPU."""
    until = time.process_time() + seconds
    while time.process_time() < until:
        pass


def worker(job: Job, barrier: Any, out: Any) -> None:
    """Run one worker's share; report (latencies in seconds, error text or None, client CPU
    seconds, server CPU seconds or None)."""
    latencies: list[float] = []
    meter = CpuMeter(None)
    try:
        cfg = parse_config(job.yaml, "bench.yaml", ENV)
        if job.mode in ("project", "project_batch", "naive_caps"):
            engine = make_engine(job.db_url, pool_size=2)
            at = job.at
            clock = (lambda: at) if at is not None else None
            kind = NaiveCapsRouter if job.mode == "naive_caps" else Router
            router = kind(engine, cfg, clock=clock)
            with engine.connect() as c:  # the pooled connection the share will reuse
                meter = CpuMeter(c.execute(text("SELECT pg_backend_pid()")).scalar_one())
            barrier.wait()
            meter.start()
            step = job.batch if job.mode == "project_batch" else 1
            for i in range(0, len(job.ids), step):
                chunk = job.ids[i : i + step]
                t0 = time.perf_counter()
                if step == 1:
                    router.assign(Lead(chunk[0], {}), "api")
                else:
                    router.assign_many([Lead(x, {}) for x in chunk], "import")
                latencies.append(time.perf_counter() - t0)
            meter.stop()
            engine.dispose()
        elif job.mode in ("ceiling", "ceiling_fn", "ceiling_batch"):
            with psycopg.connect(_libpq_url(job.db_url)) as conn:
                ceiling = CeilingRouter(conn, cfg.org)
                meter = CpuMeter(conn.info.backend_pid)
                barrier.wait()
                meter.start()
                step = job.batch if job.mode == "ceiling_batch" else 1
                for i in range(0, len(job.ids), step):
                    t0 = time.perf_counter()
                    if job.mode == "ceiling_fn":
                        ceiling.assign_fn(job.ids[i])
                    elif step == 1:
                        ceiling.assign(job.ids[i])
                    else:
                        if job.burn_ms:
                            _burn(job.burn_ms / 1000)
                        ceiling.assign_batch(job.ids[i : i + step])
                    latencies.append(time.perf_counter() - t0)
                meter.stop()
        else:
            with psycopg.connect(_libpq_url(job.db_url)) as conn:
                meter = CpuMeter(conn.info.backend_pid)
                barrier.wait()
                meter.start()
                for crm_id in job.ids:
                    t0 = time.perf_counter()
                    _naive_assign(conn, cfg.org, crm_id)
                    latencies.append(time.perf_counter() - t0)
                meter.stop()
        out.put((latencies, None, meter.client, meter.server))
    except Exception as exc:  # reported to the parent, which fails loudly
        out.put((latencies, f"{type(exc).__name__}: {exc}", meter.client, meter.server))


@dataclass(frozen=True)
class RunResult:
    mode: str
    workers: int
    leads: int
    seconds: float
    latencies: list[float]
    errors: list[str]
    # CPU seconds all workers' processes used in the timed part, and their server
    # processes' (None when the server's processes cannot be read from this machine)
    client_cpu: float = 0.0
    server_cpu: float | None = None

    @property
    def leads_per_s(self) -> float:
        return self.leads / self.seconds if self.seconds else 0.0

    def percentile(self, p: float) -> float:
        if not self.latencies:
            return 0.0
        xs = sorted(self.latencies)
        return xs[min(len(xs) - 1, int(p / 100 * len(xs)))]


def worker_context() -> Any:
    """Workers are forked from a fork server that imported this module once (no connection,
    no thread, no engine: nothing a child could share by accident), so starting 32 of them
    costs milliseconds, not 32 interpreter starts (about 0.8 s of CPU each). It is the fork
    server of testbed/processes.py (a process has one), which imports this module too."""
    from testbed.processes import fork_context

    return fork_context()


def run(
    mode: str,
    db_url: str,
    yaml_text: str,
    ids: list[str],
    workers: int,
    batch: int = 1,
    at: datetime.datetime | None = None,
    burn_ms: float = 0.0,
) -> RunResult:
    """Split ``ids`` over ``workers`` processes and run them at once."""
    if mode == "naive":
        prepare_naive(db_url, parse_config(yaml_text, "bench.yaml", ENV).org)
    if mode == "ceiling_fn":
        prepare_ceiling_fn(db_url)
    ctx = worker_context()
    barrier = ctx.Barrier(workers + 1)
    out = ctx.Queue()
    shares = [ids[i::workers] for i in range(workers)]
    procs = [
        ctx.Process(
            target=worker, args=(Job(mode, db_url, yaml_text, s, batch, at, burn_ms), barrier, out)
        )
        for s in shares
    ]
    for p in procs:
        p.start()
    barrier.wait(timeout=300)
    t0 = time.perf_counter()
    results = [out.get(timeout=900) for _ in procs]
    seconds = time.perf_counter() - t0
    for p in procs:
        p.join(timeout=60)
    lat = [x for r in results for x in r[0]]
    errs = [r[1] for r in results if r[1]]
    server = [r[3] for r in results]
    return RunResult(
        mode,
        workers,
        len(ids),
        seconds,
        lat,
        errs,
        client_cpu=sum(r[2] for r in results),
        server_cpu=None if None in server else sum(x for x in server if x is not None),
    )


@dataclass(frozen=True)
class PgbenchResult:
    """A pgbench run of the one-statement ceiling: its rate and the CPU pgbench used."""

    leads: int
    seconds: float
    client_cpu: float

    @property
    def leads_per_s(self) -> float:
        return self.leads / self.seconds if self.seconds else 0.0


def pgbench_script() -> str:
    """The one-statement ceiling (testbed/ceiling.sql ``one``) as a pgbench script: the same
    text, its parameters pgbench variables. Each lead's CRM id is a random 18-digit number:
    a repeat would be a no-op the count after the run (``fairness``) shows."""
    one = db.parse_named(CEILING.read_text(encoding="utf-8"))["one"]
    return "\\set crm_id random(100000000000000000, 999999999999999999)\n" + one + ";\n"


def run_pgbench(
    db_url: str, org: str, team: str, leads: int, workers: int, at: datetime.date
) -> PgbenchResult:
    """The ceiling sent by pgbench's C client (prepared, one statement a transaction), so
    that no Python client's CPU is in its figure: ``workers`` connections and threads,
    ``leads // workers`` transactions each. Raises when pgbench fails."""
    per = leads // workers
    week = at - datetime.timedelta(days=at.weekday())
    with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as f:
        f.write(pgbench_script())
        script = f.name
    try:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        done = subprocess.run(
            [
                "pgbench", "-n", "-M", "prepared", "-c", str(workers), "-j", str(workers),
                "-t", str(per), "-f", script,
                "-D", f"org={org}", "-D", f"team={team}",
                "-D", f"day={at.isoformat()}", "-D", f"week={week.isoformat()}",
                _libpq_url(db_url),
            ],
            capture_output=True, text=True, timeout=900, check=False,
        )  # fmt: skip
        seconds = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    finally:
        os.unlink(script)
    if done.returncode != 0:
        raise RuntimeError(f"pgbench failed ({done.returncode}): {done.stderr.strip()[-500:]}")
    # pgbench's own figure, without its connection set-up; the wall clock is the fallback
    for line in done.stdout.splitlines():
        if line.startswith("tps = ") and "without initial connection time" in line:
            seconds = per * workers / float(line.split()[2])
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return PgbenchResult(per * workers, seconds, cpu)


def fairness(engine: Engine, org: str) -> dict[str, Any]:
    """Check the guarantee in SQL: spread, weighted lag, double owners, owners that disagree
    with their member (or an owner write with its assignment), outbox rows."""
    with engine.connect() as conn:
        counts = conn.execute(
            text(
                "SELECT m.weight, count(a.id) FROM members m JOIN teams t ON t.id = m.team_id "
                "LEFT JOIN assignments a ON a.member_id = m.id "
                "WHERE t.org = :org AND m.active GROUP BY m.id, m.weight ORDER BY m.id"
            ),
            {"org": org},
        ).all()
        leads = conn.execute(
            text("SELECT count(*) FROM leads WHERE org = :org"), {"org": org}
        ).scalar_one()
        assigned = conn.execute(
            text("SELECT count(DISTINCT lead_id) FROM assignments WHERE org = :org"), {"org": org}
        ).scalar_one()
        multi = conn.execute(
            text(
                "SELECT count(*) FROM (SELECT lead_id FROM assignments WHERE org = :org "
                "GROUP BY lead_id HAVING count(*) > 1) x"
            ),
            {"org": org},
        ).scalar_one()
        outbox = conn.execute(
            text("SELECT count(*), count(DISTINCT lead_id) FROM outbox WHERE org = :org"),
            {"org": org},
        ).one()
        # the recorder is given each lead's owner beside its member: they must agree, and
        # the owner write must carry the assignment's owner
        mismatched = conn.execute(
            text(
                "SELECT (SELECT count(*) FROM assignments a"
                "        JOIN members m ON m.id = a.member_id"
                "        WHERE a.org = :org AND a.crm_user_id <> m.crm_user_id)"
                "     + (SELECT count(*) FROM outbox o"
                "        JOIN assignments a ON a.id = o.assignment_id"
                "        WHERE o.org = :org AND o.owner_id <> a.crm_user_id)"
            ),
            {"org": org},
        ).scalar_one()
    weights = [w for w, _ in counts]
    ns = [n for _, n in counts]
    total_w, n = sum(weights), sum(ns)
    lag = max(
        (abs(c * total_w - n * w) / total_w for w, c in zip(weights, ns, strict=True)), default=0.0
    )
    return {
        "leads": leads,
        "assigned": assigned,
        "counts": ns,
        "spread": (max(ns) - min(ns)) if ns else 0,
        "max_lag": lag,
        "double_owners": multi,
        "owner_mismatches": mismatched,
        "outbox_rows": outbox[0],
        "outbox_leads": outbox[1],
    }


def owner_counts(engine: Engine, org: str) -> dict[str, int]:
    """Leads per rep (crm_user_id), every configured member listed."""
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT m.crm_user_id, count(a.id) FROM members m JOIN teams t ON t.id = m.team_id "
                "LEFT JOIN assignments a ON a.member_id = m.id WHERE t.org = :org "
                "GROUP BY m.crm_user_id ORDER BY 1"
            ),
            {"org": org},
        ).all()
    return {r[0]: r[1] for r in rows}


def as_json(obj: Any) -> str:
    return json.dumps(obj, indent=2, sort_keys=True)
