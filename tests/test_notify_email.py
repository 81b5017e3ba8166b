"""Rep notifications by email through a local SMTP relay (aiosmtpd, STARTTLS and AUTH
required): what arrives, and that a relay that is down or refuses the login delays the
messages and loses none."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from connector.notify.dispatch import NotifyDispatcher, finished_rows
from connector.notify.email import message_id
from connector.notify.settings import apply_notify_settings
from connector.routing.assign import Lead, Router
from connector.routing.teams import apply_teams
from testbed.notify_org import notify_cfg
from tests.helpers.smtp import Relay, smtp_relay


@pytest.fixture
def relay(tmp_path: Path) -> Iterator[Relay]:
    with smtp_relay(tmp_path) as r:
        yield r


def states(engine: Engine) -> list[tuple[str, str | None]]:
    with engine.connect() as conn:
        return [
            (r.state, r.last_error)
            for r in conn.execute(text("SELECT state, last_error FROM notifications ORDER BY id"))
        ]


def test_a_rep_gets_a_plain_text_email_over_starttls(engine: Engine, relay: Relay) -> None:
    cfg = notify_cfg(None, smtp_port=relay.port, ca_file=relay.ca_file, rep_channels=("email",))
    apply_teams(engine, cfg)
    apply_notify_settings(engine, cfg)
    Router(engine, cfg).assign(
        Lead(
            "00Q0001", {"Country": "US", "Company": "Evil\r\nBcc: x@evil.test", "FirstName": "Jo"}
        ),
        "api",
    )
    assert NotifyDispatcher(engine, cfg).drain().sent == 1
    (msg,) = relay.messages
    (envelope,) = relay.envelopes
    assert envelope == ("routing@acme.test", ["ada@acme.test"], True)  # STARTTLS was on
    assert msg["To"] == "ada@acme.test"
    assert msg["From"] == "routing@acme.test"
    assert msg["Bcc"] is None
    assert msg["Subject"] == "New lead for you, Ada Lovelace: Jo Evil Bcc: x@evil.test (t)"
    assert msg.get_content_type() == "text/plain"
    with engine.connect() as conn:
        key = conn.execute(text("SELECT dedupe_key FROM notifications")).scalar_one()
    assert msg["Message-ID"] == message_id(key)
    body = msg.get_payload(decode=True).decode()
    assert "https://acme.my.salesforce.com/lightning/r/Lead/00Q0001/view" in body
    assert "Company: Evil Bcc: x@evil.test" in body


@pytest.mark.fault
def test_a_relay_outage_and_a_refused_login_delay_mail_and_lose_none(
    engine: Engine, tmp_path: Path
) -> None:
    with smtp_relay(tmp_path) as relay:
        port, ca = relay.port, relay.ca_file
    # the relay is gone: every try fails on the connection, nothing is dead
    cfg = notify_cfg(None, smtp_port=port, ca_file=ca, rep_channels=("email",))
    apply_teams(engine, cfg)
    apply_notify_settings(engine, cfg)
    router = Router(engine, cfg)
    for i in range(3):
        router.assign(Lead(f"00Q000{i}", {"Country": "US"}), "api")
    d = NotifyDispatcher(engine, cfg)
    stats = d.run_once()
    assert (stats.sent, stats.dead, stats.messages) == (0, 0, 1)  # one try, the rest held back
    assert (
        states(engine)
        == [("pending", "transport: ConnectionRefusedError")]
        + [("pending", "transport: ConnectionRefusedError")] * 2
    )
    with engine.begin() as conn:
        conn.execute(text("UPDATE notifications SET available_at = now()"))
    # back, but the password is wrong: still nothing dead
    with smtp_relay(tmp_path) as relay:
        relay.password = "rotated"
        bad = NotifyDispatcher(
            engine,
            notify_cfg(None, smtp_port=relay.port, ca_file=relay.ca_file, rep_channels=("email",)),
        )
        assert bad.run_once().dead == 0
        assert {s for s in states(engine)} == {("pending", "smtp_auth: SMTP 535")}
        assert relay.messages == []
        relay.password = "pw-123"
        with engine.begin() as conn:
            conn.execute(text("UPDATE notifications SET available_at = now()"))
        assert bad.drain().sent == 3
        assert sorted(m["To"] for m in relay.messages) == [
            "ada@acme.test",
            "alan@acme.test",
            "grace@acme.test",
        ]
    assert finished_rows(engine, "acme", "dead") == []


def test_an_address_the_relay_refuses_for_good_is_dead(engine: Engine, relay: Relay) -> None:
    relay.refuse["ada@acme.test"] = 550
    cfg = notify_cfg(None, smtp_port=relay.port, ca_file=relay.ca_file, rep_channels=("email",))
    apply_teams(engine, cfg)
    apply_notify_settings(engine, cfg)
    Router(engine, cfg).assign(Lead("00Q0001", {"Country": "US"}), "api")
    assert NotifyDispatcher(engine, cfg).drain().dead == 1
    assert states(engine) == [("dead", "recipient_refused: SMTP 550")]
