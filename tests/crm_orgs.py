"""Org configs wired to the in-process CRM sandboxes (real HTTP, real client libraries)."""

from __future__ import annotations

from connector.config import OrgConfig, parse_config
from crm_adapters.sandbox import HubSpotSandbox, SalesforceSandbox


def salesforce_org(
    sf: SalesforceSandbox, reps: list[str], org: str = "sfdemo", obj: str = "Contact"
) -> OrgConfig:
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
teams:
  - name: ae
    members:
{members}
rules:
  - {{team: ae}}
"""
    return parse_config(text, f"{org}.yaml", {"SF_ID": sf.client_id, "SF_SECRET": sf.client_secret})


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
teams:
  - name: smb
    members:
{members}
rules:
  - {{team: smb}}
"""
    return parse_config(text, f"{org}.yaml", {"HS_TOKEN": hs.access_token})
