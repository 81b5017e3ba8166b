"""Lead-to-account matching end to end: the poll refreshes the account mirror from the CRM
sandboxes (real simple-salesforce and hubspot-api-client), leads go to their account's
owner without moving the rotation, and every other case falls back to the team rotation."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text

from connector.core.config import ConfigError, OrgConfig
from connector.core.config_loading import parse_config
from connector.intake.poller import Poller
from connector.routing.assign import Lead, Router
from connector.routing.teams import apply_teams
from connector.shell.adapters import adapter_for
from connector.shell.cli import main
from connector.shell.status import org_status
from connector.writeback.dispatch import Dispatcher
from crm_adapters.salesforce_ids import id_key
from crm_sandboxes import HubSpotSandbox, SalesforceSandbox
from testbed.crm_orgs import OUTBOUND_SECRET, SF_ORG_ID
from testbed.harness import fairness

DOMAIN_FIELD = "accounts: {domain_field: Domain__c}"
SF_ENV = {"SF_ID": "sandbox-client", "SF_SECRET": "sandbox-secret", "SF_OUTBOUND": OUTBOUND_SECRET}


@pytest.fixture
def sf() -> Iterator[SalesforceSandbox]:
    box = SalesforceSandbox(record_work_ms=0).start()
    yield box
    box.stop()


def sf_config(
    sf: SalesforceSandbox,
    members: list[tuple[str, bool]],
    intake: str,
    obj: str = "Lead",
    extra: str = "",
    accounts: str = "",
) -> OrgConfig:
    lines = "\n".join(
        f'      - {{crm_user_id: "{u}", name: "Rep {i}", active: {str(a).lower()}}}'
        for i, (u, a) in enumerate(members)
    )
    yaml = f"""
org: acme
crm:
  kind: salesforce
  instance_url: {sf.url}
  auth: {{method: client_credentials, client_id: "${{SF_ID}}", client_secret: "${{SF_SECRET}}"}}
  object: {obj}
  organization_id: {SF_ORG_ID}
  outbound_secrets: ["${{SF_OUTBOUND}}"]
intake_owner_ids: ["{intake}"]
poll: {{overlap_seconds: 0}}
{accounts}
teams:
  - name: ae
    members:
{lines}
{extra}
rules:
  - {{name: by-account, team: ae, route_to: account_owner}}
