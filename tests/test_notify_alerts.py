"""Admin alerts (one message per kind per interval, saying what, how many and the fix) and
quiet hours (a rep off shift or away gets one digest when back), on a real PostgreSQL with the
Slack simulator."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from sqlalchemy import Engine, text

from connector.notify.alerts import check_alerts, pause_kind
from connector.notify.dispatch import NotifyDispatcher
from connector.notify.settings import apply_notify_settings
from connector.routing.assign import Lead, Router
from connector.routing.teams import apply_teams
from crm_sandboxes.slack import SlackSandbox
from testbed.notify_org import REPS, notify_cfg

ALERTS = "  alerts: {interval_minutes: 15, superseded_above: 1}"


@pytest.fixture
def slack() -> Iterator[SlackSandbox]:
    box = SlackSandbox().start()
    for _, _, email, uid in REPS:
        box.add_user(email, uid)
    box.add_channel("C0ADMIN")
    yield box
    box.stop()


def test_dead_writes_and_a_paused_org_are_one_alert_each_per_interval(
    engine: Engine, slack: SlackSandbox
) -> None:
    cfg = notify_cfg(slack.url, rep_channels=(), extra=ALERTS)
    apply_teams(engine, cfg)
    apply_notify_settings(engine, cfg)
    router = Router(engine, cfg)
    for i in range(4):
        router.assign(Lead(f"00Q000{i}", {"Country": "US"}), "api")
    with engine.begin() as conn:
        assert conn.execute(text("SELECT count(*) FROM notifications")).scalar_one() == 0
        conn.execute(
            text(
                "UPDATE outbox SET state = 'dead', finished_at = now(), "
                "last_error = 'INACTIVE_OWNER_OR_USER' WHERE id IN "
                "(SELECT id FROM outbox ORDER BY id LIMIT 3)"
            )
        )
        conn.execute(
            text(
                "INSERT INTO org_pauses (org, until, reason) VALUES "
                "('acme', now() + interval '60 seconds', 'INVALID_SESSION_ID: expired')"
            )
        )
    assert check_alerts(engine, cfg) == 2
    assert check_alerts(engine, cfg) == 0  # the same interval: grouped, not repeated
    assert NotifyDispatcher(engine, cfg).drain().sent == 2
    (message,) = slack.messages()  # the claim's alerts in one message to the admin channel
    assert message["channel"] == "C0ADMIN"
    texts = message["text"].split("\n\n")
    dead = next(t for t in texts if "owner write" in t)
    assert dead.startswith("[acme] 3 owner write(s) failed for good in the last 15 min.\n")
    assert "`connector outbox retry --org acme`" in dead
    auth = next(t for t in texts if "authentication" in t)
    assert "CRM authentication failed: writes paused until " in auth
    assert "(INVALID_SESSION_ID: expired)" in auth
    assert "`connector check-config --online`" in auth


@pytest.mark.parametrize(
    ("reason", "kind"),
    [
        ("REQUEST_LIMIT_EXCEEDED: TotalRequests Limit exceeded.", "api_limit"),
        ("INVALID_SESSION_ID: Session expired or invalid", "crm_auth"),
        ("invalid_grant: authentication failure", "crm_auth"),
    ],
)
def test_a_pause_is_told_apart_by_its_code(reason: str, kind: str) -> None:
    assert pause_kind(reason) == kind


QUIET_MEMBERS = (
    '      - {crm_user_id: "005A", name: "Ada Lovelace", '
    'hours: {timezone: UTC, mon-sun: "09:00-17:00"}}'
)
ON = datetime(2026, 12, 2, 10, 0, tzinfo=UTC)
OFF = datetime(2026, 12, 2, 20, 0, tzinfo=UTC)


def test_a_rep_off_shift_gets_one_digest_when_back(engine: Engine, slack: SlackSandbox) -> None:
    cfg = notify_cfg(slack.url, members=QUIET_MEMBERS, extra="  quiet_when_away: true")
    apply_teams(engine, cfg)
    apply_notify_settings(engine, cfg)
    router = Router(engine, cfg, clock=lambda: ON)
    for i in range(3):
        router.assign(Lead(f"00Q000{i}", {"Country": "US"}), "api")
    stats = NotifyDispatcher(engine, cfg, now=lambda: OFF).drain()
    assert (stats.held, stats.sent) == (3, 0)
    assert slack.messages() == []
    with engine.begin() as conn:
        held = conn.execute(
            text("SELECT count(*) FROM notifications WHERE held_since IS NOT NULL")
        ).scalar_one()
        assert held == 3
        conn.execute(text("UPDATE notifications SET available_at = now()"))
    assert NotifyDispatcher(engine, cfg, now=lambda: ON).drain().sent == 3
    (digest,) = slack.messages()
    assert digest["text"].startswith("3 lead notifications for you, Ada Lovelace:")


def test_without_quiet_hours_an_off_shift_rep_is_told_at_once(
    engine: Engine, slack: SlackSandbox
) -> None:
    cfg = notify_cfg(slack.url, members=QUIET_MEMBERS)
    apply_teams(engine, cfg)
    apply_notify_settings(engine, cfg)
    Router(engine, cfg, clock=lambda: ON).assign(Lead("00Q0001", {"Country": "US"}), "api")
    assert NotifyDispatcher(engine, cfg, now=lambda: OFF).drain().sent == 1


def test_a_rep_away_by_command_is_quiet_too(engine: Engine, slack: SlackSandbox) -> None:
    cfg = notify_cfg(slack.url, extra="  quiet_when_away: true")
    apply_teams(engine, cfg)
    apply_notify_settings(engine, cfg)
    Router(engine, cfg).assign(Lead("00Q0001", {"Country": "US"}), "api")
    with engine.begin() as conn:
        rep = conn.execute(text("SELECT recipient FROM notifications")).scalar_one()
        conn.execute(
            text(
                "INSERT INTO rep_time_off (org, crm_user_id, starts_at, until) "
                "VALUES ('acme', :rep, now() - interval '1 hour', now() + interval '1 day')"
            ),
            {"rep": rep},
        )
    assert NotifyDispatcher(engine, cfg).drain().held == 1
    assert slack.messages() == []
