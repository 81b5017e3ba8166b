"""Org configuration: the typed models one YAML file per CRM org is validated into.

Reading the files (``${ENV_NAME}`` substitution, the literal-secret check, error messages that
name the file, the key path and the problem) is ``connector.core.config_loading``'s.
"""

from __future__ import annotations

from datetime import date, datetime
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from connector.core.config_base import STRICT
from connector.core.config_base import SecretUrl as SecretUrl
from connector.core.config_checks import Invalid, did_you_mean, team_references
from connector.core.config_crm import HubSpotCrm as HubSpotCrm
from connector.core.config_crm import SalesforceCrm as SalesforceCrm
from connector.core.hours import WeeklyHours, parse_hours, parse_local_time, zone
from connector.core.notify_config import Notifications
from connector.core.rule_config import FieldValues as FieldValues
from connector.core.rule_config import Rule as Rule
from connector.core.rule_config import Sla as Sla
from connector.core.rule_config import Territory as Territory
from connector.core.rule_config import TerritoryFields as TerritoryFields
from connector.core.rule_syntax import FIELD_NAME
from connector.core.yaml_source import loc_text

ORG_NAME = r"^[a-z0-9][a-z0-9_-]{0,62}$"
MAX_IN_A_ROW = 1000  # the largest K of catch_up: {max_in_a_row: K}


class ConfigError(Exception):
    """A configuration file is missing, unreadable or invalid; the message says where and why."""


class ConfigWarning(str):
    """``path: what is likely wrong; what to write``, with the key path kept in ``loc``."""

    loc: tuple[str | int, ...]

    def __new__(cls, loc: tuple[str | int, ...], text: str) -> ConfigWarning:
        self = super().__new__(cls, f"{loc_text(loc)}: {text}" if loc else text)
        self.loc = loc
        return self


class _Model(BaseModel):
    model_config = STRICT


class CatchUp(_Model):
    max_in_a_row: Annotated[int, Field(ge=1, le=MAX_IN_A_ROW)]


class Caps(_Model):
    """At most this many leads per day and/or per week (the team's time zone); unset = none."""

    per_day: Annotated[int, Field(ge=0, le=1_000_000)] | None = None
    per_week: Annotated[int, Field(ge=0, le=1_000_000)] | None = None