"""
    return parse_config(yaml, "acme.yaml", SF_ENV)


def assignments(engine: Engine) -> dict[str, dict[str, Any]]:
    """crm_id -> owner, team, account_match of every assignment."""
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT l.crm_id, a.crm_user_id, t.name AS team, a.account_match "
                "FROM assignments a JOIN leads l ON l.id = a.lead_id "
                "JOIN teams t ON t.id = a.team_id"
            )
        ).all()
    return {
        r.crm_id: {"owner": r.crm_user_id, "team": r.team, "match": r.account_match} for r in rows
    }


def rotation_counts(engine: Engine) -> dict[str, int]:
    with engine.connect() as conn:
        return dict(conn.execute(text("SELECT crm_user_id, assigned_in_epoch FROM members")).all())


def mirror(engine: Engine) -> dict[str, tuple[str | None, list[str]]]:
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT a.crm_id, a.owner_id, "
                "  coalesce(array_agg(d.domain ORDER BY d.domain) "
                "           FILTER (WHERE d.domain IS NOT NULL), '{}') AS domains "
                "FROM crm_accounts a LEFT JOIN crm_account_domains d "
                "  ON d.org = a.org AND d.crm_id = a.crm_id GROUP BY a.crm_id, a.owner_id"
            )
        ).all()
    return {r.crm_id: (r.owner_id, list(r.domains)) for r in rows}


def test_poll_refreshes_accounts_and_routes_leads_to_account_owners(
    engine: Engine, sf: SalesforceSandbox
) -> None:
    ada, alan, gone, stranger = (sf.add_user(n) for n in ("Ada", "Alan", "Gone", "Stranger"))
    intake = sf.add_user("Intake")
    cfg = sf_config(sf, [(ada, True), (alan, True), (gone, False)], intake, accounts=DOMAIN_FIELD)
    apply_teams(engine, cfg)
    # accounts last modified hours ago, one hour apart (the newest is the first watermark)
    ago = [datetime.now(UTC) - timedelta(hours=h) for h in range(6, 0, -1)]
    acme = sf.add_account("Acme", ada, "https://WWW.Acme.io/about", modstamp=ago[0])
    globex = sf.add_account("Globex", gone, "globex.com", modstamp=ago[1])
    initech = sf.add_account(
        "Initech", stranger, None, {"Domain__c": "initech.com; initech.de"}, ago[2]
    )
    dup_a = sf.add_account("Dup A", ada, "http://dup.com", modstamp=ago[3])
    dup_b = sf.add_account("Dup B", alan, None, {"Domain__c": "shop.dup.com"}, ago[4])
    free = sf.add_account(
        "Freemailer", alan, "https://www.gmail.com", {"Domain__c": "gmail.com"}, ago[5]
    )

    leads = {
        "by_email": sf.add_record("Lead", intake, fields={"Email": "jane@sales.acme.io"}),
        "by_website": sf.add_record(
            "Lead", intake, fields={"Email": "j@gmail.com", "Website": "acme.io"}
        ),
        "inactive": sf.add_record("Lead", intake, fields={"Email": "x@globex.com"}),
        "not_a_rep": sf.add_record("Lead", intake, fields={"Email": "y@initech.de"}),
        "ambiguous": sf.add_record("Lead", intake, fields={"Email": "z@dup.com"}),
        "unknown": sf.add_record("Lead", intake, fields={"Email": "w@unknown.org"}),
        "free_mail": sf.add_record("Lead", intake, fields={"Email": "v@gmail.com"}),
    }
    poller = Poller(engine, cfg, adapter_for(cfg))
    first = poller.poll_once()
    assert first.accounts is not None and first.accounts.seen == 6
    assert mirror(engine) == {
        acme: (ada, ["acme.io"]),
        globex: (gone, ["globex.com"]),
        initech: (stranger, ["initech.com", "initech.de"]),
        dup_a: (ada, ["dup.com"]),
        dup_b: (alan, ["dup.com"]),
        free: (alan, []),  # free-mail domains are never indexed
    }
    got = assignments(engine)
    by = {k: got[v] for k, v in leads.items()}
    assert by["by_email"] == {
        "owner": ada,
        "team": "ae",
        "match": {
            "result": "matched",
            "by": "domain",
            "account_id": acme,
            "owner_id": ada,
            "field": "Email",
            "domain": "acme.io",
        },
    }
    assert by["by_website"]["owner"] == ada
    assert by["by_website"]["match"]["field"] == "Website"
    assert by["inactive"]["match"] == {
        "result": "owner_inactive",
        "by": "domain",
        "account_id": globex,
        "owner_id": gone,
        "field": "Email",
        "domain": "globex.com",
    }
    assert by["not_a_rep"]["match"]["result"] == "owner_not_a_rep"
    assert by["ambiguous"]["match"] == {
        "result": "ambiguous",
        "by": "domain",
        "field": "Email",
        "domain": "dup.com",
        "candidates": [dup_b, dup_a],  # newest first
    }
    assert by["unknown"]["match"] == {"result": "no_account"}
    assert by["free_mail"]["match"] == {"result": "no_account"}
    fallbacks = ["inactive", "not_a_rep", "ambiguous", "unknown", "free_mail"]
    assert all(by[k]["owner"] in (ada, alan) for k in fallbacks)
    # the two matched leads are not turns of the rotation: only the fallbacks are counted
    counts = rotation_counts(engine)
    assert counts[ada] + counts[alan] == len(fallbacks) and counts[gone] == 0

    # the owners reach the CRM through the ordinary write-back
    Dispatcher(engine, cfg.org, adapter_for(cfg), intake_owner_ids=cfg.intake_owner_ids).drain(
        timeout=60
    )
    assert sf.get_record(leads["by_email"])["OwnerId"] == ada  # type: ignore[index]
    assert sf.get_record(leads["by_website"])["OwnerId"] == ada  # type: ignore[index]

    # the watermark: the next refresh reads what changed since, and the account at the mark
    assert first.accounts.watermark == ago[5].replace(microsecond=ago[5].microsecond // 1000 * 1000)
    sf.edit_account(globex, OwnerId=alan)
    hooli = sf.add_account("Hooli", alan, "https://hooli.xyz")
    second = poller.poll_once()
    assert second.accounts is not None
    assert (second.accounts.seen, second.accounts.stored) == (3, 3)  # free, globex, hooli
    assert mirror(engine)[globex] == (alan, ["globex.com"])
    assert mirror(engine)[hooli] == (alan, ["hooli.xyz"])
    late = sf.add_record("Lead", intake, fields={"Email": "new@globex.com"})
    poller.poll_once()
    assert assignments(engine)[late]["owner"] == alan
    assert assignments(engine)[late]["match"]["result"] == "matched"


def test_a_matched_lead_does_not_advance_the_rotation(
    engine: Engine, sf: SalesforceSandbox
) -> None:
    ada, alan = sf.add_user("Ada"), sf.add_user("Alan")
    intake = sf.add_user("Intake")
    cfg = sf_config(sf, [(ada, True), (alan, True)], intake)
    apply_teams(engine, cfg)
    sf.add_account("Acme", ada, "acme.io")
    Poller(engine, cfg, adapter_for(cfg)).poll_once()
    router = Router(engine, cfg)
    owners = []
    for i in range(7):  # rotation, matched, rotation, matched, ...
        email = f"p{i}@acme.io" if i % 2 else f"p{i}@elsewhere{i}.com"
        outcome = router.assign(Lead(f"00Q00000000{i:04d}", {"Email": email}), "api")
        owners.append((outcome.owner_id, outcome.account_id is not None))
    rotation = [o for o, matched in owners if not matched]
    assert [m for _, m in owners] == [False, True, False, True, False, True, False]
    assert all(o == ada for o, matched in owners if matched)
    # the rotation alternates as if the matched leads had never come (Ada got 3 of them)
    assert rotation == [ada, alan, ada, alan]
    assert rotation_counts(engine) == {ada: 2, alan: 2}
    # `connector status` tells the two apart
    members = org_status(engine, cfg)["teams"][0]["members"]
    assert [(m["assigned"], m["account_matched"]) for m in members] == [(5, 3), (2, 0)]
    # matched and rotation leads alike: each assignment's owner is its member's, and so is
    # its owner write's
    assert fairness(engine, cfg.org)["owner_mismatches"] == 0


def test_contacts_go_to_their_accounts_owner(engine: Engine, sf: SalesforceSandbox) -> None:
    ada, alan, gone = sf.add_user("Ada"), sf.add_user("Alan"), sf.add_user("Gone")
    intake = sf.add_user("Intake")
    cfg = sf_config(sf, [(ada, True), (alan, True), (gone, False)], intake, obj="Contact")
    apply_teams(engine, cfg)
    acme = sf.add_account("Acme", alan, "acme.io")
    globex = sf.add_account("Globex", gone, "globex.com")
    unsynced_parent = "001SB9999999999"  # an Account the mirror does not know
    contacts = {
        "parent": sf.add_record("Contact", intake, acme, {"Email": "a@gmail.com"}),
        # the parent wins over the email's domain
        "parent_over_domain": sf.add_record("Contact", intake, acme, {"Email": "b@globex.com"}),
        "inactive_parent": sf.add_record("Contact", intake, globex, {"Email": "c@acme.io"}),
        "unknown_parent": sf.add_record(
            "Contact", intake, unsynced_parent, {"Email": "d@www.acme.io"}
        ),
    }
    Poller(engine, cfg, adapter_for(cfg)).poll_once()
    got = assignments(engine)
    by = {k: got[v] for k, v in contacts.items()}
    assert by["parent"]["owner"] == alan
    assert by["parent"]["match"] == {
        "result": "matched",
        "by": "parent",
        "account_id": acme,
        "owner_id": alan,
    }
    assert by["parent_over_domain"]["owner"] == alan
    assert by["inactive_parent"]["match"]["result"] == "owner_inactive"
    assert by["inactive_parent"]["owner"] in (ada, alan)
    # an unknown parent falls through to the email's domain
    assert by["unknown_parent"]["match"]["by"] == "domain"
    assert by["unknown_parent"]["owner"] == alan
    assert rotation_counts(engine)[ada] + rotation_counts(engine)[alan] == 1


def test_owner_in_another_team_is_recorded_in_that_team_without_locking_it(
    engine: Engine, sf: SalesforceSandbox
) -> None:
    ada, alan, grace = sf.add_user("Ada"), sf.add_user("Alan"), sf.add_user("Grace")
    intake = sf.add_user("Intake")
    extra = f"""  - name: emea
    members:
      - {{crm_user_id: "{grace}", name: Grace}}"""
    cfg = sf_config(sf, [(ada, True), (alan, True)], intake, extra=extra)
    apply_teams(engine, cfg)
    sf.add_account("Big", grace, "big.example.com")
    Poller(engine, cfg, adapter_for(cfg)).poll_once()
    out = Router(engine, cfg).assign(Lead("00QSB0000000001", {"Email": "x@big.example.com"}), "api")
    assert (out.owner_id, out.team, out.status) == (grace, "emea", "assigned")
    assert rotation_counts(engine) == {ada: 0, alan: 0, grace: 0}


def test_hubspot_companies_refresh_and_contacts_match(engine: Engine, hs: HubSpotSandbox) -> None:
    kim, lee, gone = hs.add_owner("Kim"), hs.add_owner("Lee"), hs.add_owner("Gone")
    yaml = f"""
