"""Notifications in the long-running commands: two notification dispatcher threads per org
that has a `notifications:` block (beside the outbox dispatchers, in `connector run` and
`connector dispatch`), and the admin alert check as a scheduled job per org."""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping

from apscheduler.schedulers.background import BackgroundScheduler
from sqlalchemy import Engine

from connector.core.config import OrgConfig
from connector.notify.alerts import check_alerts
from connector.notify.dispatch import NotifyDispatcher, Pace

log = logging.getLogger(__name__)


def start_notifiers(
    engine: Engine, configs: Mapping[str, OrgConfig], stop: threading.Event, per_org: int = 2
) -> list[threading.Thread]:
    threads = []
    for cfg in configs.values():
        if cfg.notifications is None:
            continue
        pace = Pace()  # one per org in this process: its dispatchers keep Slack's pace together
        for i in range(per_org):
            d = NotifyDispatcher(engine, cfg, pace=pace)
            t = threading.Thread(
                target=d.run_forever, args=(stop,), name=f"notify-{cfg.org}-{i}", daemon=True
            )
            t.start()
            threads.append(t)
    return threads


def _safe_check(engine: Engine, cfg: OrgConfig) -> None:
    try:
        check_alerts(engine, cfg)
    except Exception:
        log.exception("org %s: admin alert check failed; the next one will retry", cfg.org)


def add_alert_jobs(
    scheduler: BackgroundScheduler, engine: Engine, configs: Mapping[str, OrgConfig]
) -> None:
    for cfg in configs.values():
        n = cfg.notifications
        if n is None or n.alerts is None or not n.admin_channels:
            continue
        scheduler.add_job(
            _safe_check,
            "interval",
            args=[engine, cfg],
            minutes=n.alerts.interval_minutes,
            id=f"alerts-{cfg.org}",
            max_instances=1,
            coalesce=True,
        )
