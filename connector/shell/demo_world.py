"""`connector demo`'s world: the two orgs' config, their CRM users and the records of the
burst, made in the CRM sandboxes before any delivery is sent (``connector.shell.demo`` runs
the flow)."""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import Engine

from connector.core.config import OrgConfig
from connector.core.config_loading import load_configs
from connector.notify.settings import apply_notify_settings
from connector.routing.teams import apply_teams
from connector.shell.demo_notify import DEMO_SLACK_TOKEN, rep_email, slack_block
from connector.shell.reps import resolve_rep, set_away
from crm_sandboxes import HubSpotSandbox, SalesforceSandbox, SlackSandbox

SF_ORG_ID = "00D000000000001AAA"
HS_PORTAL = 62515
ENV = {
    "DEMO_SF_CLIENT_ID": "sandbox-client",
    "DEMO_SF_CLIENT_SECRET": "sandbox-secret",
    "DEMO_HS_TOKEN": "sandbox-token",
    "DEMO_HS_WEBHOOK_SECRET": "demo-app-client-secret",
    # The secret Salesforce's endpoint URL ends with (an Outbound Message has no signature).
    "DEMO_SF_OUTBOUND_SECRET": "demo-outbound-url-secret-8Jq2vXw5",
    "DEMO_SLACK_BOT_TOKEN": DEMO_SLACK_TOKEN,
}
DEMO_CAP = 20  # Tony Hoare's leads per day
SF_COUNTRIES = ["US", "CA", "us", "DE", "FR", "GB", "NL", "SE"]
HS_COUNTRIES = ["United States", "Canada", "Germany", "France", "Japan"]


SF_REP_NAMES = [
    "Ada Lovelace",
    "Alan Turing",
    "Grace Hopper",
    "Edsger Dijkstra",
    "Barbara Liskov",
    "Tony Hoare",
]
SF_INTAKE_NAME = "Lead intake (integration user)"
HS_OWNER_NAMES = ["Hedy Lamarr", "Katherine Johnson", "Margaret Hamilton", "Radia Perlman"]


def seed_salesforce_users(sf: SalesforceSandbox) -> tuple[list[str], str]:
    """The Salesforce org's users, as the configs name them: (the six reps, the integration
    user that owns new leads until they are routed)."""
    reps = [sf.add_user(name) for name in SF_REP_NAMES]
    return reps, sf.add_user(SF_INTAKE_NAME)


def seed_hubspot_owners(hs: HubSpotSandbox) -> list[str]:
    """The HubSpot portal's four owners, as the configs name them."""
    return [hs.add_owner(name) for name in HS_OWNER_NAMES]


def _poll_yaml(interval_seconds: int | None) -> str:
    if interval_seconds is None:  # the defaults: every 60 s
        return ""
    return f"poll:\n  interval_seconds: {interval_seconds}\n  overlap_seconds: 5\n"


def salesforce_yaml(
    sf: SalesforceSandbox,
    reps: list[str],
    intake: str,
    *,
    org: str = "demo-sf",
    written_by: str = "connector demo",
    poll_interval_seconds: int | None = 1,
    slack_url: str | None = None,
) -> str:
    """A Salesforce org routing Leads over the sandbox ``sf``; secrets are ${ENV} names of
    ``ENV``."""
    names = SF_REP_NAMES
    na = "\n".join(
        f'      - {{crm_user_id: "{reps[i]}", name: {names[i]}, weight: {w}}}'
        for i, w in zip(range(3), (1, 1, 2), strict=True)
    )
    emea = "\n".join(f'      - {{crm_user_id: "{reps[i]}", name: {names[i]}}}' for i in range(3, 5))
    # a rep with a daily cap (the demo sends more than that to his team)
    emea += (
        f'\n      - {{crm_user_id: "{reps[5]}", name: {names[5]}, caps: {{per_day: {DEMO_CAP}}}}}'
    )

    return f"""\
# Written by `{written_by}`: a Salesforce org routing Leads. Secrets are ${{ENV}} references.
org: {org}
crm:
  kind: salesforce
  instance_url: {sf.url}
  organization_id: "{SF_ORG_ID}"
  outbound_secrets: ["${{DEMO_SF_OUTBOUND_SECRET}}"]
  auth: {{method: client_credentials, client_id: "${{DEMO_SF_CLIENT_ID}}",
         client_secret: "${{DEMO_SF_CLIENT_SECRET}}"}}
  object: Lead
# New Leads are owned by the integration user until routed; anything else is a person's.
intake_owner_ids: ["{intake}"]
{_poll_yaml(poll_interval_seconds)}teams:
  - name: na_ae
    members:
{na}
  - name: emea_ae
    members:
{emea}
rules:
  - {{name: north america, team: na_ae, when: {{Country: [US, CA]}}}}
  # a lead at the domain of a known Account goes to the Account's owner, else to emea_ae
  - {{name: everyone else, team: emea_ae, route_to: account_owner}}
""" + (slack_block(slack_url, reps) if slack_url else "")


