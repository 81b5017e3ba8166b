"""`connector serve | sync | run | dispatch`: the long-running parts, wired together.

``run`` is the production default: the webhook receiver (uvicorn) with its inbox worker, the
admin listener (health, metrics and the dashboard, localhost by default), the scheduled poll
and retention purge (APScheduler, jobs per org) and the outbox dispatchers (threads), in one
process. Any
number of such processes share one database: polling is one-at-a-time per org by an
advisory lock, assignment is serialised per team by a row lock, dispatch claims with SKIP
LOCKED. SIGTERM stops taking work (uvicorn stops accepting and finishes open requests), lets
a poll or dispatch round in progress finish, and exits.
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext, suppress
from functools import partial
from typing import Any

import uvicorn
from apscheduler.schedulers.background import BackgroundScheduler
from sqlalchemy import Engine
from starlette.applications import Starlette

from connector.core.config import ConfigError, OrgConfig
from connector.core.crm_kinds import org_pacing
from connector.core.leases import DEFAULT_LEASE_S
from connector.core.metrics import Metrics
from connector.core.pacing import Nudges, Spacer
from connector.intake.admission import DEFAULT_MAX_CONNECTIONS_PER_PEER
from connector.intake.http_server import build_server
from connector.shell.adapters import Adapters
from connector.shell.fd_limits import DEFAULT_MAX_CONNECTIONS
from connector.shell.listeners import (
    ADMIN_LIMITS,
    check_admin_binding,
    public_connection_cap,
)
from connector.shell.notifying import start_notifiers
from connector.shell.scheduling import start_scheduler
from connector.shell.store import warn_if_vacuum_off
from connector.writeback.dispatch import Dispatcher
from connector.writeback.stats import DispatchStats
from connector.writeback.wakeups import announce, listener_for
from crm_adapters.base import CrmAdapter

log = logging.getLogger(__name__)


class ListenFailed(ConfigError):
    """A web server of this process could not take its address (the port is in use, say):
    the operator's to fix, so the command's one-line error (exit 2), not a traceback."""


@contextmanager
def serve_in_thread(
    app: Any,
    host: str = "127.0.0.1",
    port: int = 0,
    what: str = "the web server",
    **limits: Any,
) -> Iterator[str]:
    """Run an ASGI app in a background thread on the hardened server of
    ``connector.intake.http_server`` (header deadline, header cap, connection caps; ``limits``
    are its ``receiver_config`` arguments); yields its base URL. A startup that fails
    (uvicorn logged why, e.g. the address in use) is ``ListenFailed``."""
    server = build_server(app, host, port, lifespan="on", **limits)

    def run() -> None:
        with suppress(SystemExit):  # how uvicorn ends a startup that failed
            server.run()

    thread = threading.Thread(target=run, name="uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if not thread.is_alive():
            raise ListenFailed(f"{what} could not listen on {host}:{port} (is the port in use?)")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not start within 20 s")
        time.sleep(0.01)
    bound = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://{host}:{bound}"
    finally:
        server.should_exit = True
        thread.join(15)


class _GracefulServer(uvicorn.Server):
    """uvicorn re-raises SIGTERM after its graceful shutdown, which would kill the process
    before the scheduler and dispatchers finish their round; this one only records it."""

    @contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        handled = (signal.SIGINT, signal.SIGTERM)
        original = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)


def _record_stats(metrics: Metrics | None, org: str, adapter: CrmAdapter) -> Any:
    def record(stats: DispatchStats) -> None:
        if metrics is None or not (stats.requests or stats.reads):
            return
        api_usage = adapter.usage().get("api_usage")
        if isinstance(api_usage, dict):
            for figure, value in api_usage.items():
                metrics.crm_api_usage.labels(org, str(figure)).set(float(value))
        metrics.crm_calls.labels(org, "write_owners").inc(stats.requests)
        metrics.crm_calls.labels(org, "read_owners").inc(stats.reads)
        if stats.superseded:
            metrics.outbox_superseded.labels(org).inc(stats.superseded)
        for code, n in stats.errors.items():
            metrics.crm_errors.labels(org, code).inc(n)
        locks = stats.errors.get("UNABLE_TO_LOCK_ROW", 0)
        if locks:
            metrics.lock_retries.labels(org).inc(locks)

    return record


def start_dispatchers(
    engine: Engine,
    configs: Mapping[str, OrgConfig],
    adapters: Adapters,
    stop: threading.Event,
    per_org: int = 2,
    metrics: Metrics | None = None,
    lease_seconds: float = DEFAULT_LEASE_S,
    nudges: Nudges | None = None,
) -> list[threading.Thread]:
    """``per_org`` dispatcher threads per org. With ``nudges`` (set by an inbox worker in this
    process, or by the outbox listener), a dispatcher goes right after the worker's round
    instead of on its spacer."""
    threads = []
    for cfg in configs.values():
        spacer = Spacer(org_pacing(cfg.crm).cycle_s)  # one per org: rounds spaced org-wide
        for i in range(per_org):
            d = Dispatcher(
                engine,
                cfg.org,
                adapters.get(cfg.org),
                lease_seconds=lease_seconds,
                intake_owner_ids=cfg.intake_owner_ids,
                spacer=spacer,
                nudge=nudges.listener(cfg.org) if nudges is not None else None,
            )
            t = threading.Thread(
                target=d.run_forever,
                name=f"dispatch-{cfg.org}-{i}",
                kwargs={
                    "stop": stop,
                    "on_stats": _record_stats(metrics, cfg.org, adapters.get(cfg.org)),
                },
                daemon=True,
            )
            t.start()
            threads.append(t)
    return threads


def wake_dispatchers_of(app: Starlette, engine: Engine, nudges: Nudges | None) -> None:
    """After each round of the app's inbox worker, wake the org's dispatchers: this
    process's own through ``nudges``, or (None: it has none) those of `connector dispatch`
    processes, announced through the database (connector/writeback/wakeups.py)."""
    worker = app.state.inbox_worker
    if worker is not None:
        worker.on_routed = nudges.nudge if nudges is not None else partial(announce, engine)


def run_dispatch_service(
    engine: Engine,
    configs: Mapping[str, OrgConfig],
    *,
    per_org: int = 2,
    lease_seconds: float = DEFAULT_LEASE_S,
    stop: threading.Event | None = None,
    admin_host: str = "127.0.0.1",
    admin_port: int | None = None,
    admin_token: str | None = None,
) -> int:
    """``connector dispatch``: the dispatchers of ``configs`` until SIGTERM/SIGINT (or until
    ``stop`` is set, when the caller passes one: then no signal handler is installed), each
    finishing the round it is in (a minute at most for all of them). They go when an inbox
    worker in another process announces a routed round of their org
    (``connector.writeback.wakeups``), and on their cycle otherwise.

    With ``admin_port`` (off by default: a dispatch process beside a `connector run` on one
    host would otherwise take the same port) the admin listener serves /metrics (the
    dispatchers' CRM calls and errors, the outbox) and /healthz, which answers 503
    ``not_ready`` until the outbox listener listens and while a dispatcher thread is gone:
    an announcement made before the LISTEN reaches nobody, so load sent before /healthz says
    ok waits for the dispatchers' own cycle. A second SIGINT or SIGTERM ends the process at
    once."""
    if admin_port is not None:
        check_admin_binding(admin_host, admin_token)
    own_signals = stop is None
    stop = stop or threading.Event()
    nudges = Nudges()
    metrics = Metrics(engine, configs)
    threads: list[threading.Thread] = []
    listener = listener_for(engine, nudges, configs)
    dispatchers: list[threading.Thread] = []

    def waiting_for() -> list[str]:
        pending = [] if listener.listening.is_set() else ["outbox listener"]
        return pending + [f"{t.name} (stopped)" for t in dispatchers if not t.is_alive()]

    # The admin listener first: a port it cannot take stops the command before anything
    # else has started (its /healthz says not_ready until the listener listens).
    if admin_port is not None:
        from connector.shell.admin import create_admin_app  # Starlette, only when asked for
    admin: AbstractContextManager[str] = (
        serve_in_thread(
            create_admin_app(
                engine,
                metrics,
                token=admin_token,
                configs=configs,
                waiting_for=waiting_for,
                bound_host=admin_host,
            ),
            admin_host,
            admin_port,
            "the admin listener",
            **ADMIN_LIMITS,
        )
        if admin_port is not None
        else nullcontext("")
    )
    with admin as admin_url:
        signalled = _signals_received() if own_signals else []
        try:
            threads.append(listener.start(stop))
            dispatchers += start_dispatchers(
                engine,
                configs,
                Adapters(configs, engine),
                stop,
                per_org,
                metrics,
                lease_seconds,
                nudges,
            )
            threads += dispatchers + start_notifiers(engine, configs, stop)
            log.info(
                "connector dispatch running: dispatchers=%d admin=%s",
                len(dispatchers),
                admin_url or "off",
            )
            while not (stop.wait(0.5) or signalled):
                pass
        finally:
            stop.set()
            nudges.wake_all()  # dispatchers waiting for a nudge see the stop at once
            _join_all(threads, 60.0)
    return 0


def _signals_received() -> list[int]:
    """Record SIGTERM and SIGINT in the list returned (the caller's loop polls it: a handler
    that took a lock, such as an Event's, could deadlock against the thread it interrupted);
    the second one gets the default action and ends the process, for an operator who will not
    wait for the rounds in progress."""
    received: list[int] = []

    def handle(signum: int, _frame: object) -> None:
        received.append(signum)
        if len(received) > 1:
            signal.signal(signum, signal.SIG_DFL)
            signal.raise_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, handle)
    return received


def _join_all(threads: Sequence[threading.Thread], seconds: float) -> None:
    """Join every thread within ``seconds`` in all (not each)."""
    deadline = time.monotonic() + seconds
    for t in threads:
        t.join(max(deadline - time.monotonic(), 0.0))


def settle_garbage_collector() -> None:
    """Move everything built at start-up out of the collector's sight (``gc.freeze``).

    A full collection otherwise walks every module, config and client object the process
    holds: measured at 100-290 ms each under webhook load, a pause every request in flight
    waits for (BENCHMARKS.md "Webhooks"). Objects made later are collected as usual.
    """
    gc.collect()
    gc.freeze()


def _receiver_app(
    engine: Engine,
    configs: Mapping[str, OrgConfig],
    adapters: Adapters,
    metrics: Metrics,
    *,
    public_base_url: str | None,
    lease_seconds: float | None,
    trusted_proxies: Sequence[Any],
) -> Starlette:
    """The webhook receiver (its inbox worker included)."""
    from connector.intake.receivers import create_app, unauthenticated_bytes_from_env

    return create_app(
        engine,
        configs,
        adapters=adapters.get,
        public_base_url=public_base_url,
        inbox_lease_seconds=lease_seconds or DEFAULT_LEASE_S,
        trusted_proxies=trusted_proxies,
        metrics=metrics,
        unauthenticated_bytes=unauthenticated_bytes_from_env(),
    )


def _admin_listener(
    engine: Engine,
    configs: Mapping[str, OrgConfig],
    metrics: Metrics,
    admin_host: str,
    admin_port: int | None,
    admin_token: str | None,
) -> AbstractContextManager[str]:
    """/healthz, /metrics and the dashboard served in a thread while the context is open (its
    URL), or nothing ("") when ``admin_port`` is None."""
    from connector.shell.admin import create_admin_app

    if admin_port is None:
        return nullcontext("")
    return serve_in_thread(
        create_admin_app(
            engine, metrics, token=admin_token, configs=configs, bound_host=admin_host
        ),
        admin_host,
        admin_port,
        "the admin listener",
        **ADMIN_LIMITS,
    )


def _serve_until_signalled(
    app: Starlette | None, host: str, port: int, limits: Mapping[str, Any], stop: threading.Event
) -> None:
    """Serve the receiver, or with none just wait, until SIGTERM/SIGINT."""
    if app is not None:
        server = build_server(app, host, port, server_class=_GracefulServer, **limits)
        settle_garbage_collector()
        server.run()  # returns after SIGTERM/SIGINT, requests done
    else:
        signalled = _signals_received()
        while not (stop.wait(0.5) or signalled):
            pass


def _shut_down(
    stop: threading.Event,
    nudges: Nudges | None,
    sched: BackgroundScheduler | None,
    threads: list[threading.Thread],
) -> None:
    stop.set()
    if nudges is not None:
        nudges.wake_all()  # dispatchers waiting for a nudge see the stop at once
    if sched is not None:
        sched.shutdown(wait=True)  # a poll in progress finishes its page and returns
    _join_all(threads, 60.0)
    log.info("connector stopped")


def _public_limits(
    engine: Engine,
    configs: Mapping[str, OrgConfig],
    *,
    receiver: bool,
    admin: bool,
    max_connections: int,
    max_connections_per_peer: int | None,
    trusted_proxies: Sequence[Any],
) -> dict[str, Any]:
    """The public listener's limits; with a receiver, its settings are checked first (a bad
    value stops the start here, in one line) and its connection cap is fitted to the
    open-file limit."""
    if receiver:
        from connector.intake.receivers import unauthenticated_bytes_from_env

        unauthenticated_bytes_from_env()
        max_connections = public_connection_cap(engine, configs, max_connections, admin=admin)
    return {
        "max_connections": max_connections,
        "max_connections_per_peer": max_connections_per_peer,
        "trusted_proxies": trusted_proxies,
    }


def _start_writers(
    engine: Engine,
    configs: Mapping[str, OrgConfig],
    adapters: Adapters,
    metrics: Metrics,
    stop: threading.Event,
    app: Any,
    dispatchers_per_org: int,
    lease_seconds: float | None,
) -> tuple[Nudges | None, list[threading.Thread]]:
    """The dispatchers (``dispatchers_per_org`` an org; 0: none) and the notifiers, started.
    The inbox worker wakes the org's dispatchers when its round has owner writes: this
    process's own, or with none here (`connector serve`, `run --dispatchers 0`) those of
    `connector dispatch` processes, through the database (connector/writeback/wakeups.py)."""
    dispatch = dispatchers_per_org > 0
    nudges = Nudges() if dispatch and app is not None else None
    if app is not None:
        wake_dispatchers_of(app, engine, nudges)
    if not dispatch:
        return nudges, []
    threads = start_dispatchers(
        engine,
        configs,
        adapters,
        stop,
        dispatchers_per_org,
        metrics,
        lease_seconds or DEFAULT_LEASE_S,
        nudges=nudges,
    )
    return nudges, threads + start_notifiers(engine, configs, stop)


def run_service(
    engine: Engine,
    configs: Mapping[str, OrgConfig],
    *,
    host: str,
    port: int,
    receiver: bool = True,
    scheduler: bool = True,
    dispatch: bool = True,
    dispatchers_per_org: int = 2,
    public_base_url: str | None = None,
    lease_seconds: float | None = None,
    admin_host: str = "127.0.0.1",
    admin_port: int | None = 9100,
    admin_token: str | None = None,
    trusted_proxies: Sequence[Any] = (),
    max_connections: int = DEFAULT_MAX_CONNECTIONS,
    max_connections_per_peer: int | None = DEFAULT_MAX_CONNECTIONS_PER_PEER,
) -> int:
    """Run the chosen parts until SIGTERM/SIGINT; returns the exit status.

    ``lease_seconds`` (default 10 s, renewed while a claim works) bounds how long
    the claims of a process that died stay blocked before another process takes them over.
    The admin listener (``admin_port``; None turns it off) serves /healthz, /metrics and the
    dashboard (/dashboard/). The public listener holds at most ``max_connections``
    connections, fewer when the open-file limit (raised to its hard limit here) leaves less
    (``connector.shell.fd_limits``), and at most ``max_connections_per_peer`` from one
    address (None: no such cap).
    """
    if admin_port is not None:
        check_admin_binding(admin_host, admin_token)
    limits = _public_limits(
        engine,
        configs,
        receiver=receiver,
        admin=admin_port is not None,
        max_connections=max_connections,
        max_connections_per_peer=max_connections_per_peer,
        trusted_proxies=trusted_proxies,
    )
    warn_if_vacuum_off(engine)
    adapters = Adapters(configs, engine)
    metrics = Metrics(engine, configs)
    stop = threading.Event()
    sched = start_scheduler(engine, configs, adapters, metrics) if scheduler else None
    app = (
        _receiver_app(
            engine,
            configs,
            adapters,
            metrics,
            public_base_url=public_base_url,
            lease_seconds=lease_seconds,
            trusted_proxies=trusted_proxies,
        )
        if receiver
        else None
    )
    dispatchers = dispatchers_per_org if dispatch else 0
    nudges, threads = _start_writers(
        engine, configs, adapters, metrics, stop, app, dispatchers, lease_seconds
    )
    admin = _admin_listener(engine, configs, metrics, admin_host, admin_port, admin_token)
    try:
        with admin as admin_url:
            log.info(
                "connector running: receiver=%s scheduler=%s dispatchers=%d admin=%s",
                receiver,
                scheduler,
                len(threads),
                admin_url or "off",
            )
            _serve_until_signalled(app, host, port, limits, stop)
    finally:
        _shut_down(stop, nudges, sched, threads)
    return 0


def app_from_env() -> Starlette:
    """Factory for ``uvicorn --factory``: configs from $CONNECTOR_CONFIG, the database from
    $DATABASE_URL (or the embedded one), migrated and with the teams applied."""
    from connector.core.config_loading import config_path_from, load_configs
    from connector.intake.receivers import (
        create_app,
        trusted_proxies_from_env,
        unauthenticated_bytes_from_env,
    )
    from connector.shell.store import open_database

    configs = load_configs(config_path_from(None))
    engine = open_database(list(configs.values()))
    app = create_app(
        engine,
        configs,
        adapters=Adapters(configs, engine).get,
        public_base_url=os.environ.get("CONNECTOR_PUBLIC_BASE_URL") or None,
        trusted_proxies=trusted_proxies_from_env(),
        unauthenticated_bytes=unauthenticated_bytes_from_env(),
    )
    wake_dispatchers_of(app, engine, None)  # no dispatchers here: `connector dispatch`'s
    return app
