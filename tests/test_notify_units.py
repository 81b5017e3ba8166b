"""The pure parts of notifications: escaping, record links, grouping, outcomes, alerts."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from connector.notify.alerts import Alert, bucket_of, decide_alerts
from connector.notify.messages import Row, one_line, plan_messages, record_url, slack_escape
from connector.notify.outcomes import (
    BACKOFF_CAP_S,
    ChannelDown,
    RateLimited,
    Undeliverable,
    after_failure,
    backoff,
)
from testbed.notify_org import notify_cfg

NOW = datetime(2026, 12, 2, 10, 0, tzinfo=UTC)


def row(i: int, recipient: str = "005A", kind: str = "assigned", **kw: Any) -> Row:
    return Row(
        id=i,
        kind=kind,
        channel="slack",
        recipient=recipient,
        dedupe_key=f"k{i}",
        attempts=1,
        created_at=NOW,
        crm_id=f"00Q{i}",
        team="t",
        **kw,
    )


def test_slack_escaping_and_one_line() -> None:
    assert slack_escape("<!here> & <x|y>") == "&lt;!here&gt; &amp; &lt;x|y&gt;"
    assert one_line("a\r\nb\tc\u2028d") == "a b c d"
    assert one_line("x" * 500) == "x" * 199 + "…"


def test_record_links() -> None:
    cfg = notify_cfg("http://127.0.0.1:1")
    assert record_url(cfg, "00Q/1?x") == (
        "https://acme.my.salesforce.com/lightning/r/Lead/00Q%2F1%3Fx/view"
    )


def test_a_reps_rows_go_in_one_digest_of_at_most_the_limit_and_quiet_ones_are_held() -> None:
    cfg = notify_cfg("http://127.0.0.1:1")
    rows = [row(i) for i in range(1, 6)] + [row(10, "005B"), row(11, "005C")]
    plan = plan_messages(cfg, rows, quiet=lambda r: r.recipient == "005C", max_per_message=3)
    assert [(m.recipient, m.row_ids) for m in plan.messages] == [
        ("005A", (1, 2, 3)),
        ("005A", (4, 5)),
        ("005B", (10,)),
    ]
    assert plan.held == [11]
    assert plan.messages[0].text.startswith("3 lead notifications for you, Ada Lovelace:")
    assert plan.messages[2].dedupe_key == "k10"


def test_a_claims_alerts_are_one_message_per_channel() -> None:
    cfg = notify_cfg("http://127.0.0.1:1")
    alerts = [
        row(1, "admins", "alert", detail={"alert": "outbox_dead", "count": 2, "minutes": 15}),
        row(2, "admins", "alert", detail={"alert": "inbox_age", "age_seconds": 900}),
    ]
    (msg,) = plan_messages(cfg, alerts, quiet=lambda r: False).messages
    assert msg.row_ids == (1, 2) and msg.dedupe_key == "k1+k2"
    assert "[acme] 2 owner write(s) failed for good in the last 15 min." in msg.text
    assert "[acme] The oldest unrouted event has waited 900 s." in msg.text


@pytest.mark.parametrize(
    ("exc", "state", "refund"),
    [
        (RateLimited("ratelimited", 7.0), "pending", 1),
        (ChannelDown("transport", "ConnectionRefusedError"), "pending", 0),
        (ChannelDown("invalid_auth"), "pending", 0),
        (Undeliverable("users_not_found"), "dead", 0),
    ],
)
def test_only_a_message_s_own_failure_is_dead(exc: Any, state: str, refund: int) -> None:
    out = after_failure(exc, attempts=3, rng=lambda: 1.0)
    assert (out.state, out.refund) == (state, refund)
    if isinstance(exc, RateLimited):
        assert out.delay == 7.0
    elif state == "pending":
        assert out.delay == 4.0


def test_backoff_doubles_to_its_cap() -> None:
    assert [backoff(n, rng=lambda: 1.0) for n in (1, 2, 3)] == [1.0, 2.0, 4.0]
    assert backoff(50, rng=lambda: 1.0) == BACKOFF_CAP_S
    assert backoff(50, rng=lambda: 0.0) == BACKOFF_CAP_S / 2


def test_alerts_follow_the_thresholds() -> None:
    cfg = notify_cfg("http://127.0.0.1:1", extra="  alerts: {superseded_above: 5}")
    assert cfg.notifications is not None and cfg.notifications.alerts is not None
    quiet = {
        "dead": 0,
        "superseded": 5,
        "sla_rerouted": 0,
        "inbox_age": 10.0,
        "outbox_age": None,
        "paused_reason": None,
        "paused_until": None,
        "notify_dead": 0,
    }
    assert decide_alerts(quiet, cfg.notifications.alerts) == []
    loud = quiet | {"superseded": 6, "outbox_age": 601.4, "paused_reason": "REQUEST_LIMIT: x"}
    assert [a.kind for a in decide_alerts(loud, cfg.notifications.alerts)] == [
        "superseded",
        "outbox_age",
        "api_limit",
    ]
    assert decide_alerts(loud, cfg.notifications.alerts)[1] == Alert(
        "outbox_age", 1, {"age_seconds": 601}
    )
    assert bucket_of(NOW, 15) == bucket_of(NOW.replace(minute=14), 15)
    assert bucket_of(NOW, 15) != bucket_of(NOW.replace(minute=15), 15)


def test_check_config_warns_of_reps_without_an_address_and_unknown_ones() -> None:
    reps = (
        '    - {crm_user_id: "005A", email: "ada@acme.test"}\n'
        '    - {crm_user_id: "005B", slack_user_id: "UALAN"}\n'
        '    - {crm_user_id: "005Z", email: "z@acme.test"}'
    )
    cfg = notify_cfg("http://127.0.0.1:1", reps=reps)
    assert [w for w in cfg.warnings() if "notifications" in w] == [
        "notifications.reps: names no rep of the teams: 005Z; remove them or add them to a team",
        "notifications.reps: no address for 005C: their messages will be dead (no_address); "
        "give each an email or a slack_user_id",
    ]