def hubspot_yaml(
    hs: HubSpotSandbox,
    owners: list[str],
    *,
    org: str = "demo-hs",
    written_by: str = "connector demo",
    poll: bool = False,
) -> str:
    """A HubSpot portal routing contacts over the sandbox ``hs``; secrets are ${ENV} names of
    ``ENV``. Without ``poll`` the poll is off (the demo's contacts come only by webhook);
    with it, the defaults (every 60 s), as a real portal's config has."""
    names = HS_OWNER_NAMES
    amer = "\n".join(f'      - {{crm_user_id: "{owners[i]}", name: {names[i]}}}' for i in range(2))
    intl = "\n".join(
        f'      - {{crm_user_id: "{owners[i]}", name: {names[i]}}}' for i in range(2, 4)
    )
    poll_block = "" if poll else "poll:\n  enabled: false\n"
    return f"""\
# Written by `{written_by}`: a HubSpot portal routing contacts.
org: {org}
crm:
  kind: hubspot
  base_url: {hs.url}
  auth: {{access_token: "${{DEMO_HS_TOKEN}}"}}
  object: contacts
  limit_per_10s: 100
  webhook_secrets: ["${{DEMO_HS_WEBHOOK_SECRET}}"]
  portal_id: {HS_PORTAL}
{poll_block}teams:
  - name: americas
    members:
{amer}
  - name: international
    members:
{intl}
rules:
  - {{name: americas, team: americas, when: {{country: [United States, Canada]}}}}
  - {{name: everyone else, team: international}}
"""


@dataclass
class World:
    """The demo's CRM users and records, made before the burst."""

    configs: dict[str, OrgConfig]
    reps: list[str]  # Salesforce users
    owners: list[str]  # HubSpot owners
    initech: str  # the Salesforce Account whose domain routes to its owner
    account_leads: list[str]  # leads at Initech's domain
    sf_ids: list[str]  # Salesforce leads waiting for routing, in random order
    hs_ids: list[str]  # HubSpot contacts waiting for routing
    sf_person: list[str]  # records a person already owns
    hs_person: list[str]


def _set_up_orgs(
    engine: Engine,
    root: Path,
    sf: SalesforceSandbox,
    hs: HubSpotSandbox,
    slack: SlackSandbox | None = None,
) -> tuple[dict[str, OrgConfig], list[str], str, list[str]]:
    """The CRM users, the two orgs' config folder and teams, and one rep away:
    (configs, Salesforce reps, the Salesforce intake user, HubSpot owners)."""
    reps, intake = seed_salesforce_users(sf)
    owners = seed_hubspot_owners(hs)
    (root / "config").mkdir()
    for i, rep in enumerate(reps):
        if slack is not None:
            slack.add_user(rep_email(rep), f"UDEMO{i}")
    slack_url = slack.url if slack is not None else None
    (root / "config" / "demo-sf.yaml").write_text(
        salesforce_yaml(sf, reps, intake, slack_url=slack_url)
    )
    (root / "config" / "demo-hs.yaml").write_text(hubspot_yaml(hs, owners))
    configs: dict[str, OrgConfig] = load_configs(root / "config")
    for cfg in configs.values():
        apply_teams(engine, cfg)
        apply_notify_settings(engine, cfg)
    # `connector rep away "Barbara Liskov" --until ...`: away for the whole burst
    sf_cfg, now = configs["demo-sf"], datetime.now(UTC)
    barbara = resolve_rep(sf_cfg, "Barbara Liskov")
    set_away(engine, sf_cfg, barbara, now + timedelta(days=1), "on holiday", now)
    print(f"config written to {root / 'config'} (2 orgs)")
    return configs, reps, intake, owners


def make_world(
    engine: Engine,
    root: Path,
    sf: SalesforceSandbox,
    hs: HubSpotSandbox,
    rng: random.Random,
    sf_leads: int,
    hs_leads: int,
    slack: SlackSandbox | None = None,
) -> World:
    """The orgs, then the records of the burst in the sandboxes."""
    configs, reps, intake, owners = _set_up_orgs(engine, root, sf, hs, slack)
    # An Account owned by Edsger Dijkstra; its people's leads go to him, not the rotation.
    initech = sf.add_account("Initech", reps[3], "https://www.initech.com/")
    account_leads = [
        sf.add_record(
            "Lead", intake, fields={"Country": "DE", "Email": f"buyer{i}@mail.initech.com"}
        )
        for i in range(max(1, sf_leads // 50))
    ]
    sf_records = [
        (
            sf.add_record("Lead", owner_id=intake, fields={"Country": rng.choice(SF_COUNTRIES)}),
            None,
        )
        for _ in range(sf_leads - len(account_leads))
    ] + [(rid, None) for rid in account_leads]
    rng.shuffle(sf_records)
    hs_ids = [
        hs.add_record("contacts", properties={"country": rng.choice(HS_COUNTRIES)})
        for _ in range(hs_leads)
    ]
    # Records a person already owns: pushed like the others, they must be left alone.
    sf_person = [
        sf.add_record("Lead", owner_id=reps[0], fields={"Country": "US"})
        for _ in range(max(1, sf_leads // 20))
    ]
    hs_person = [
        hs.add_record("contacts", owner_id=owners[0], properties={"country": "Canada"})
        for _ in range(max(1, hs_leads // 20))
    ]
    return World(
        configs,
        reps,
        owners,
        initech,
        account_leads,
        [rid for rid, _ in sf_records],
        hs_ids,
        sf_person,
        hs_person,
    )
