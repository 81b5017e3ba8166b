"""`connector notify list|retry` and the notification part of `check-config --online`."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from connector.notify.checks import online_check
from connector.notify.dispatch import NotifyDispatcher
from connector.notify.settings import apply_notify_settings
from connector.routing.assign import Lead, Router
from connector.routing.teams import apply_teams
from connector.shell.cli import main
from crm_sandboxes.slack import SlackSandbox
from testbed.notify_org import ENV, notify_cfg, notify_yaml
from tests.helpers.smtp import smtp_relay


def test_notify_list_and_retry_dead_rows(
    engine: Engine,
    db_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    with SlackSandbox() as slack:  # nobody is a Slack user: every row is dead
        yaml_text = notify_yaml(slack.url)
        (tmp_path / "acme.yaml").write_text(yaml_text)
        cfg = notify_cfg(slack.url)
        apply_teams(engine, cfg)
        apply_notify_settings(engine, cfg)
        router = Router(engine, cfg)
        for i in range(2):
            router.assign(Lead(f"00Q000{i}", {"Country": "US"}), "api")
        assert NotifyDispatcher(engine, cfg).drain().dead == 2
    monkeypatch.setenv("DATABASE_URL", db_url)
    for k, v in ENV.items():
        monkeypatch.setenv(k, v)
    config = ["--config", str(tmp_path / "acme.yaml")]
    assert main([*config, "notify", "list"]) == 0
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert len(lines) == 2 and all("\tassigned\tslack\t005" in line for line in lines)
    assert all(line.endswith("\tattempts=1\tusers_not_found") for line in lines)
    assert err == "2 dead notifications\n"
    assert "@acme.test" not in out + err  # no address is printed
    first = int(lines[0].split("\t")[0])
    assert main([*config, "notify", "retry", "--id", str(first)]) == 0
    assert capsys.readouterr().out == "requeued 1 dead notifications\n"
    with engine.connect() as conn:
        states = conn.execute(text("SELECT state FROM notifications ORDER BY id")).scalars().all()
    assert states == ["pending", "dead"]


def test_notify_list_refuses_an_unknown_state(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        main(["notify", "list", "--state", "held"])
    assert info.value.code == 2
    assert "invalid choice: 'held'" in capsys.readouterr().err


def test_online_check_reports_missing_scopes_and_a_refused_login(tmp_path: Path) -> None:
    with SlackSandbox(scopes=("chat:write",)) as slack, smtp_relay(tmp_path) as relay:
        cfg = notify_cfg(slack.url, smtp_port=relay.port, ca_file=relay.ca_file)
        assert online_check(cfg) == (
            [f"email: 127.0.0.1:{relay.port} accepted STARTTLS and login"],
            ["Slack: the bot token lacks the scopes users:read, users:read.email"],
        )
        relay.password = "other"
        slack.configure(scopes=["chat:write", "users:read", "users:read.email"])
        assert online_check(cfg) == (
            ["Slack: the bot token has chat:write, users:read, users:read.email"],
            [f"email: 127.0.0.1:{relay.port}: smtp_auth: SMTP 535"],
        )
        slack.configure(token="xoxb-another")
        _, problems = online_check(cfg)
        assert problems[0] == "Slack: auth.test failed: invalid_auth"
