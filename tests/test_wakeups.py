"""Dispatchers in another process are woken through PostgreSQL (connector/writeback/wakeups.py):
announcements reach the listening process's dispatchers of that org only, the listener comes
back after its connection is killed (and catches up), a failed announcement is only logged,
and a dispatcher whose cycle is an hour away writes an announced round at once."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest
from sqlalchemy import Engine, text

from connector.core import outage
from connector.core.crm_kinds import org_pacing
from connector.core.database import create_engine
from connector.core.pacing import Nudges, Spacer
from connector.routing.assign import Lead, Router
from connector.routing.teams import apply_teams
from connector.shell import service as service_module
from connector.shell.service import run_dispatch_service
from connector.writeback.wakeups import OutboxListener, announce, listener_for
from testbed.waiting import wait_until
from tests.helpers.faults import (
    Proc,
    RecordingHubSpot,
    TwoOrgs,
    assert_clean_logs,
    connector_env,
    hubspot_events,
    post_hubspot,
    service,
)
from tests.helpers.memory_orgs import ORG, memory_org
from tests.helpers.ports import free_port

DEADLINE = 20.0  # a hang's limit, not a measured time


@pytest.fixture
def stop() -> Iterator[threading.Event]:
    event = threading.Event()
    yield event
    event.set()


def _listening(
    engine: Engine, nudges: Nudges, orgs: list[str], stop: threading.Event
) -> tuple[OutboxListener, threading.Thread]:
    listener = listener_for(engine, nudges, orgs)
    thread = listener.start(stop)
    assert listener.listening.wait(DEADLINE), "the listener never listened"
    return listener, thread


def test_an_announcement_nudges_the_dispatchers_of_its_org_only(
    engine: Engine, stop: threading.Event
) -> None:
    nudges = Nudges()
    a, b = nudges.listener("a"), nudges.listener("b")
    listener, thread = _listening(engine, nudges, ["a", "b"], stop)
    # On connecting it nudges every org once (what was announced while nobody listened).
    assert a.wait(DEADLINE) and b.wait(DEADLINE)
    a.clear()
    b.clear()
    announce(engine, "not-dispatched-here")
    announce(engine, "b")
    assert b.wait(DEADLINE), "the announcement of b never nudged b's dispatcher"
    # Notifications arrive in commit order: the one for another org came first, and did nothing.
    assert not a.is_set()
    stop.set()
    thread.join(DEADLINE)
    assert not thread.is_alive() and not listener.listening.is_set()


def test_the_listener_comes_back_after_its_connection_is_killed_and_catches_up(
    engine: Engine, stop: threading.Event, caplog: pytest.LogCaptureFixture
) -> None:
    nudges = Nudges()
    a = nudges.listener("a")
    listener, _ = _listening(engine, nudges, ["a"], stop)
    first = listener.notifications.backend_pid()
    assert first is not None
    a.wait(DEADLINE)
    a.clear()
    with caplog.at_level(logging.WARNING, logger="connector.writeback.wakeups"):
        with engine.begin() as conn:
            assert conn.execute(text("SELECT pg_terminate_backend(:p)"), {"p": first}).scalar()
        wait_until(lambda: listener.connects >= 2, DEADLINE, "the listener to connect again")
    assert listener.notifications.backend_pid() not in (None, first)
    assert any("outbox listener" in r.getMessage() for r in caplog.records)
    # It nudged once on coming back: an announcement made while it was away is not waited for.
    assert a.wait(DEADLINE)
    a.clear()
    wait_until(listener.listening.is_set, DEADLINE, "the listener to listen again")
    announce(engine, "a")
    assert a.wait(DEADLINE), "an announcement after the reconnect never arrived"


def test_a_failed_announcement_is_logged_and_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    dead = create_engine(
        f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/nowhere",
        connect_args={"connect_timeout": 2},
    )
    outage.DATABASE.recovered()  # (a test before may have left this process's record down)
    try:
        with caplog.at_level(logging.WARNING):
            announce(dead, "a")  # nothing listens there and nothing is raised
    finally:
        dead.dispose()
        down = outage.DATABASE.down_since is not None
        outage.DATABASE.recovered()
    # an outage: counted and logged once by the process's outage record (core/outage.py)
    assert down
    assert not [r for r in caplog.records if r.name == "connector.writeback.wakeups"]
    [record] = [r for r in caplog.records if r.name == "connector.database"][:1]
    assert record.getMessage().startswith("database unavailable (wake-up announcements: ")


def test_a_dispatcher_an_hour_from_its_cycle_writes_an_announced_round(
    engine: Engine, stop: threading.Event
) -> None:
    """The `connector dispatch` wiring: without the announcement (or without the listener)
    the owners wait for the dispatcher's next cycle, an hour away, and this test fails."""
    org = memory_org(engine, "hubspot")
    nudges = Nudges()
    dispatcher = org.dispatcher(spacer=Spacer(3600.0), nudge=nudges.listener(ORG))
    probe = nudges.listener(ORG)
    rounds: list[int] = []
    worker = threading.Thread(
        target=dispatcher.run_forever,
        kwargs={"stop": stop, "on_stats": lambda s: rounds.append(s.claimed)},
        daemon=True,
    )
    _listening(engine, nudges, [ORG], stop)
    assert probe.wait(DEADLINE)  # the listener's catch-up nudge is behind us
    worker.start()
    # Its first round (that nudge) finds nothing; its next turn is an hour away.
    wait_until(lambda: len(rounds) >= 1, DEADLINE, "the dispatcher's first round")
    ids = org.route(5)
    assert org.states() == {"pending": 5}
    announce(engine, ORG)
    wait_until(lambda: org.states() == {"sent": 5}, DEADLINE, "the announced owners written")
    assert {org.crm.owner_of(i) for i in ids} <= set(org.reps)
    stop.set()
    nudges.wake_all()
    worker.join(DEADLINE)


