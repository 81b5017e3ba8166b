"""The scheduled jobs of a long-running process (`connector run`, `sync`): each org's poll
(when its config polls), the notification alerts' checks and the retention purge, on an
APScheduler in a background thread. A job that fails logs (once per outage) and runs again at
its next interval."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime

from apscheduler.schedulers.background import BackgroundScheduler
from sqlalchemy import Engine

from connector.core import outage
from connector.core.config import OrgConfig
from connector.core.metrics import Metrics
from connector.intake.poller import Poller
from connector.shell.adapters import Adapters
from connector.shell.notifying import add_alert_jobs

log = logging.getLogger(__name__)

PURGE_INTERVAL_SECONDS = 6 * 3600


def start_scheduler(
    engine: Engine,
    configs: Mapping[str, OrgConfig],
    adapters: Adapters,
    metrics: Metrics | None = None,
) -> BackgroundScheduler:
    scheduler = BackgroundScheduler(timezone="UTC")
    for cfg in configs.values():
        if not cfg.poll.enabled:
            continue
        unparsed = metrics.unparsed(cfg.org) if metrics is not None else None
        poller = Poller(engine, cfg, adapters.get(cfg.org), unparsed=unparsed)
        scheduler.add_job(
            _safe_poll,
            "interval",
            args=[poller],
            seconds=cfg.poll.interval_seconds,
            id=f"poll-{cfg.org}",
            max_instances=1,
            coalesce=True,
            next_run_time=None if cfg.poll.interval_seconds > 3600 else _now(),
        )
    add_alert_jobs(scheduler, engine, configs)
    scheduler.add_job(
        _safe_purge,
        "interval",
        args=[engine, list(configs.values())],
        seconds=PURGE_INTERVAL_SECONDS,
        id="purge",
        max_instances=1,
        coalesce=True,
    )
    scheduler.start()
    return scheduler


def _safe_purge(engine: Engine, configs: Sequence[OrgConfig]) -> None:
    from connector.shell.retention import purge

    for cfg in configs:
        try:
            purge(engine, cfg.org, cfg.retention_days)
        except Exception as exc:
            if not outage.counted("retention purges", exc):
                log.exception("org %s: retention purge failed; the next round will retry", cfg.org)


def _now() -> datetime:
    return datetime.now(UTC)


def _safe_poll(poller: Poller) -> None:
    try:
        poller.poll_once()
    except Exception as exc:
        if not outage.counted("polls", exc):
            log.exception("org %s: poll failed; the next round will retry", poller.cfg.org)
