"""Admin alerts: what needs a person, checked once per interval and queued as one message per
kind per interval (the dedupe key names the kind and the interval), each saying what
happened, how many, and the command or page that deals with it.

``decide_alerts`` and ``alert_message`` are pure; ``check_alerts`` reads the figures and
queues the alerts in one short transaction.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine, TextClause, text

import db
from connector.core.config import OrgConfig
from connector.core.notify_config import Alerts

if TYPE_CHECKING:
    from connector.notify.messages import Message, Row

log = logging.getLogger(__name__)

_SQL: dict[str, TextClause] = {k: text(v) for k, v in db.queries("notify").items()}


@dataclass(frozen=True)
class Alert:
    kind: str
    count: int
    detail: dict[str, Any]


def pause_kind(reason: str) -> str:
    """A pause of the org's writes (org_pauses.reason, "CODE: message"): over an API limit,
    or the CRM refused the credentials (every other pause)."""
    code = reason.split(":", 1)[0].upper()
    return "api_limit" if "LIMIT" in code or code in {"429", "TEN_SECONDLY_ROLLING"} else "crm_auth"


def decide_alerts(figures: Mapping[str, Any], rules: Alerts) -> list[Alert]:
    """The alerts a window's figures call for (db/notify.sql alert_figures)."""
    out: list[Alert] = []
    if figures["dead"]:
        out.append(Alert("outbox_dead", int(figures["dead"]), {}))
    if figures["superseded"] > rules.superseded_above:
        out.append(Alert("superseded", int(figures["superseded"]), {}))
    if figures["sla_rerouted"]:
        out.append(Alert("sla_rerouted", int(figures["sla_rerouted"]), {}))
    for name, limit in (
        ("inbox_age", rules.inbox_age_above_seconds),
        ("outbox_age", rules.outbox_age_above_seconds),
    ):
        age = figures[name]
        if age is not None and float(age) > limit:
            out.append(Alert(name, 1, {"age_seconds": round(float(age))}))
    reason = figures["paused_reason"]
    if reason:
        until = figures["paused_until"]
        out.append(
            Alert(
                pause_kind(str(reason)),
                1,
                {"reason": str(reason)[:300], "until": until.isoformat() if until else None},
            )
        )
    if figures["notify_dead"]:
        out.append(Alert("notify_dead", int(figures["notify_dead"]), {}))
    return out


def bucket_of(now: datetime, minutes: int) -> int:
    """The interval ``now`` falls in (intervals counted from the epoch)."""
    return int(now.timestamp() // (minutes * 60))


def check_alerts(engine: Engine, cfg: OrgConfig) -> int:
    """Queue the alerts of the interval that ends now; returns how many rows were queued."""
    n = cfg.notifications
    if n is None or n.alerts is None or not n.admin_channels:
        return 0
    rules = n.alerts
    with engine.begin() as conn:
        now = conn.execute(text("SELECT now()")).scalar_one()
        since = now - timedelta(minutes=rules.interval_minutes)
        figures = conn.execute(_SQL["alert_figures"], {"org": cfg.org, "since": since}).one()
        queued = 0
        for a in decide_alerts(dict(figures._mapping), rules):
            detail = {
                "alert": a.kind,
                "count": a.count,
                "minutes": rules.interval_minutes,
                **a.detail,
            }
            queued += len(
                conn.execute(
                    _SQL["queue_alert"],
                    {
                        "org": cfg.org,
                        "alert": a.kind,
                        "bucket": str(bucket_of(now, rules.interval_minutes)),
                        "detail": json.dumps(detail),
                        "channels": list(n.admin_channels),
                    },
                ).all()
            )
    if queued:
        log.info("org %s: %d admin alert messages queued", cfg.org, queued)
    return queued


def _fix(kind: str, org: str) -> str:
    return {
        "outbox_dead": (
            f"See them: `connector outbox list --dead --org {org}`; after fixing the cause: "
            f"`connector outbox retry --org {org}` (or the dashboard's Outbox page)."
        ),
        "superseded": (
            f"A person set another owner in the CRM first. See them: "
            f"`connector outbox list --superseded --org {org}`."
        ),
        "sla_rerouted": (
            f"Reps did not work these leads in time. See why: `connector explain --org {org} "
            "<crm id>`, or the dashboard's Leads page."
        ),
        "inbox_age": (
            f"Events are not being routed. Check the service and the CRM: "
            f"`connector status --org {org}`, `connector inbox list --org {org}`."
        ),
        "outbox_age": (
            f"Owner writes are not reaching the CRM. Check: `connector status --org {org}`, "
            f"`connector check-config --online`."
        ),
        "crm_auth": (
            "The CRM refused the connector's credentials; owner writes are paused. Fix the "
            "credentials, then check: `connector check-config --online`."
        ),
        "api_limit": (
            "The org's CRM API limit is used up; owner writes resume by themselves. See "
            f"`connector status --org {org}`."
        ),
        "notify_dead": (
            f"See them: `connector notify list --org {org}`; after fixing the cause: "
            f"`connector notify retry --org {org}`."
        ),
    }.get(kind, f"`connector status --org {org}`")


_WHAT = {
    "outbox_dead": "{count} owner write(s) failed for good in the last {minutes} min.",
    "superseded": "{count} owner write(s) were superseded in the last {minutes} min.",
    "sla_rerouted": "{count} lead(s) were re-routed after their SLA in the last {minutes} min.",
    "inbox_age": "The oldest unrouted event has waited {age_seconds} s.",
    "outbox_age": "The oldest unsent owner write has waited {age_seconds} s.",
    "crm_auth": "CRM authentication failed: writes paused until {until} ({reason}).",
    "api_limit": "Paused by the CRM API limit until {until} ({reason}).",
    "notify_dead": "{count} notification(s) failed for good in the last {minutes} min.",
}


def alert_text(org: str, detail: Mapping[str, Any]) -> str:
    kind = str(detail.get("alert", ""))
    values = {k: detail.get(k, "?") for k in ("count", "minutes", "age_seconds", "until", "reason")}
    what = _WHAT.get(kind, "{count} event(s): " + kind).format(**values)
    return f"[{org}] {what}\n{_fix(kind, org)}"


def alert_message(cfg: OrgConfig, rows: Sequence[Row]) -> Message:
    """The alerts of one claim on one channel, in one message (its key: the first row's, or
    all of them joined)."""
    from connector.notify.messages import Message, slack_escape, subject_of

    body = "\n\n".join(alert_text(cfg.org, r.detail) for r in rows)
    if rows[0].channel == "slack":
        body = slack_escape(body)
    key = rows[0].dedupe_key if len(rows) == 1 else "+".join(r.dedupe_key for r in rows)
    return Message(
        rows[0].channel, "admins", key, subject_of(body), body, tuple(r.id for r in rows)
    )
