"""The `notifications:` block of an org's YAML: who is told what, through Slack and email.

Off by default (no block). The message templates are ``string.Template`` texts whose
placeholders are checked here against the names a message can fill (connector/notify/
messages.py renders them, escaping every value for the channel).
"""

from __future__ import annotations

from string import Template
from typing import Annotated, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

Channel = Literal["slack", "email"]
TemplateName = Literal["assigned", "reassigned_to", "reassigned_from", "digest"]

#: What a rep message's template may name.
REP_PLACEHOLDERS = frozenset(
    {"lead", "link", "fields", "team", "rep", "rule", "reason", "other_rep", "crm_id", "count"}
)
#: The templates an org gets unless it sets its own (plain words, one link).
DEFAULT_TEMPLATES: dict[str, str] = {
    "assigned": "New lead for you, $rep: $lead ($team)\n$fields\n$link",
    "reassigned_to": "Lead reassigned to you, $rep: $lead ($team, $reason)\n$fields\n$link",
    "reassigned_from": "Lead $lead is no longer yours: it went to $other_rep ($reason)\n$link",
    "digest": "$count lead notifications for you, $rep:",
}
_EMAIL = r"^[^@\s<>\"',;]{1,64}@[A-Za-z0-9.-]{1,253}\.[A-Za-z]{2,63}$"
_SLACK_USER = r"^[UW][A-Z0-9]{2,20}$"
_SLACK_CHANNEL = r"^[CGD][A-Z0-9]{2,20}$"


class _Crm(Protocol):
    @property
    def kind(self) -> str: ...
    @property
    def object(self) -> str: ...


class _HasCrm(Protocol):
    @property
    def crm(self) -> _Crm: ...


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SlackSettings(_Model):
    """A Slack app's bot token (chat:write, users:read, users:read.email)."""

    bot_token: SecretStr
    # The Web API's base URL (the local simulator's in tests and the demo).
    base_url: Annotated[str, Field(pattern=r"^https?://[^\s]+/$")] = "https://slack.com/api/"
    # Admin alerts go to this channel (its id, e.g. C0123ABCD); unset: no Slack alerts.
    admin_channel: Annotated[str, Field(pattern=_SLACK_CHANNEL)] | None = None
    timeout_seconds: Annotated[float, Field(gt=0, le=120)] = 10.0


