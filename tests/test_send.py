"""`connector send`: what it posts is what the product's own parsers and signature check
accept, a running receiver stores it, and every bad input is one line, exit 2, nothing sent."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from pydantic import SecretStr
from sqlalchemy import Engine, text

from connector.core.config import HubSpotCrm, OrgConfig, SalesforceCrm
from connector.core.config_loading import load_configs
from connector.intake.hubspot_events import lead_events, parse_events
from connector.intake.receivers import create_app
from connector.intake.signatures import verify_v3
from connector.intake.soap import parse_outbound_message
from connector.routing.teams import apply_teams
from connector.shell.cli import main
from connector.shell.demo_world import (
    ENV,
    HS_PORTAL,
    SF_ORG_ID,
    hubspot_yaml,
    salesforce_yaml,
    seed_hubspot_owners,
    seed_salesforce_users,
)
from connector.shell.send import build_requests
from connector.shell.service import serve_in_thread
from crm_sandboxes import HubSpotSandbox, SalesforceSandbox
from tests.helpers.ports import free_port

LEADS = ["00QSB00000000082AA", "00QSB00000000092AA"]
NOW_MS = 1_765_000_000_000


@dataclass
class Orgs:
    folder: Path
    configs: dict[str, OrgConfig]


@pytest.fixture
def orgs(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    sf: SalesforceSandbox,
    hs: HubSpotSandbox,
) -> Orgs:
    """The sandbox command's two configs (org sandbox-sf and sandbox-hs), in one folder."""
    for name, value in ENV.items():
        monkeypatch.setenv(name, value)
    for name in ("CONNECTOR_CONFIG", "CONNECTOR_PORT"):
        monkeypatch.delenv(name, raising=False)
    reps, intake = seed_salesforce_users(sf)
    (tmp_path / "sf.yaml").write_text(salesforce_yaml(sf, reps, intake, org="sandbox-sf"))
    owners = seed_hubspot_owners(hs)
    (tmp_path / "hs.yaml").write_text(hubspot_yaml(hs, owners, org="sandbox-hs"))
    return Orgs(tmp_path, load_configs(tmp_path))


def test_an_outbound_message_is_what_salesforce_sends(orgs: Orgs) -> None:
    cfg = orgs.configs["sandbox-sf"]
    assert isinstance(cfg.crm, SalesforceCrm)
    (d,) = build_requests(cfg, "http://127.0.0.1:8080/", LEADS, None, NOW_MS)
    secret = ENV["DEMO_SF_OUTBOUND_SECRET"]
    assert d.url == f"http://127.0.0.1:8080/webhooks/salesforce/sandbox-sf/{secret}"
    assert secret not in d.shown_url and d.records == 2
    message = parse_outbound_message(d.body)
    assert message.organization_id == SF_ORG_ID
    assert [(n.sobject_type, n.sobject_id) for n in message.notifications] == [
        ("Lead", rid) for rid in LEADS
    ]
    assert len({n.notification_id for n in message.notifications}) == 2
    assert d.headers["Content-Type"].startswith("text/xml")


def test_a_hubspot_webhook_is_signed_as_hubspot_signs(orgs: Orgs) -> None:
    contacts = orgs.configs["sandbox-hs"]
    assert isinstance(contacts.crm, HubSpotCrm)
    leads = contacts.model_copy(update={"crm": contacts.crm.model_copy(update={"object": "leads"})})
    for cfg, type_id in ((contacts, "0-1"), (leads, "0-136")):
        (d,) = build_requests(cfg, "http://127.0.0.1:8080", ["1001", "1002"], None, NOW_MS)
        assert d.url == d.shown_url == "http://127.0.0.1:8080/webhooks/hubspot/sandbox-hs"
        verify_v3(
            [ENV["DEMO_HS_WEBHOOK_SECRET"]],
            "POST",
            d.url,
            d.body,
            d.headers["X-HubSpot-Signature-v3"],
            d.headers["X-HubSpot-Request-Timestamp"],
            NOW_MS,
        )
        events = parse_events(d.body)
        assert [(e.portal_id, e.object_id, e.object_type) for e in events] == [
            (HS_PORTAL, 1001, type_id),
            (HS_PORTAL, 1002, type_id),
        ]
        # the receiver keeps them: creations of the configured object
        assert lead_events(events, routed_properties=[], object_type_ids={type_id}) == events


def test_more_than_a_hundred_records_go_in_messages_of_a_hundred(orgs: Orgs) -> None:
    ids = [f"00QSB{n:010d}" for n in range(1, 251)]
    deliveries = build_requests(orgs.configs["sandbox-sf"], "http://h:1", ids, None, NOW_MS)
    assert [d.records for d in deliveries] == [100, 100, 50]
    sent = [n.sobject_id for d in deliveries for n in parse_outbound_message(d.body).notifications]
    assert sent == ids


# --- against a running receiver ---------------------------------------------------------------


@pytest.fixture
def receiver(engine: Engine, orgs: Orgs) -> Iterator[str]:
    """The connector's webhook listener on the real database, without CRM access: what it
    takes stays in its inbox, where the tests count it."""
    for cfg in orgs.configs.values():
        apply_teams(engine, cfg)
    with serve_in_thread(create_app(engine, orgs.configs)) as base:
        yield base