class TimeOff(_Model):
    """A planned absence from the YAML: ``from`` (inclusive) to ``until`` (exclusive).

    Dates or date-times; without an offset they are read in the rep's time zone (its hours'
    zone, else the team's). A date alone means 00:00 of that day.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    starts: Annotated[str, Field(alias="from")]
    until: str
    reason: Annotated[str, Field(max_length=200)] | None = None

    @field_validator("starts", "until", mode="before")
    @classmethod
    def _iso(cls, value: object) -> object:
        # YAML reads an unquoted 2026-12-24 as a date: keep it as the text it was
        return value.isoformat() if isinstance(value, date | datetime) else value


class Member(_Model):
    crm_user_id: Annotated[str, Field(min_length=1, max_length=64)]
    name: Annotated[str, Field(min_length=1, max_length=200)]
    weight: Annotated[int, Field(ge=1, le=1000)] = 1
    active: bool = True
    # Replaces the team's caps for this rep as a whole (`caps: {}` lifts them).
    caps: Caps | None = None
    # A weekly schedule; outside it the rep gets no leads (see connector.core.hours).
    hours: WeeklyHours | None = None
    time_off: list[TimeOff] = []

    @field_validator("hours", mode="before")
    @classmethod
    def _parse_hours(cls, value: object) -> WeeklyHours | None:
        if value is None or isinstance(value, WeeklyHours):
            return value
        return parse_hours(value)


class Team(_Model):
    name: Annotated[
        str,
        Field(
            pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$",
            description="up to 100 letters, digits, _ . or -, starting with a letter or digit",
        ),
    ]
    members: Annotated[list[Member], Field(min_length=1)]
    sla: Sla | None = None
    # Days and weeks (Monday to Sunday) of the caps are counted in this zone.
    timezone: str = "UTC"
    # The default caps of every member (a member's own `caps` replace them).
    caps: Caps = Caps()
    # Where a lead goes when no rep of this team can take it (all capped, away or off shift);
    # without it the lead stays unassigned (`all_capped` or `none_available`).
    overflow_team: str | None = None
    # What a rep returning from time away gets: `none` (fair from the return on) or
    # `{max_in_a_row: K}` (its missed share, at most K leads in a row).
    catch_up: Literal["none"] | CatchUp = "none"

    @field_validator("catch_up", mode="before")
    @classmethod
    def _catch_up(cls, value: object) -> object:
        k = value.get("max_in_a_row") if isinstance(value, dict) else None
        if value == "none" or (
            isinstance(value, dict)
            and list(value) == ["max_in_a_row"]
            and isinstance(k, int)
            and not isinstance(k, bool)
            and 1 <= k <= MAX_IN_A_ROW
        ):
            return value
        raise ValueError("expected `none` or `{max_in_a_row: K}` with K from 1 to 1000")

    @field_validator("timezone")
    @classmethod
    def _zone(cls, value: str) -> str:
        zone(value)
        return value

    @field_validator("members")
    @classmethod
    def _unique_members(cls, members: list[Member]) -> list[Member]:
        seen: dict[str, int] = {}
        found: list[tuple[tuple[str | int, ...], str]] = []
        for i, m in enumerate(members):
            if m.crm_user_id in seen:
                found.append(
                    (
                        (i, "crm_user_id"),
                        f"`{m.crm_user_id}` is listed twice (also members[{seen[m.crm_user_id]}]); "
                        "list each rep once",
                    )
                )
            seen.setdefault(m.crm_user_id, i)
        if found:
            raise Invalid(*found)
        return members

    @model_validator(mode="after")
    def _time_off(self) -> Team:
        found: list[tuple[tuple[str | int, ...], str]] = []
        for i, m in enumerate(self.members):
            tz = self.rep_timezone(m)
            for j, t in enumerate(m.time_off):
                where = ("members", i, "time_off", j)
                try:
                    starts = parse_local_time(t.starts, tz)
                except ValueError as exc:
                    found.append(((*where, "from"), str(exc)))
                    continue
                try:
                    until = parse_local_time(t.until, tz)
                except ValueError as exc:
                    found.append(((*where, "until"), str(exc)))
                    continue
                if until <= starts:
                    found.append(((*where, "until"), "must be after `from`"))
        if found:
            raise Invalid(*found)
        return self

    def rep_timezone(self, member: Member) -> str:
        """The zone a rep's local times are read in: its hours' zone, else the team's."""
        return member.hours.timezone if member.hours else self.timezone

    def caps_of(self, member: Member) -> Caps:
        return member.caps if member.caps is not None else self.caps

    @property
    def max_in_a_row(self) -> int | None:
        """K of `catch_up: {max_in_a_row: K}`, or None for `catch_up: none`."""
        return None if isinstance(self.catch_up, str) else self.catch_up.max_in_a_row


class Poll(_Model):
    """The scheduled sync that catches what pushes missed."""

    enabled: bool = True
    interval_seconds: Annotated[int, Field(ge=1, le=86_400)] = 60
    # Each poll re-reads this much before the watermark: late commits in the CRM are caught,
    # and the unique lead key makes the repeats harmless.
    overlap_seconds: Annotated[int, Field(ge=0, le=3_600)] = 120
    # Where the very first poll starts (how far back from now).
    initial_lookback_seconds: Annotated[int, Field(ge=0, le=2_592_000)] = 3_600
    # Extra fields read with each record (the rules' fields, the owner and the parent are
    # always read).
    fields: list[str] = []
    # Moved to the org's `intake_owner_ids`; kept here only to say so.
    unrouted_owner_ids: list[str] | None = None

    @field_validator("unrouted_owner_ids")
    @classmethod
    def _moved(cls, value: list[str] | None) -> None:
        if value is not None:
            raise ValueError(
                "moved: write these ids as `intake_owner_ids` at the top level of the file "
                "(they now apply to every input path, not only the poll)"
            )
        return None