class EmailSettings(_Model):
    """An SMTP relay: STARTTLS is required unless `starttls: false` (a relay on localhost)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    host: Annotated[str, Field(min_length=1, max_length=253)]
    port: Annotated[int, Field(ge=1, le=65535)] = 587
    starttls: bool = True
    # A CA bundle to verify the relay's certificate with (default: the system's).
    ca_file: str | None = None
    username: str | None = None
    password: SecretStr | None = None
    sender: Annotated[str, Field(alias="from", pattern=_EMAIL)]
    # Admin alerts go to these addresses; empty: no email alerts.
    admin_to: list[Annotated[str, Field(pattern=_EMAIL)]] = []
    timeout_seconds: Annotated[float, Field(gt=0, le=120)] = 20.0

    @model_validator(mode="after")
    def _login_pair(self) -> EmailSettings:
        if (self.username is None) != (self.password is None):
            raise ValueError("username and password go together")
        return self


class RepContact(_Model):
    """How to reach one rep (by its crm_user_id in the teams)."""

    crm_user_id: Annotated[str, Field(min_length=1, max_length=64)]
    email: Annotated[str, Field(pattern=_EMAIL)] | None = None
    # Set it to skip users.lookupByEmail for this rep.
    slack_user_id: Annotated[str, Field(pattern=_SLACK_USER)] | None = None
    # This rep is told nothing.
    opt_out: bool = False


class Alerts(_Model):
    """Admin alerts: one message per kind per interval, when there is something to say."""

    interval_minutes: Annotated[int, Field(ge=1, le=1440)] = 15
    # superseded owner writes in one interval above this many are reported
    superseded_above: Annotated[int, Field(ge=0)] = 10
    # the oldest unfinished inbox event / outbox row older than this is reported
    inbox_age_above_seconds: Annotated[int, Field(ge=1)] = 600
    outbox_age_above_seconds: Annotated[int, Field(ge=1)] = 600


class Notifications(_Model):
    slack: SlackSettings | None = None
    email: EmailSettings | None = None
    # The channels reps are told on (each needs its settings above); [] for admin alerts only.
    rep_channels: list[Channel] = []
    # Hold a rep's messages while the rep is off shift or away; one digest when back.
    quiet_when_away: bool = False
    reps: list[RepContact] = []
    # Lead fields listed in a rep's message (read from the CRM with each record).
    fields: list[Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,99}$")]] = []
    # Fields that make up the lead's name in messages (default: the CRM's name fields).
    name_fields: list[Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,99}$")]] | None = None
    templates: dict[TemplateName, Annotated[str, Field(min_length=1, max_length=2000)]] = {}
    alerts: Alerts | None = None

    @field_validator("templates")
    @classmethod
    def _placeholders(cls, templates: dict[str, str]) -> dict[str, str]:
        for name, text in templates.items():
            t = Template(text)
            if not t.is_valid():
                raise ValueError(f"{name}: a `$` that starts no placeholder (write `$$`)")
            unknown = sorted(set(t.get_identifiers()) - REP_PLACEHOLDERS)
            if unknown:
                raise ValueError(
                    f"{name}: unknown placeholder(s) {', '.join(unknown)}; known: "
                    + ", ".join(sorted(REP_PLACEHOLDERS))
                )
        return templates

    @model_validator(mode="after")
    def _channels_have_settings(self) -> Notifications:
        for ch in self.rep_channels:
            if getattr(self, ch) is None:
                raise ValueError(f"rep_channels lists {ch} but there is no `{ch}:` block")
        if len(set(self.rep_channels)) != len(self.rep_channels):
            raise ValueError("rep_channels lists a channel twice")
        ids = [r.crm_user_id for r in self.reps]
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        if dupes:
            raise ValueError(f"reps: {', '.join(dupes)} listed twice")
        return self

    def warnings(self, rep_ids: list[str]) -> list[tuple[tuple[str, ...], str]]:
        """Valid settings that will not do what is meant, each with its key path
        (``rep_ids``: the teams' reps)."""
        out: list[tuple[tuple[str, ...], str]] = []
        unknown = sorted({r.crm_user_id for r in self.reps} - set(rep_ids))
        if unknown:
            out.append(
                (
                    ("notifications", "reps"),
                    f"names no rep of the teams: {', '.join(unknown)}; remove them or add "
                    "them to a team",
                )
            )
        if self.rep_channels:
            need_email = "email" in self.rep_channels
            missing = sorted(
                rid
                for rid in set(rep_ids)
                if (c := self.contact(rid)) is None
                or (not c.opt_out and not c.email and (need_email or not c.slack_user_id))
            )
            if missing:
                out.append(
                    (
                        ("notifications", "reps"),
                        f"no address for {', '.join(missing)}: their messages will be dead "
                        "(no_address); give each an email or a slack_user_id",
                    )
                )
        return out

    def lead_name_fields(self, cfg: _HasCrm) -> list[str]:
        if self.name_fields is not None:
            return list(self.name_fields)
        return list(DEFAULT_NAME_FIELDS.get((cfg.crm.kind, cfg.crm.object), ()))

    def template(self, name: TemplateName) -> str:
        return self.templates.get(name, DEFAULT_TEMPLATES[name])

    def contact(self, crm_user_id: str) -> RepContact | None:
        return next((r for r in self.reps if r.crm_user_id == crm_user_id), None)

    @property
    def opted_out(self) -> list[str]:
        return sorted(r.crm_user_id for r in self.reps if r.opt_out)

    @property
    def admin_channels(self) -> list[Channel]:
        out: list[Channel] = []
        if self.slack is not None and self.slack.admin_channel:
            out.append("slack")
        if self.email is not None and self.email.admin_to:
            out.append("email")
        return out


#: The fields that name a lead in a message when `name_fields` is not set.
DEFAULT_NAME_FIELDS: dict[tuple[str, str], tuple[str, ...]] = {
    ("salesforce", "Lead"): ("FirstName", "LastName", "Company"),
    ("salesforce", "Contact"): ("FirstName", "LastName"),
    ("hubspot", "contacts"): ("firstname", "lastname", "company"),
    ("hubspot", "leads"): ("hs_lead_name",),
}