org: globex
crm:
  kind: hubspot
  base_url: {hs.url}
  auth: {{access_token: "${{HS_TOKEN}}"}}
  object: contacts
teams:
  - name: smb
    members:
      - {{crm_user_id: "{kim}", name: Kim}}
      - {{crm_user_id: "{lee}", name: Lee}}
      - {{crm_user_id: "{gone}", name: Gone, active: false}}
rules:
  - {{team: smb, route_to: account_owner}}
"""
    cfg = parse_config(yaml, "globex.yaml", {"HS_TOKEN": hs.access_token})
    apply_teams(engine, cfg)
    initech = hs.add_company(kim, domain="initech.com", website="https://www.initech.com")
    hs.add_company(gone, domain="umbrella.co.uk")
    hs.add_company(None, domain="ownerless.io")
    matched = hs.add_record("contacts", None, {"email": "a@mail.initech.com"})
    by_site = hs.add_record("contacts", None, {"email": "b@gmail.com", "website": "initech.com"})
    inactive = hs.add_record("contacts", None, {"email": "c@umbrella.co.uk"})
    ownerless = hs.add_record("contacts", None, {"email": "d@ownerless.io"})

    result = Poller(engine, cfg, adapter_for(cfg)).poll_once()
    assert result.accounts is not None and result.accounts.seen == 3
    got = assignments(engine)
    assert got[matched]["owner"] == kim
    assert got[matched]["match"]["account_id"] == initech
    assert got[by_site]["owner"] == kim and got[by_site]["match"]["field"] == "website"
    assert got[inactive]["match"]["result"] == "owner_inactive"
    assert got[ownerless]["match"]["result"] == "no_owner"
    counts = rotation_counts(engine)
    assert counts[kim] + counts[lee] == 2 and counts[gone] == 0


# --- configuration --------------------------------------------------------------------------

BASE = """
org: acme
crm:
  kind: salesforce
  instance_url: https://acme.my.salesforce.com
  auth: {method: session, access_token: "${TOKEN}"}
  object: Lead