def inbox(engine: Engine) -> list[tuple[str, str]]:
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT org, crm_id FROM intake_events ORDER BY id")).all()
    return [(r.org, r.crm_id) for r in rows]


def send(orgs: Orgs, *args: str) -> int:
    return main(["--config", str(orgs.folder), "send", *args])


def test_send_salesforce_to_a_running_connector(
    orgs: Orgs, receiver: str, engine: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    assert send(orgs, "--org", "sandbox-sf", "--url", receiver, *LEADS) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == (
        f"POST {receiver}/webhooks/salesforce/sandbox-sf/<crm.outbound_secrets[0]> "
        "(Outbound Message, 2 records)"
    )
    assert out[1].startswith("HTTP 200 <soapenv:Envelope") and "<Ack>true</Ack>" in out[1]
    assert sorted(inbox(engine)) == [("sandbox-sf", rid) for rid in LEADS]


def test_send_hubspot_to_a_running_connector(
    orgs: Orgs,
    receiver: str,
    engine: Engine,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CONNECTOR_PORT", receiver.rpartition(":")[2])  # the default URL
    assert send(orgs, "--org", "sandbox-hs", "1001") == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [
        f"POST {receiver}/webhooks/hubspot/sandbox-hs (webhook, 1 record)",
        'HTTP 200 {"events":1,"queued":1,"duplicates":0,"foreign":0}',
    ]
    assert inbox(engine) == [("sandbox-hs", "1001")]


def test_a_refused_delivery_prints_the_answer_and_exits_1(
    orgs: Orgs, engine: Engine, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The receiver knows another URL secret than the sender's config: 404, nothing stored."""
    cfg = orgs.configs["sandbox-sf"]
    assert isinstance(cfg.crm, SalesforceCrm)
    other = cfg.model_copy(
        update={"crm": cfg.crm.model_copy(update={"outbound_secrets": [SecretStr("x" * 32)]})}
    )
    apply_teams(engine, other)
    with serve_in_thread(create_app(engine, {other.org: other})) as base:
        assert send(orgs, "--org", "sandbox-sf", "--url", base, LEADS[0]) == 1
    captured = capsys.readouterr()
    assert captured.out.splitlines()[1].startswith("HTTP 404 ")
    assert captured.err == "connector: send: the connector did not take the Outbound Message\n"
    assert inbox(engine) == []


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (
            ["--org", "nope", "00QSB00000000082AA"],
            "connector: org 'nope' is not configured (known: sandbox-hs, sandbox-sf)",
        ),
        (
            ["00QSB00000000082AA"],
            "connector: several orgs configured (sandbox-hs, sandbox-sf): pass --org",
        ),
        (
            ["--org", "sandbox-sf", "--object", "Opportunity", "00QSB00000000082AA"],
            "connector: send: unknown record kind 'Opportunity' for salesforce org "
            "'sandbox-sf' (known: Lead, Contact)",
        ),
        (
            ["--org", "sandbox-hs", "--object", "deals", "1001"],
            "connector: send: unknown record kind 'deals' for hubspot org 'sandbox-hs' "
            "(known: contacts, leads)",
        ),
        (
            ["--org", "sandbox-sf", "00QSB00000000082AA", "someone@example.com"],
            "connector: send: record 2 is not a Salesforce record id (15 or 18 letters and digits)",
        ),
        (
            ["--org", "sandbox-hs", "1001", "12abc"],
            "connector: send: record 2 is not a HubSpot record id (a whole number)",
        ),
        (
            ["--org", "sandbox-hs", "0"],
            "connector: send: record 1 is not a HubSpot record id (a whole number)",
        ),
        (
            ["--org", "sandbox-sf", "--url", "ftp://h/x", "00QSB00000000082AA"],
            "connector: send: --url 'ftp://h/x': give the connector's base URL, e.g. "
            "http://127.0.0.1:8080",
        ),
    ],
)
def test_bad_input_is_one_line_exit_2_and_nothing_sent(
    orgs: Orgs,
    receiver: str,
    engine: Engine,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    args: list[str],
    error: str,
) -> None:
    monkeypatch.setenv("CONNECTOR_PORT", receiver.rpartition(":")[2])  # would reach it
    assert send(orgs, *args) == 2
    captured = capsys.readouterr()
    assert captured.err == error + "\n"
    assert captured.out == ""
    assert inbox(engine) == []


def test_an_org_without_the_secret_is_refused_before_sending(
    orgs: Orgs, receiver: str, engine: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    sf_yaml = (orgs.folder / "sf.yaml").read_text()
    (orgs.folder / "sf.yaml").write_text(
        sf_yaml.replace('  outbound_secrets: ["${DEMO_SF_OUTBOUND_SECRET}"]\n', "")
    )
    assert send(orgs, "--org", "sandbox-sf", "--url", receiver, LEADS[0]) == 2
    assert capsys.readouterr().err == (
        "connector: send: org 'sandbox-sf' has no crm.outbound_secrets: the connector "
        "refuses Outbound Messages without one\n"
    )
    assert inbox(engine) == []


def test_a_connector_that_is_not_running_is_one_line_exit_2(
    orgs: Orgs, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    assert send(orgs, "--org", "sandbox-hs", "--url", url, "1001") == 2
    captured = capsys.readouterr()
    assert captured.err == (
        f"connector: send: cannot reach the connector at {url}: nothing answers there "
        "(is `connector run` running?)\n"
    )
    assert captured.out == ""
