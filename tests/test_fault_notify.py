"""Notifications through failures: a Slack outage (5xx answers, dropped connections) delays
messages and loses none; dispatchers that run side by side send each row once; a dispatcher
that dies holding a claim has its rows sent by another once the lease ends, and its late
finish changes nothing."""

from __future__ import annotations

import re
import threading
from collections import Counter
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, text

from connector.notify.dispatch import NotifyDispatcher, Pace
from connector.notify.outcomes import sent
from connector.notify.settings import apply_notify_settings
from connector.routing.assign import Lead, Router
from connector.routing.teams import apply_teams
from crm_sandboxes.slack import SlackSandbox
from testbed.notify_org import REPS, notify_cfg
from testbed.waiting import wait_until

pytestmark = pytest.mark.fault

LEAD_LINK = re.compile(r"/lightning/r/Lead/(00Q\d+)/view")


@pytest.fixture
def slack() -> Iterator[SlackSandbox]:
    box = SlackSandbox(per_channel_per_s=1000.0, burst=1000).start()
    for _, _, email, uid in REPS:
        box.add_user(email, uid)
    yield box
    box.stop()


def told(slack: SlackSandbox) -> Counter[str]:
    """How often each lead was in a message."""
    return Counter(lead for m in slack.messages() for lead in LEAD_LINK.findall(m["text"]))


def open_rows(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                text("SELECT count(*) FROM notifications WHERE state <> 'sent'")
            ).scalar_one()
        )


def routed(engine: Engine, slack: SlackSandbox, n: int) -> tuple[object, list[str]]:
    cfg = notify_cfg(slack.url)
    apply_teams(engine, cfg)
    apply_notify_settings(engine, cfg)
    router = Router(engine, cfg)
    ids = [f"00Q{i:04d}" for i in range(n)]
    for crm_id in ids:
        router.assign(Lead(crm_id, {"Country": "US"}), "api")
    return cfg, ids


def test_a_slack_outage_delays_messages_and_loses_none(engine: Engine, slack: SlackSandbox) -> None:
    cfg = notify_cfg(slack.url)
    apply_teams(engine, cfg)
    apply_notify_settings(engine, cfg)
    slack.inject_failures(4, 503, {"ok": False, "error": "service_unavailable"})
    slack.drop_connections(2)
    stop = threading.Event()
    d = NotifyDispatcher(
        engine, cfg, claim_limit=4, poll_seconds=0.05, pace=Pace(slack_interval_s=0)
    )
    thread = threading.Thread(target=d.run_forever, args=(stop,), daemon=True)
    thread.start()
    try:
        router = Router(engine, cfg)
        ids = [f"00Q{i:04d}" for i in range(24)]
        for crm_id in ids:  # leads keep coming while Slack fails
            router.assign(Lead(crm_id, {"Country": "US"}), "api")
        wait_until(lambda: open_rows(engine) == 0, 60, "every notification sent")
    finally:
        stop.set()
        thread.join(10)
    assert told(slack) == Counter(ids)  # every lead, once
    assert slack.counters()["injected"] == 4 and slack.counters()["dropped"] == 2
    with engine.connect() as conn:
        retried = conn.execute(
            text("SELECT count(*) FROM notifications WHERE attempts > 1")
        ).scalar_one()
    assert retried >= 1


def test_dispatchers_side_by_side_send_each_row_once(engine: Engine, slack: SlackSandbox) -> None:
    cfg, ids = routed(engine, slack, 90)
    # the simulator takes 1,000 messages a second a channel: no pace to keep
    dispatchers = [
        NotifyDispatcher(engine, cfg, claim_limit=3, pace=Pace(slack_interval_s=0))  # type: ignore[arg-type]
        for _ in range(4)
    ]
    go = threading.Barrier(len(dispatchers))

    def drain(d: NotifyDispatcher) -> None:
        go.wait()
        d.drain(timeout=60)

    threads = [threading.Thread(target=drain, args=(d,)) for d in dispatchers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    assert open_rows(engine) == 0
    assert told(slack) == Counter(ids)


def test_a_dead_dispatchers_claim_is_sent_by_another_after_its_lease(
    engine: Engine, slack: SlackSandbox
) -> None:
    cfg, ids = routed(engine, slack, 3)
    dead = NotifyDispatcher(engine, cfg, lease_seconds=0.5)  # type: ignore[arg-type]
    rows, _ = dead._claim("dead-token")  # claims, then "dies" before sending
    assert len(rows) == 3
    live = NotifyDispatcher(engine, cfg)  # type: ignore[arg-type]
    assert live.run_once().claimed == 0  # leased: not taken
    done = Counter[str]()

    def step() -> bool:
        done["sent"] += live.run_once().sent
        return done["sent"] == 3

    wait_until(step, 10, "the expired claim's rows sent by another dispatcher")
    # the dead dispatcher's late finish is ignored: its token no longer holds the rows
    dead._finish("dead-token", {r.id: sent("late") for r in rows}, type(live.run_once())())
    with engine.connect() as conn:
        sent_as = conn.execute(text("SELECT DISTINCT sent_as FROM notifications")).scalars().all()
    assert "late" not in sent_as
    assert told(slack) == Counter(ids)