@pytest.mark.slow
@pytest.mark.two_orgs(poll=False)
def test_serve_announces_and_a_dispatch_process_writes_the_owners(
    engine: Engine, db_url: str, tmp_path: Path, two_orgs: TwoOrgs
) -> None:
    """The two processes end to end: signed webhooks to `connector serve`, which announces
    the routed round (heard here too), owners written by `connector dispatch`, whose
    listener is connected while it runs; both stop cleanly. The dispatch process's /healthz
    says ok only once its listener has run its LISTEN, and its /metrics counts its CRM
    writes."""
    hs = two_orgs.hs
    ids = [hs.add_record("contacts", properties={"country": "Canada"}) for _ in range(3)]
    env = connector_env(db_url)
    admin = free_port()
    dispatch = Proc(
        "dispatch",
        ["--config", str(two_orgs.config_dir), "dispatch", "--admin-port", str(admin)],
        env,
        tmp_path,
        admin_port=admin,
    ).start()
    dispatch.wait_healthy()
    assert _listening_now(engine) == 1  # ready means listening: no announcement is lost
    serve = service("serve", "serve", two_orgs.config_dir, env, tmp_path).start()
    heard: psycopg.Connection[tuple[object, ...]] | None = None
    try:
        heard = psycopg.connect(engine.url.set(drivername="postgresql").render_as_string(False))
        heard.autocommit = True
        heard.execute("LISTEN lrc_outbox_ready")
        serve.wait_healthy()
        wait_until(lambda: _listeners(engine) == 1, 60, "the dispatch process's listener")
        with httpx.Client(timeout=10) as client:
            url = serve.url + "/webhooks/hubspot/demo-hs"
            assert post_hubspot(client, url, hubspot_events(ids, 70_000)) == 200
        payloads = [n.payload for n in heard.notifies(timeout=DEADLINE, stop_after=1)]
        assert payloads and set(payloads) == {"demo-hs"}, payloads
        wait_until(
            lambda: {_owner(hs, i) for i in ids} <= set(two_orgs.owners),
            DEADLINE,
            "the owners written back",
        )
        # the dispatcher counts its calls once its round has committed, after the CRM write
        wait_until(
            lambda: (
                'connector_crm_calls_total{operation="write_owners",org="demo-hs"}'
                in httpx.get(f"{dispatch.admin_url}/metrics", timeout=10).text
            ),
            DEADLINE,
            "the dispatch process's metrics to count its writes",
        )
        scrape = httpx.get(f"{dispatch.admin_url}/metrics", timeout=10).text
        assert 'connector_outbox_depth{org="demo-hs",state="pending"} 0.0' in scrape
    finally:
        if heard is not None:
            heard.close()
        codes = [serve.stop(), dispatch.stop()]
    assert codes == [0, 0]
    wait_until(lambda: _listeners(engine) == 0, DEADLINE, "the listener's connection closed")
    assert_clean_logs([*serve.logs, *dispatch.logs])