intake_owner_ids: ["00G000000000001"]
teams:
  - name: ae
    members: [{crm_user_id: "005A", name: Ada}]
rules:
  - {team: ae, route_to: account_owner}
"""
HUBSPOT = """
org: globex
crm:
  kind: hubspot
  auth: {access_token: "${TOKEN}"}
  object: leads
teams:
  - name: smb
    members: [{crm_user_id: "101", name: Kim}]
rules:
  - {team: smb, route_to: account_owner}
"""


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            BASE.replace("route_to: account_owner", "route_to: account"),
            "13: rules[0].route_to: `account` is not allowed; did you mean `account_owner`?",
        ),
        (
            BASE.replace("route_to: account_owner", "route_to: team")
            + "accounts: {domain_field: Domain__c}\n",
            "14: accounts: set, but no rule has `route_to: account_owner`; remove it, or add "
            "that rule",
        ),
        (
            BASE + "accounts: {domain_field: Domain c}\n",
            "14: accounts.domain_field: not a CRM field name (letters, digits and _ only)",
        ),
        (
            BASE + "accounts: {match_fields: []}\n",
            "14: accounts.match_fields: lists no fields; omit it for the default",
        ),
        (
            BASE + "accounts: {match_fields: [Email, Web-site]}\n",
            "14: accounts.match_fields[1]: `Web-site` is not a CRM field name (letters, digits "
            "and _ only)",
        ),
        (
            BASE + "accounts: {match_fields: [Email, Email]}\n",
            "14: accounts.match_fields[1]: `Email` is listed twice; list each field once",
        ),
        (
            BASE + "accounts: {domian_field: Domain__c}\n",
            "14: accounts.domian_field: unknown key; did you mean `domain_field`?",
        ),
        (
            HUBSPOT.replace("object: leads", "object: contacts")
            + "accounts: {domain_field: domain}\n",
            "12: accounts.domain_field: for Salesforce only (HubSpot companies are matched by "
            "their domain and website properties); remove it",
        ),
        (
            HUBSPOT,
            "11: rules[0].route_to: account_owner, but a leads record has no default field to "
            "match; set accounts.match_fields or crm.parent_field",
        ),
        (
            BASE.replace("{team: ae,", "{team: na,"),
            "13: rules[0].team: unknown team `na`; write one of: ae",
        ),
    ],
)  # fmt: skip
def test_account_config_errors_are_exact(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(text, "x.yaml", {"TOKEN": "t"})
    assert str(err.value) == f"x.yaml:{message}"


def test_account_config_defaults_and_read_fields() -> None:
    cfg = parse_config(BASE, "x.yaml", {"TOKEN": "t"})
    assert cfg.account_matching and cfg.match_fields == ("Email", "Website")
    assert cfg.read_fields == ["Email", "Website"]
    contact = parse_config(
        BASE.replace("object: Lead", "object: Contact"), "x.yaml", {"TOKEN": "t"}
    )
    assert contact.match_fields == ("Email",) and contact.read_fields == ["AccountId", "Email"]
    hs = parse_config(HUBSPOT + "accounts: {match_fields: [email]}\n", "x.yaml", {"TOKEN": "t"})
    assert hs.match_fields == ("email",)
    plain = parse_config(BASE.replace(", route_to: account_owner", ""), "x.yaml", {"TOKEN": "t"})
    assert not plain.account_matching and plain.read_fields == []
    off = parse_config(BASE + "poll: {enabled: false}\n", "x.yaml", {"TOKEN": "t"})
    assert (
        "poll.enabled: false: the account mirror is refreshed by the poll, so route_to: "
        "account_owner only sees accounts synced before it was turned off"
    ) in off.warnings()
    assert not any("poll.enabled" in w for w in cfg.warnings())


def test_a_bad_account_config_stores_nothing(
    db_url: str, engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    bad = tmp_path / "acme.yaml"
    bad.write_text(BASE.replace("route_to: account_owner", "route_to: owner"), encoding="utf-8")
    monkeypatch.setenv("DATABASE_URL", db_url)
    monkeypatch.setenv("TOKEN", "t")

    def counts() -> dict[str, int]:
        with engine.connect() as conn:
            return {
                t: conn.execute(text(f"SELECT count(*) FROM {t}")).scalar_one()
                for t in ("teams", "members", "crm_accounts", "leads", "assignments")
            }

    before = counts()
    code = main(["--config", str(bad), "migrate"])
    err = capsys.readouterr().err
    assert code == 2
    assert err == (
        f"{bad}:13: rules[0].route_to: `owner` is not allowed; write one of: account_owner, team\n"
    )
    assert (
        counts()
        == before
        == {
            "teams": 0,
            "members": 0,
            "crm_accounts": 0,
            "leads": 0,
            "assignments": 0,
        }
    )


def test_decisions_are_json_objects(engine: Engine, sf: SalesforceSandbox) -> None:
    """account_match is a jsonb object that explain can read without parsing text."""
    ada = sf.add_user("Ada")
    intake = sf.add_user("Intake")
    cfg = sf_config(sf, [(ada, True)], intake)
    apply_teams(engine, cfg)
    Router(engine, cfg).assign(Lead("00QSB0000000009", {"Email": "x@nowhere.net"}), "api")
    with engine.connect() as conn:
        kind = conn.execute(text("SELECT jsonb_typeof(account_match) FROM assignments")).scalar()
        raw = conn.execute(text("SELECT account_match::text FROM assignments")).scalar()
    assert kind == "object" and json.loads(str(raw)) == {"result": "no_account"}
    assert id_key("00QSB0000000009") in assignments(engine)
