"""Rep notifications on a real PostgreSQL with the real slack-sdk against the Slack
simulator: queued in the routing transaction, sent by the dispatcher, deduplicated, rate
limits and outages honoured, dead rows retried."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, text

from connector.core.config import ConfigError
from connector.core.config_loading import parse_config
from connector.notify.dispatch import NotifyDispatcher, finished_rows, retry_dead
from connector.notify.settings import apply_notify_settings
from connector.routing.assign import Lead, Router
from connector.routing.reassign import reassign_lead
from connector.routing.teams import apply_teams
from crm_sandboxes.slack import SlackSandbox
from testbed.notify_org import ENV, REPS, notify_cfg, notify_yaml


@pytest.fixture
def slack() -> Iterator[SlackSandbox]:
    box = SlackSandbox().start()
    for _, _, email, uid in REPS:
        box.add_user(email, uid)
    box.add_channel("C0ADMIN")
    yield box
    box.stop()


def setup(engine: Engine, cfg: object) -> None:
    apply_teams(engine, cfg)  # type: ignore[arg-type]
    apply_notify_settings(engine, cfg)  # type: ignore[arg-type]


def rows(engine: Engine) -> list[dict[str, object]]:
    with engine.connect() as conn:
        return [
            dict(r._mapping)
            for r in conn.execute(
                text(
                    "SELECT id, kind, channel, recipient, state, dedupe_key, last_error, "
                    "attempts FROM notifications ORDER BY id"
                )
            )
        ]


def route(engine: Engine, cfg: object, n: int, fields: dict[str, str] | None = None) -> None:
    router = Router(engine, cfg)  # type: ignore[arg-type]
    for i in range(n):
        lead_fields = {"Country": "US", "Company": f"Co {i}", **(fields or {})}
        assert router.assign(Lead(f"00Q{i:04d}", lead_fields), "api").status == "assigned"


def test_an_assignment_queues_one_row_per_rep_and_channel_and_the_rep_gets_a_dm(
    engine: Engine, slack: SlackSandbox
) -> None:
    cfg = notify_cfg(slack.url)
    setup(engine, cfg)
    route(engine, cfg, 3)
    queued = rows(engine)
    assert [(r["kind"], r["channel"], r["state"]) for r in queued] == [
        ("assigned", "slack", "pending")
    ] * 3
    assert sorted(str(r["recipient"]) for r in queued) == ["005A", "005B", "005C"]
    stats = NotifyDispatcher(engine, cfg).drain()
    assert stats.sent == 3
    sent = slack.messages()
    assert sorted(m["channel"] for m in sent) == ["UADA", "UALAN", "UGRACE"]
    text_ = next(m["text"] for m in sent if m["channel"] == "UADA")
    assert "New lead for you, Ada Lovelace" in text_
    assert "Company: Co " in text_ and "Country: US" in text_
    assert "<https://acme.my.salesforce.com/lightning/r/Lead/00Q" in text_
    keys = {m["metadata"]["event_payload"]["dedupe_key"] for m in sent}
    assert keys == {str(r["dedupe_key"]) for r in queued}
    assert all(r["state"] == "sent" for r in rows(engine))
    # a second drain sends nothing again
    assert NotifyDispatcher(engine, cfg).drain().claimed == 0
    assert len(slack.messages()) == 3


def test_with_notifications_off_routing_queues_nothing(engine: Engine, slack: SlackSandbox) -> None:
    cfg = notify_cfg(slack.url)
    setup(engine, cfg)
    off = parse_config(notify_yaml(slack.url).split("notifications:")[0], "acme.yaml", ENV)
    apply_notify_settings(engine, off)  # the block removed: the settings row goes
    route(engine, off, 4)
    assert rows(engine) == []
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM notify_settings")).scalar_one() == 0


def test_a_rep_who_opted_out_gets_no_row(engine: Engine, slack: SlackSandbox) -> None:
    reps = "\n".join(
        f'    - {{crm_user_id: "{uid}", email: "{email}", opt_out: {str(uid == "005B").lower()}}}'
        for uid, _, email, _ in REPS
    )
    cfg = notify_cfg(slack.url, reps=reps)
    setup(engine, cfg)
    route(engine, cfg, 6)
    assert sorted({str(r["recipient"]) for r in rows(engine)}) == ["005A", "005C"]


def test_a_reassignment_tells_both_reps(engine: Engine, slack: SlackSandbox) -> None:
    cfg = notify_cfg(slack.url)
    setup(engine, cfg)
    route(engine, cfg, 1)
    NotifyDispatcher(engine, cfg).drain()
    first = slack.messages()[0]["channel"]
    moved = reassign_lead(engine, cfg, "00Q0000", to="005C" if first != "UGRACE" else "005A")
    after = rows(engine)[1:]
    assert sorted(str(r["kind"]) for r in after) == ["reassigned_from", "reassigned_to"]
    NotifyDispatcher(engine, cfg).drain()
    msgs = slack.messages()[1:]
    to = next(m for m in msgs if "reassigned to you" in m["text"])
    away = next(m for m in msgs if "no longer yours" in m["text"])
    assert away["channel"] == first
    assert to["channel"] != first
    assert moved.new_owner in {"005A", "005C"}
    assert "Lead reassigned to you" in to["text"] and "rotated" in to["text"]
    assert f"it went to {moved.new_name} (rotated)" in away["text"]


def test_lead_fields_cannot_inject_slack_markup(engine: Engine, slack: SlackSandbox) -> None:
    cfg = notify_cfg(slack.url)
    setup(engine, cfg)
    route(engine, cfg, 1, {"Company": "<!channel> <https://evil.test|click> & co\nline2"})
    NotifyDispatcher(engine, cfg).drain()
    (msg,) = slack.messages()
    assert "<!channel>" not in msg["text"]
    assert "<https://evil.test" not in msg["text"]
    assert "Company: &lt;!channel&gt; &lt;https://evil.test|click&gt; &amp; co line2" in msg["text"]


def test_a_burst_to_one_rep_is_grouped_and_the_rest_waits_for_the_channel(
    engine: Engine, slack: SlackSandbox
) -> None:
    slack.configure(burst=1)  # Slack's pace: one message now, the next a second later
    members = '      - {crm_user_id: "005A", name: "Ada Lovelace"}'
    cfg = notify_cfg(slack.url, members=members)
    setup(engine, cfg)
    route(engine, cfg, 30)
    stats = NotifyDispatcher(engine, cfg, claim_limit=500).drain()
    (msg,) = slack.messages()
    assert msg["text"].startswith("25 lead notifications for you, Ada Lovelace:")
    assert msg["text"].count("New lead for you") == 25
    # the rest waits for the channel's pace, untried (no 429 asked for)
    assert (stats.sent, stats.rate_limited, stats.retried) == (25, 0, 5)
    left = [r for r in rows(engine) if r["state"] != "sent"]
    assert [(r["state"], r["attempts"], r["last_error"]) for r in left] == [
        ("pending", 0, "waiting for the channel's pace")
    ] * 5
    assert slack.counters().get("ratelimited", 0) == 0


def test_slack_rate_limit_sends_rows_back_after_retry_after_uncounted(
    engine: Engine, slack: SlackSandbox
) -> None:
    cfg = notify_cfg(slack.url)
    setup(engine, cfg)
    route(engine, cfg, 1)
    slack.inject_failures(
        1, 429, {"ok": False, "error": "ratelimited"}, {"Retry-After": "7"}, "chat.postMessage"
    )
    stats = NotifyDispatcher(engine, cfg).run_once()
    assert stats.rate_limited == 1 and stats.sent == 0
    with engine.connect() as conn:
        r = conn.execute(
            text(
                "SELECT state, attempts, last_error, "
                "extract(epoch FROM available_at - now()) AS wait FROM notifications"
            )
        ).one()
    assert (r.state, r.attempts) == ("pending", 0)
    assert r.last_error == "ratelimited: retry after 7 s"
    assert 5.0 < float(r.wait) <= 7.0
    assert slack.messages() == []


def test_an_unknown_slack_user_is_dead_with_the_reason_and_retryable(
    engine: Engine, slack: SlackSandbox
) -> None:
    reps = '    - {crm_user_id: "005A", email: "nobody@acme.test"}'
    members = '      - {crm_user_id: "005A", name: "Ada Lovelace"}'
    cfg = notify_cfg(slack.url, reps=reps, members=members)
    setup(engine, cfg)
    route(engine, cfg, 1)
    stats = NotifyDispatcher(engine, cfg).drain()
    assert stats.dead == 1
    (dead,) = finished_rows(engine, "acme", "dead")
    assert dead["last_error"] == "users_not_found"
    assert slack.messages() == []
    slack.add_user("nobody@acme.test", "UNOBODY")
    assert retry_dead(engine, "acme") == 1
    assert NotifyDispatcher(engine, cfg).drain().sent == 1
    assert [m["channel"] for m in slack.messages()] == ["UNOBODY"]


def test_a_rep_without_an_address_is_dead_with_the_reason(
    engine: Engine, slack: SlackSandbox
) -> None:
    reps = '    - {crm_user_id: "005Z", email: "z@acme.test"}'
    members = '      - {crm_user_id: "005A", name: "Ada Lovelace"}'
    cfg = notify_cfg(slack.url, reps=reps, members=members)
    setup(engine, cfg)
    route(engine, cfg, 1)
    NotifyDispatcher(engine, cfg).drain()
    (dead,) = finished_rows(engine, "acme", "dead")
    assert dead["last_error"] == (
        "no_address: rep 005A has no email or slack_user_id in notifications.reps"
    )


@pytest.mark.parametrize(
    ("template", "error"),
    [
        ("Hi $nope", "unknown placeholder(s) nope"),
        ("costs 5$", "a `$` that starts no placeholder"),
    ],
)
def test_a_bad_template_is_refused_and_nothing_is_stored(
    engine: Engine, template: str, error: str
) -> None:
    extra = f'  templates: {{assigned: "{template}"}}'
    with pytest.raises(ConfigError) as info:
        parse_config(notify_yaml("http://127.0.0.1:1", extra=extra), "acme.yaml", ENV)
    assert error in str(info.value)
    assert "notifications.templates" in str(info.value)
    assert rows(engine) == []


def test_a_literal_bot_token_is_refused() -> None:
    yaml_text = notify_yaml("http://127.0.0.1:1").replace('"${SLACK_TOKEN}"', "xoxb-literal")
    with pytest.raises(ConfigError) as info:
        parse_config(yaml_text, "acme.yaml", ENV)
    assert "notifications.slack.bot_token" in str(info.value)


def test_rep_channels_need_their_settings() -> None:
    yaml_text = notify_yaml("http://127.0.0.1:1", rep_channels=("slack", "email"))
    with pytest.raises(ConfigError) as info:
        parse_config(yaml_text, "acme.yaml", ENV)
    assert "rep_channels lists email but there is no `email:` block" in str(info.value)


def test_no_address_or_lead_field_is_logged_even_at_debug(
    engine: Engine, slack: SlackSandbox, caplog: pytest.LogCaptureFixture
) -> None:
    reps = '    - {crm_user_id: "005A", email: "nobody@acme.test"}\n' + "\n".join(
        f'    - {{crm_user_id: "{uid}", email: "{email}"}}' for uid, _, email, _ in REPS[1:]
    )
    cfg = notify_cfg(slack.url, reps=reps)
    setup(engine, cfg)
    caplog.set_level(logging.DEBUG)
    route(engine, cfg, 6, {"Company": "Secretive Corp"})
    slack.inject_failures(1, 503, {"ok": False, "error": "service_unavailable"})
    d = NotifyDispatcher(engine, cfg)
    d.run_once()
    with engine.begin() as conn:
        conn.execute(text("UPDATE notifications SET available_at = now()"))
    d.drain()
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "service_unavailable" in logged and "users_not_found" in logged
    assert "@acme.test" not in logged
    assert "Secretive" not in logged
    assert "xoxb-" not in logged


def test_retention_deletes_old_sent_notifications_and_keeps_dead_ones(
    engine: Engine, slack: SlackSandbox
) -> None:
    from connector.shell.retention import purge

    cfg = notify_cfg(slack.url)
    setup(engine, cfg)
    route(engine, cfg, 3)
    NotifyDispatcher(engine, cfg).drain()
    with engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE notifications SET finished_at = now() - interval '31 days', "
                "state = CASE WHEN recipient = '005A' THEN 'dead' ELSE state END"
            )
        )
    assert purge(engine, "acme", 30).notifications_deleted == 2
    assert [(r["recipient"], r["state"]) for r in rows(engine)] == [("005A", "dead")]