def _owner(hs: RecordingHubSpot, rid: str) -> str | None:
    record = hs.get_record(rid)
    return None if record is None else record["properties"].get("hubspot_owner_id")


def _listening_now(engine: Engine) -> int:
    """Listener connections whose LISTEN has run (their last statement)."""
    return _listeners(engine, "AND query ILIKE 'LISTEN%'")


def _listeners(engine: Engine, and_also: str = "") -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND application_name = 'lrc-outbox-listener' " + and_also
                )
            ).scalar_one()
        )


class _Watch:
    """Tells when the dispatcher of a nudge event waits for a nudge alone: a wait longer than
    5 s is one for the next turn of an 18.75 s cycle."""

    def __init__(self, event: threading.Event) -> None:
        self.event = event
        self.waiting_long = False
        self._wait = event.wait
        setattr(event, "wait", self.wait)  # noqa: B010 (the dispatcher calls event.wait)

    def wait(self, timeout: float | None = None) -> bool:
        long = timeout is None or timeout > 5.0
        self.waiting_long = long
        try:
            return self._wait(timeout)
        finally:
            if long:
                self.waiting_long = False


class _ObservedNudges(Nudges):
    """Counts nudges per org and watches each dispatcher's event; the first ``fail`` nudges
    raise (a bug in what they wake)."""

    def __init__(self, fail: int = 0) -> None:
        super().__init__()
        self.counts: dict[str, int] = {}
        self.watched: list[_Watch] = []
        self.fail = fail

    def listener(self, org: str) -> threading.Event:
        event = super().listener(org)
        self.watched.append(_Watch(event))
        return event

    def nudge(self, org: str) -> None:
        if self.fail > 0:
            self.fail -= 1
            raise RuntimeError("a nudge that fails")
        self.counts[org] = self.counts.get(org, 0) + 1
        super().nudge(org)