class Accounts(_Model):
    """Lead-to-account matching: the account mirror and the lead fields whose domains match."""

    # Salesforce only: an Account field holding the company's domain(s), read besides Website.
    domain_field: str | None = None
    # Lead fields whose email address or URL gives the domain to match, tried in this order.
    # Default: Salesforce Lead [Email, Website], Contact [Email]; HubSpot contacts
    # [email, website]; HubSpot leads none (set it, or a crm.parent_field).
    match_fields: list[str] | None = None

    @field_validator("domain_field")
    @classmethod
    def _field_name(cls, value: str | None) -> str | None:
        if value is not None and not FIELD_NAME.match(value):
            raise ValueError("not a CRM field name (letters, digits and _ only)")
        return value

    @field_validator("match_fields")
    @classmethod
    def _match_fields(cls, value: list[str] | None) -> list[str] | None:
        if value is None:
            return None
        if not value:
            raise ValueError("lists no fields; omit it for the default")
        found: list[tuple[tuple[str | int, ...], str]] = [
            ((i,), f"`{name}` is not a CRM field name (letters, digits and _ only)")
            for i, name in enumerate(value)
            if not FIELD_NAME.match(name)
        ]
        found += [
            ((i,), f"`{name}` is listed twice; list each field once")
            for i, name in enumerate(value)
            if name in value[:i]
        ]
        if found:
            raise Invalid(*found)
        return value


DEFAULT_MATCH_FIELDS: dict[tuple[str, str], tuple[str, ...]] = {
    ("salesforce", "Lead"): ("Email", "Website"),
    ("salesforce", "Contact"): ("Email",),
    ("hubspot", "contacts"): ("email", "website"),
    ("hubspot", "leads"): (),
}


class Webhook(_Model):
    max_body_bytes: Annotated[int, Field(ge=1_024, le=10_485_760)] = 1_048_576


