"""What a notification says and how claimed rows become messages (pure).

Values from a lead are untrusted: each is cut to one short line, and for Slack its ``&``,
``<`` and ``>`` are escaped (Slack's own escaping), so no field can add a link, a mention
(``<!channel>``) or formatting the template did not have. Email is sent as text/plain, and a
subject keeps no line breaks (no header can be added through it).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from string import Template
from typing import Any
from urllib.parse import quote

from connector.core.config import HubSpotCrm, OrgConfig
from connector.core.notify_config import Notifications, TemplateName

#: At most this many rows in one message (a digest): beyond, the next message takes them.
MAX_PER_MESSAGE = 25
MAX_VALUE_CHARS = 200
_CONTROL = re.compile(r"[\x00-\x1f\x7f\u2028\u2029]+")

#: HubSpot's object type ids in record URLs.
_HUBSPOT_TYPE = {"contacts": "0-1", "leads": "0-136"}


@dataclass(frozen=True)
class Row:
    """A claimed notification with what its message says (db/notify.sql claim)."""

    id: int
    kind: str
    channel: str
    recipient: str
    dedupe_key: str
    attempts: int
    created_at: datetime
    lead_id: int | None = None
    detail: Mapping[str, Any] = field(default_factory=dict)
    held_since: datetime | None = None
    crm_id: str | None = None
    fields: Mapping[str, Any] = field(default_factory=dict)
    team: str | None = None
    rule_name: str | None = None
    owner_id: str | None = None
    away_from: datetime | None = None
    away_until: datetime | None = None


@dataclass(frozen=True)
class Message:
    """One Slack post or one email: to a rep (its crm_user_id) or to 'admins'."""

    channel: str
    recipient: str
    dedupe_key: str
    subject: str
    text: str
    row_ids: tuple[int, ...]


@dataclass(frozen=True)
class Plan:
    messages: list[Message]
    held: list[int]  # rows of quiet reps, kept for their digest


def one_line(value: object) -> str:
    """A lead value as one short line of text."""
    text = _CONTROL.sub(" ", str(value)).strip()
    return text if len(text) <= MAX_VALUE_CHARS else text[: MAX_VALUE_CHARS - 1] + "…"


def slack_escape(text: str) -> str:
    """Slack's escaping of ``&``, ``<`` and ``>``: the text shows as written."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def record_url(cfg: OrgConfig, crm_id: str) -> str | None:
    """The record's page in the CRM (None when the config cannot tell it)."""
    rid = quote(crm_id, safe="")
    if isinstance(cfg.crm, HubSpotCrm):
        if cfg.crm.portal_id is None:
            return None
        return (
            f"https://app.hubspot.com/contacts/{cfg.crm.portal_id}/record/"
            f"{_HUBSPOT_TYPE[cfg.crm.object]}/{rid}"
        )
    return f"{cfg.crm.instance_url.rstrip('/')}/lightning/r/{cfg.crm.object}/{rid}/view"


def rep_name(cfg: OrgConfig, crm_user_id: str) -> str:
    for team in cfg.teams:
        for m in team.members:
            if m.crm_user_id == crm_user_id:
                return m.name
    return crm_user_id


def _lead_name(n: Notifications, cfg: OrgConfig, row: Row) -> str:
    parts = [one_line(row.fields[f]) for f in n.lead_name_fields(cfg) if row.fields.get(f)]
    return " ".join(p for p in parts if p) or f"{cfg.crm.object} {row.crm_id or row.lead_id}"


def rep_values(cfg: OrgConfig, row: Row, channel: str) -> dict[str, str]:
    """The placeholders of a rep message, each escaped for ``channel``."""
    n = cfg.notifications
    assert n is not None
    esc: Callable[[str], str] = slack_escape if channel == "slack" else (lambda s: s)
    url = record_url(cfg, row.crm_id) if row.crm_id else None
    if url is None:
        link = ""
    elif channel == "slack":
        link = f"<{url}|Open in {'HubSpot' if isinstance(cfg.crm, HubSpotCrm) else 'Salesforce'}>"
    else:
        link = url
    lines = [
        f"{f}: {esc(one_line(row.fields[f]))}"
        for f in n.fields
        if row.fields.get(f) not in (None, "")
    ]
    other = row.owner_id if row.owner_id and row.owner_id != row.recipient else ""
    return {
        "lead": esc(_lead_name(n, cfg, row)),
        "link": link,
        "fields": "\n".join(lines),
        "team": esc(one_line(row.team or "")),
        "rep": esc(rep_name(cfg, row.recipient)),
        "rule": esc(one_line(row.rule_name or "")),
        "reason": esc(one_line(row.detail.get("reason", ""))),
        "other_rep": esc(rep_name(cfg, other)) if other else "another rep",
        "crm_id": esc(one_line(row.crm_id or "")),
        "count": "1",
    }


def render(template: str, values: Mapping[str, str]) -> str:
    """The template filled in; blank lines left by empty placeholders are dropped."""
    text = Template(template).safe_substitute(values)
    return "\n".join(line for line in text.splitlines() if line.strip()).strip()


def subject_of(text: str) -> str:
    first = text.splitlines()[0] if text else "Lead routing"
    return one_line(first)[:150]


def rep_message_text(cfg: OrgConfig, row: Row) -> str:
    n = cfg.notifications
    assert n is not None
    kind: TemplateName = row.kind  # type: ignore[assignment]  # rep kinds are template names
    return render(n.template(kind), rep_values(cfg, row, row.channel))


def rep_message(cfg: OrgConfig, rows: Sequence[Row]) -> Message:
    """One message to a rep: the row's own, or a digest of several (in id order)."""
    first = rows[0]
    if len(rows) == 1:
        text = rep_message_text(cfg, first)
        return Message(
            first.channel, first.recipient, first.dedupe_key, subject_of(text), text, (first.id,)
        )
    n = cfg.notifications
    assert n is not None
    values = rep_values(cfg, first, first.channel) | {"count": str(len(rows))}
    header = render(n.template("digest"), values)
    body = "\n\n".join(rep_message_text(cfg, r) for r in rows)
    key = f"digest:{first.channel}:{first.recipient}:{first.id}-{rows[-1].id}:{len(rows)}"
    return Message(
        first.channel,
        first.recipient,
        key,
        subject_of(header),
        f"{header}\n\n{body}",
        tuple(r.id for r in rows),
    )


def plan_messages(
    cfg: OrgConfig,
    rows: Sequence[Row],
    quiet: Callable[[Row], bool],
    max_per_message: int = MAX_PER_MESSAGE,
) -> Plan:
    """Claimed rows as messages: a rep's rows on one channel go out together (one digest
    when there are several: after quiet hours, or more than the channel takes one by one),
    up to ``max_per_message`` a message; a quiet rep's rows are held; the admin alerts of a
    claim go out as one message per channel (each is one kind's for one interval)."""
    from connector.notify.alerts import alert_message

    messages: list[Message] = []
    held: list[int] = []
    groups: dict[tuple[str, str], list[Row]] = {}
    alerts: dict[str, list[Row]] = {}
    for r in sorted(rows, key=lambda r: r.id):
        if r.kind == "alert":
            alerts.setdefault(r.channel, []).append(r)
        else:
            groups.setdefault((r.channel, r.recipient), []).append(r)
    messages.extend(alert_message(cfg, group) for group in alerts.values())
    for group in groups.values():
        if quiet(group[0]):
            held.extend(r.id for r in group)
            continue
        for i in range(0, len(group), max_per_message):
            messages.append(rep_message(cfg, group[i : i + max_per_message]))
    return Plan(messages, held)
