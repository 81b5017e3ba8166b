"""An org with notifications on, for the notification tests and bench.notify: a
Salesforce team of three reps, Slack pointed at a local SlackSandbox (and email at a local
SMTP server when given)."""

from __future__ import annotations

from connector.core.config import OrgConfig
from connector.core.config_loading import parse_config

REPS = [
    ("005A", "Ada Lovelace", "ada@acme.test", "UADA"),
    ("005B", "Alan Turing", "alan@acme.test", "UALAN"),
    ("005C", "Grace Hopper", "grace@acme.test", "UGRACE"),
]


def many_reps(n: int) -> list[tuple[str, str, str, str]]:
    """``n`` reps shaped like REPS (crm_user_id, name, email, Slack user id)."""
    return [(f"005R{i:03d}", f"Rep {i}", f"rep{i}@acme.test", f"UREP{i:03d}") for i in range(n)]


def members_of(reps: list[tuple[str, str, str, str]]) -> str:
    return "\n".join(f'      - {{crm_user_id: "{u}", name: "{n}"}}' for u, n, _, _ in reps)


def contacts_of(reps: list[tuple[str, str, str, str]]) -> str:
    return "\n".join(f'    - {{crm_user_id: "{u}", email: "{e}"}}' for u, _, e, _ in reps)


ENV = {"TOKEN": "unused", "SLACK_TOKEN": "xoxb-sandbox-token", "SMTP_PASSWORD": "pw-123"}


def notify_yaml(
    slack_url: str | None,
    *,
    smtp_port: int | None = None,
    ca_file: str | None = None,
    rep_channels: tuple[str, ...] = ("slack",),
    extra: str = "",
    reps: str | None = None,
    members: str | None = None,
) -> str:
    blocks = []
    if slack_url is not None:
        blocks.append(
            f"""  slack:
    bot_token: "${{SLACK_TOKEN}}"
    base_url: "{slack_url}/api/"
    admin_channel: C0ADMIN"""
        )
    if smtp_port is not None:
        ca = f'\n    ca_file: "{ca_file}"' if ca_file else ""
        blocks.append(
            f"""  email:
    host: 127.0.0.1
    port: {smtp_port}{ca}
    username: routing
    password: "${{SMTP_PASSWORD}}"
    from: routing@acme.test
    admin_to: [ops@acme.test]"""
        )
    rep_lines = reps or "\n".join(
        f'    - {{crm_user_id: "{uid}", email: "{email}"}}' for uid, _, email, _ in REPS
    )
    member_lines = members or "\n".join(
        f'      - {{crm_user_id: "{uid}", name: "{name}"}}' for uid, name, _, _ in REPS
    )
    channels = ", ".join(rep_channels)
    slack_email = "\n".join(blocks)
    return f"""
org: acme
crm:
  kind: salesforce
  instance_url: https://acme.my.salesforce.com
  auth: {{method: session, access_token: "${{TOKEN}}"}}
  object: Lead
teams:
  - name: t
    members:
{member_lines}
rules:
  - {{name: us, team: t, when: {{Country: US}}}}
notifications:
{slack_email}
  rep_channels: [{channels}]
  fields: [Company, Country]
  reps:
{rep_lines}
{extra}
"""


def notify_cfg(slack_url: str | None, **kw: object) -> OrgConfig:
    return parse_config(notify_yaml(slack_url, **kw), "acme.yaml", ENV)  # type: ignore[arg-type]