@pytest.mark.two_orgs(poll=False)
def test_the_dispatch_service_wires_its_listener_to_its_dispatchers(
    engine: Engine, two_orgs: TwoOrgs, stop: threading.Event, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`run_dispatch_service`, as `connector dispatch` runs it, with the HubSpot org's budget
    at 2 calls per 10 s: a cycle of 18.75 s. The leads are routed once the listener has
    caught up and the dispatcher waits for its next turn, so only the announcement can start
    the round that writes them within 9 s (checked: with `announce` doing nothing, or
    without `nudges` passed to the dispatchers, this test fails)."""
    path = two_orgs.config_dir / "hs.yaml"
    path.write_text(path.read_text().replace("limit_per_10s: 100", "limit_per_10s: 2"))
    cfg = two_orgs.configs["demo-hs"]
    assert org_pacing(cfg.crm).cycle_s > 2 * 9.0
    apply_teams(engine, cfg)
    hs = two_orgs.hs
    ids = [hs.add_record("contacts", properties={"country": "Canada"}) for _ in range(3)]
    made: list[_ObservedNudges] = []

    def nudges() -> _ObservedNudges:
        made.append(_ObservedNudges())
        return made[-1]

    monkeypatch.setattr(service_module, "Nudges", nudges)
    service = threading.Thread(
        target=run_dispatch_service,
        args=(engine, {cfg.org: cfg}),
        kwargs={"stop": stop, "per_org": 1},
        daemon=True,
    )
    service.start()

    def settled() -> bool:
        # the listener's catch-up nudge is out, and the dispatcher is past the rounds it may
        # start (its first turn, that nudge) and waits for its next turn or a nudge
        if not made or made[0].counts.get(cfg.org, 0) < 1 or len(made[0].watched) != 1:
            return False
        watch = made[0].watched[0]
        return watch.waiting_long and not watch.event.is_set()

    wait_until(settled, DEADLINE, "the dispatcher to wait for its next turn")
    Router(engine, cfg).assign_many([Lead(i, {"country": "Canada"}) for i in ids], "import")
    announce(engine, cfg.org)
    wait_until(
        lambda: {_owner(hs, i) for i in ids} <= set(two_orgs.owners),
        9.0,  # half the cycle: only a nudge can have started this round
        "the announced owners written",
    )
    stop.set()
    service.join(90)
    assert not service.is_alive()


def test_pinging_a_quiet_connection_loses_no_announcement(
    engine: Engine, stop: threading.Event
) -> None:
    """With a ping after every quiet receive, announcements that arrive during a ping are
    kept for the next receive: each of 40 reaches the org (plus the catch-up nudge)."""
    nudges = _ObservedNudges()
    listener = listener_for(engine, nudges, ["a"])
    listener.receive_timeout, listener.ping_after = 0.001, 0.0
    listener.start(stop)
    assert listener.listening.wait(DEADLINE)
    for _ in range(40):
        announce(engine, "a")
    wait_until(
        lambda: nudges.counts.get("a") == 41, DEADLINE, lambda: f"41 nudges: {nudges.counts}"
    )
    assert listener.connects == 1


def test_an_unexpected_error_is_logged_and_the_listener_starts_again(
    engine: Engine, stop: threading.Event, caplog: pytest.LogCaptureFixture
) -> None:
    nudges = _ObservedNudges(fail=1)  # the catch-up nudge of the first connection raises
    with caplog.at_level(logging.INFO, logger="connector.writeback.wakeups"):
        listener = listener_for(engine, nudges, ["a"])
        listener.retry_base = 0.01
        listener.start(stop)
        wait_until(lambda: listener.connects == 2, DEADLINE, "the listener to start again")
        assert listener.listening.wait(DEADLINE)
        announce(engine, "a")
        wait_until(lambda: nudges.counts.get("a") == 2, DEADLINE, "catch-up and announcement")
    [failed] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert failed.getMessage() == "outbox listener failed; it starts again"
    assert failed.exc_info is not None and "a nudge that fails" in str(failed.exc_info[1])


@pytest.mark.two_orgs(poll=False)
def test_the_dispatch_service_is_healthy_only_once_its_listener_listens(
    engine: Engine, two_orgs: TwoOrgs, stop: threading.Event, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`run_dispatch_service` with its admin listener: /healthz answers 503 not_ready, naming
    the outbox listener, for as long as the listener has not run its LISTEN (held back here
    where it marks itself listening), then 200 (checked: with /healthz not asking the
    listener, the first answer is 200 and this test fails)."""
    cfg = two_orgs.configs["demo-hs"]
    gate = threading.Event()
    real_listener_for = listener_for

    class HeldBack(threading.Event):
        def set(self) -> None:
            gate.wait(DEADLINE)
            super().set()

    def held_back_listener(*args: object) -> OutboxListener:
        listener = real_listener_for(*args)  # type: ignore[arg-type]
        listener.listening = HeldBack()
        return listener

    monkeypatch.setattr(service_module, "listener_for", held_back_listener)
    admin = free_port()
    service = threading.Thread(
        target=run_dispatch_service,
        args=(engine, {cfg.org: cfg}),
        kwargs={"stop": stop, "per_org": 1, "admin_port": admin},
        daemon=True,
    )
    service.start()
    url = f"http://127.0.0.1:{admin}/healthz"

    def answer() -> httpx.Response | None:
        try:
            return httpx.get(url, timeout=5)
        except httpx.TransportError:  # not listening yet
            return None

    wait_until(lambda: answer() is not None, DEADLINE, "the admin listener")
    first = answer()
    assert first is not None
    assert (first.status_code, first.json()) == (
        503,
        {"status": "unavailable", "error": "not_ready", "waiting_for": ["outbox listener"]},
    )
    gate.set()
    wait_until(lambda: (r := answer()) is not None and r.status_code == 200, DEADLINE, "healthy")
    assert _listening_now(engine) == 1
    stop.set()
    service.join(90)
    assert not service.is_alive()
