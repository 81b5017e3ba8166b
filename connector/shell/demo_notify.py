"""The demo's notifications: demo-sf's reps are told on Slack (the local simulator), and the
demo prints what they would have seen."""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import Engine, text

#: The Slack simulator's bot token (crm_sandboxes/slack.py), set as DEMO_SLACK_BOT_TOKEN.
DEMO_SLACK_TOKEN = "xoxb-sandbox-token"


def rep_email(crm_user_id: str) -> str:
    return f"{crm_user_id.lower()}@demo.test"


def slack_block(slack_url: str, reps: list[str]) -> str:
    """demo-sf's `notifications:` block: every rep on Slack, found by email."""
    contacts = "\n".join(f'    - {{crm_user_id: "{r}", email: {rep_email(r)}}}' for r in reps)
    return f"""\
# Reps are told on Slack (the local simulator) when a lead is theirs.
notifications:
  slack: {{bot_token: "${{DEMO_SLACK_BOT_TOKEN}}", base_url: "{slack_url}/api/"}}
  rep_channels: [slack]
  fields: [Country]
  reps:
{contacts}
"""


def show_notifications(engine: Engine, slack: Any, timeout: float = 60.0) -> bool:
    """Wait for demo-sf's notifications to be sent, print what reps got; True when every
    routed demo-sf lead was in a Slack message to its owner."""
    q = text(
        "SELECT count(*) FILTER (WHERE state <> 'sent') AS open, count(*) AS total "
        "FROM notifications WHERE org = 'demo-sf'"
    )
    deadline = time.monotonic() + timeout
    while True:
        with engine.connect() as conn:
            row = conn.execute(q).one()
        if row.open == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    with engine.connect() as conn:
        assigned = conn.execute(
            text("SELECT count(*) FROM assignments WHERE org = 'demo-sf'")
        ).scalar_one()
    messages = slack.messages()
    print()
    print(
        f"Slack: {len(messages)} direct messages to {len({m['channel'] for m in messages})} "
        f"reps told them of {row.total} assignments ({row.open} not sent); "
        "one of them, as the rep saw it:"
    )
    if messages:
        sample = max(messages, key=lambda m: len(m["text"]) if len(m["text"]) < 600 else 0)
        for line in sample["text"].splitlines()[:8]:
            print(f"    {line}")
    return bool(row.open == 0 and row.total == assigned)
