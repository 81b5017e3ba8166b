"""Org configs wired to the in-process CRM sandboxes (real HTTP, real client libraries)."""

from __future__ import annotations

from connector.core.config import OrgConfig
from connector.core.config_loading import parse_config
from crm_sandboxes import HubSpotSandbox, SalesforceSandbox

SF_ORG_ID = "00D000000000062EAA"
OUTBOUND_SECRET = "test-outbound-secret-0123456789"
PORTAL_ID = 62515
HS_WEBHOOK_SECRET = "hs-app-client-secret"


def salesforce_org(
    sf: SalesforceSandbox,
    reps: list[str],
    org: str = "sfdemo",
    obj: str = "Contact",
    intake: list[str] | None = None,
) -> OrgConfig:
    """A Salesforce org on the sandbox; ``intake`` = the owners that mean "not routed yet"."""
    members = "\n".join(
        f'      - {{crm_user_id: "{r}", name: "Rep {i}"}}' for i, r in enumerate(reps)
    )
    text = f"""
org: {org}
crm:
  kind: salesforce
  instance_url: {sf.url}
  auth: {{method: client_credentials, client_id: "${{SF_ID}}", client_secret: "${{SF_SECRET}}"}}
  object: {obj}
  organization_id: {SF_ORG_ID}
  outbound_secrets: ["${{SF_OUTBOUND}}"]
intake_owner_ids: {list(intake or [])}
teams:
  - name: ae
    members:
{members}
rules:
  - {{team: ae}}
"""
    env = {"SF_ID": sf.client_id, "SF_SECRET": sf.client_secret, "SF_OUTBOUND": OUTBOUND_SECRET}
    return parse_config(text, f"{org}.yaml", env)


def hubspot_org(
    hs: HubSpotSandbox, owners: list[str], org: str = "hsdemo", limit_per_10s: int = 100
) -> OrgConfig:
    members = "\n".join(f'      - {{crm_user_id: "{o}", name: "Owner {o}"}}' for o in owners)
    text = f"""
org: {org}
crm:
  kind: hubspot
  base_url: {hs.url}
  auth: {{access_token: "${{HS_TOKEN}}"}}
  object: contacts
  limit_per_10s: {limit_per_10s}
  webhook_secrets: ["${{HS_HOOK}}"]
  portal_id: {PORTAL_ID}
teams:
  - name: smb
    members:
{members}
rules:
  - {{team: smb}}
"""
    env = {"HS_TOKEN": hs.access_token, "HS_HOOK": HS_WEBHOOK_SECRET}
    return parse_config(text, f"{org}.yaml", env)
