"""Dead notifications on the dashboard's org page, and their retry (CSRF-checked; a row that
is not dead, or a wrong CSRF value, changes nothing)."""

from __future__ import annotations

import re

import httpx
from sqlalchemy import Engine, text

from connector.core.metrics import Metrics
from connector.notify.dispatch import NotifyDispatcher
from connector.notify.settings import apply_notify_settings
from connector.routing.assign import Lead, Router
from connector.routing.teams import apply_teams
from connector.shell.admin import create_admin_app
from connector.shell.service import serve_in_thread
from crm_sandboxes import SlackSandbox
from testbed.notify_org import notify_cfg


def states(engine: Engine) -> dict[int, str]:
    with engine.connect() as conn:
        return {r.id: r.state for r in conn.execute(text("SELECT id, state FROM notifications"))}


def test_a_dead_notification_is_listed_and_retried_from_the_page(engine: Engine) -> None:
    with SlackSandbox() as slack:  # no Slack users: every row dies with users_not_found
        cfg = notify_cfg(slack.url)
        apply_teams(engine, cfg)
        apply_notify_settings(engine, cfg)
        router = Router(engine, cfg)
        for i in range(2):
            router.assign(Lead(f"00Q000{i}", {"Country": "US"}), "api")
        assert NotifyDispatcher(engine, cfg).drain().dead == 2
    app = create_admin_app(engine, Metrics(), token=None, configs={"acme": cfg})
    row, other = sorted(states(engine))
    with serve_in_thread(app) as base, httpx.Client(base_url=base, timeout=30) as c:
        page = c.get("/dashboard/org/acme").text
        assert 'data-list="dead-notifications"' in page and "users_not_found" in page
        assert "@acme.test" not in page
        csrf = re.search(r'name="csrf" value="([0-9a-f]{64})"', page)
        assert csrf is not None
        url = f"/dashboard/org/acme/notifications/{row}/retry"
        bad = c.post(url, data={"csrf": "0" * 64})
        assert bad.status_code == 403
        assert set(states(engine).values()) == {"dead"}
        resp = c.post(url, data={"csrf": csrf.group(1)})
        assert resp.status_code == 303
        assert (
            resp.headers["location"] == f"/dashboard/org/acme?renotified={row}#dead-notifications"
        )
        assert states(engine) == {row: "pending", other: "dead"}
        shown = c.get(resp.headers["location"]).text
        assert f"Notification {row} is pending again" in shown
        again = c.post(url, data={"csrf": csrf.group(1)})
        assert again.status_code == 409
        assert f"Notification {row} of acme is not dead." in again.text
        assert states(engine) == {row: "pending", other: "dead"}