class OrgConfig(_Model):
    org: Annotated[
        str,
        Field(
            pattern=ORG_NAME,
            description="up to 63 lower-case letters, digits, _ or -, such as acme",
        ),
    ]
    crm: Annotated[SalesforceCrm | HubSpotCrm, Field(discriminator="kind")]
    database_url: SecretUrl | None = None
    teams: Annotated[list[Team], Field(min_length=1)]
    rules: Annotated[list[Rule], Field(min_length=1)]
    territories: dict[
        Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")], Territory
    ] = {}
    poll: Poll = Poll()
    webhook: Webhook = Webhook()
    accounts: Accounts | None = None
    # Owners that mean "not routed yet" (the intake queue, the integration user that creates
    # records). A record is routed only when the CRM says its owner is empty or one of these;
    # a record a person owns is never taken. Salesforce records always have an owner, so a
    # Salesforce org without this list routes nothing.
    intake_owner_ids: list[Annotated[str, Field(min_length=1, max_length=64)]] = []
    # Received field values, finished inbox events and written outbox rows are deleted after
    # this many days (assignments and counts are kept).
    retention_days: Annotated[int, Field(ge=1, le=3650)] = 30
    # Slack and email to reps and admins (docs/notifications.md); off when absent.
    notifications: Notifications | None = None

    @model_validator(mode="after")
    def _rules_name_teams(self) -> OrgConfig:
        found = team_references(
            [(t.name, t.overflow_team) for t in self.teams],
            [r.team for r in self.rules],
        )
        found += self._territory_problems()
        found += self._accounts_problems()
        if found:
            raise Invalid(*found)
        return self

    def overflow_chain(self, team: str) -> list[str]:
        """``team`` and the teams its overflow leads to, in order (no team twice)."""
        chain = [team]
        nxt = self.team(team).overflow_team
        while nxt is not None and nxt not in chain:
            chain.append(nxt)
            nxt = self.team(nxt).overflow_team
        return chain

    def _territory_problems(self) -> list[tuple[tuple[str | int, ...], str]]:
        """Rules naming no territory, territory rows routing to no team."""
        names = {t.name for t in self.teams}
        found: list[tuple[tuple[str | int, ...], str]] = []
        for i, rule in enumerate(self.rules):
            if rule.territory is not None and rule.territory not in self.territories:
                found.append(
                    (
                        ("rules", i, "territory"),
                        f"unknown territory `{rule.territory}`; "
                        + did_you_mean(rule.territory, self.territories),
                    )
                )
        for tname, territory in self.territories.items():
            for row in territory.table.rows:
                if row.team in names:
                    continue
                fix = f"unknown team `{row.team}`; {did_you_mean(row.team, names)}"
                if territory.file is None and row.where.startswith("rows["):
                    at = int(row.where.removeprefix("rows[").rstrip("]"))
                    found.append((("territories", tname, "rows", at, "team"), fix))
                else:
                    found.append((("territories", tname, "file"), f"{row.where}: {fix}"))
        return found

    def _accounts_problems(self) -> list[tuple[tuple[str | int, ...], str]]:
        owner_rules = [i for i, r in enumerate(self.rules) if r.route_to == "account_owner"]
        if self.accounts is not None and not owner_rules:
            return [
                (
                    ("accounts",),
                    "set, but no rule has `route_to: account_owner`; remove it, or add that rule",
                )
            ]
        if not owner_rules:
            return []
        domain_field = self.accounts.domain_field if self.accounts is not None else None
        if domain_field is not None and isinstance(self.crm, HubSpotCrm):
            return [
                (
                    ("accounts", "domain_field"),
                    "for Salesforce only (HubSpot companies are matched by their domain and "
                    "website properties); remove it",
                )
            ]
        if not self.match_fields and not self.crm.parent_key:
            return [
                (
                    ("rules", owner_rules[0], "route_to"),
                    f"account_owner, but a {self.crm.object} record has no default field to "
                    "match; set accounts.match_fields or crm.parent_field",
                )
            ]
        return []

    @property
    def account_matching(self) -> bool:
        """Whether any rule routes to the account owner (and so the mirror is kept)."""
        return any(r.route_to == "account_owner" for r in self.rules)

    @property
    def match_fields(self) -> tuple[str, ...]:
        """The lead fields whose domains are matched against accounts, in order."""
        if self.accounts is not None and self.accounts.match_fields is not None:
            return tuple(self.accounts.match_fields)
        return DEFAULT_MATCH_FIELDS[(self.crm.kind, self.crm.object)]

    @property
    def crm_object(self) -> str:
        return self.crm.object

    @property
    def read_fields(self) -> list[str]:
        """The fields read from the CRM for each record: the rules' fields, the parent and
        the configured extras (the adapter adds the id, owner and modification time)."""
        names: list[str] = []
        for rule in self.rules:
            names.extend(self.rule_fields(rule))
        if self.crm.parent_key:
            names.append(self.crm.parent_key)
        if self.account_matching:
            names.extend(self.match_fields)
        names.extend(self.poll.fields)
        if self.notifications is not None:
            names.extend(self.notifications.fields + self.notifications.lead_name_fields(self))
        if isinstance(self.crm, HubSpotCrm):
            names.extend(self.crm.fetch_properties)
        return list(dict.fromkeys(names))

    def rule_fields(self, rule: Rule) -> list[str]:
        """The lead fields a rule reads: its conditions' and its territory table's."""
        out = rule.fields
        if rule.territory is not None:
            out = out + [f for f in self.territories[rule.territory].read if f not in out]
        return out

    def warnings(self) -> list[ConfigWarning]:
        """Settings that are valid but almost certainly not what the operator wants."""
        from connector.core.config_warnings import warnings

        return warnings(self)

    def sla_for(self, rule_index: int, team: str) -> Sla | None:
        """The SLA of a lead routed by this rule to this team: the rule's, else the team's."""
        rule = self.rules[rule_index] if 0 <= rule_index < len(self.rules) else None
        if rule is not None and rule.sla is not None:
            return rule.sla
        try:
            return self.team(team).sla
        except KeyError:
            return None

    def team(self, name: str) -> Team:
        for t in self.teams:
            if t.name == name:
                return t
        raise KeyError(name)
