"""Org configuration: the typed models one YAML file per CRM org is validated into.

Reading the files (``${ENV_NAME}`` substitution, the literal-secret check, error messages that
name the file, the key path and the problem) is ``connector.core.config_loading``'s.
"""

from __future__ import annotations

import ipaddress
import re
from datetime import date, datetime
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    field_validator,
    model_validator,
)

from connector.core.hours import WeeklyHours, parse_hours, parse_local_time, zone

# the rule models live beside, re-exported here: the whole file's models are this module's
from connector.core.rule_config import FieldValues as FieldValues
from connector.core.rule_config import Rule as Rule
from connector.core.rule_config import Sla as Sla
from connector.core.rule_config import Territory as Territory
from connector.core.rule_config import TerritoryFields as TerritoryFields
from connector.core.rule_syntax import FIELD_NAME
from crm_adapters.fields import hubspot_parent_field, salesforce_parent_field
from crm_adapters.salesforce_ids import is_id as is_salesforce_id

ORG_NAME = r"^[a-z0-9][a-z0-9_-]{0,62}$"
# The shared secret Salesforce sends as the last path segment of the endpoint URL.
URL_SECRET = re.compile(r"^[A-Za-z0-9._~-]{24,200}$")
MAX_IN_A_ROW = 1000  # the largest K of catch_up: {max_in_a_row: K}


class ConfigError(Exception):
    """A configuration file is missing, unreadable or invalid; the message says where and why."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


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
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")]
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
        seen: set[str] = set()
        for m in members:
            if m.crm_user_id in seen:
                raise ValueError(f"crm_user_id {m.crm_user_id!r} is listed twice")
            seen.add(m.crm_user_id)
        return members

    @model_validator(mode="after")
    def _time_off(self) -> Team:
        for i, m in enumerate(self.members):
            tz = self.rep_timezone(m)
            for j, t in enumerate(m.time_off):
                where = f"members[{i}].time_off[{j}]"
                try:
                    starts, until = parse_local_time(t.starts, tz), parse_local_time(t.until, tz)
                except ValueError as exc:
                    raise ValueError(f"{where}: {exc}") from None
                if until <= starts:
                    raise ValueError(f"{where}: `until` must be after `from`")
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


class SalesforceAuth(_Model):
    method: Literal["client_credentials", "jwt", "password", "session"]
    client_id: SecretStr | None = None
    client_secret: SecretStr | None = None
    username: str | None = None
    password: SecretStr | None = None
    security_token: SecretStr | None = None
    private_key: SecretStr | None = None
    private_key_file: str | None = None
    access_token: SecretStr | None = None

    @model_validator(mode="after")
    def _required_for_method(self) -> SalesforceAuth:
        needs: dict[str, tuple[str, ...]] = {
            "client_credentials": ("client_id", "client_secret"),
            "jwt": ("client_id", "username"),
            "password": ("username", "password"),
            "session": ("access_token",),
        }
        missing = [k for k in needs[self.method] if getattr(self, k) in (None, "")]
        if missing:
            raise ValueError(f"auth method {self.method!r} needs {', '.join(missing)}")
        if self.method == "jwt" and not (self.private_key or self.private_key_file):
            raise ValueError("auth method 'jwt' needs private_key or private_key_file")
        return self


class HubSpotAuth(_Model):
    method: Literal["private_app"] = "private_app"
    access_token: SecretStr


class SalesforceCrm(_Model):
    kind: Literal["salesforce"]
    instance_url: Annotated[str, Field(pattern=r"^https?://[^\s/]+(:\d+)?/?$")]
    auth: SalesforceAuth
    object: Literal["Lead", "Contact"] = "Lead"
    parent_field: str | None = None
    organization_id: str | None = None
    # Outbound Messages are not signed: Salesforce must call an endpoint URL that ends with
    # one of these secrets (/webhooks/salesforce/{org}/{secret}); two during a rotation.
    outbound_secrets: Annotated[list[SecretStr], Field(max_length=2)] = []
    # When set, Outbound Messages are accepted only from these networks (e.g. Salesforce's
    # published ranges), checked against the peer address or a trusted proxy's forward.
    outbound_allow_cidrs: list[str] = []
    api_version: Annotated[str, Field(pattern=r"^\d+\.\d$")] = "62.0"

    @field_validator("organization_id")
    @classmethod
    def _org_id(cls, value: str | None) -> str | None:
        if value is not None and not (value.startswith("00D") and is_salesforce_id(value)):
            raise ValueError("not a Salesforce organization id (15 or 18 characters, 00D...)")
        return value

    @field_validator("outbound_secrets")
    @classmethod
    def _url_safe_secrets(cls, secrets: list[SecretStr]) -> list[SecretStr]:
        for i, secret in enumerate(secrets):
            if not URL_SECRET.match(secret.get_secret_value()):
                raise ValueError(
                    f"[{i}]: must be 24 to 200 characters of A-Z a-z 0-9 . _ ~ - "
                    "(it is sent as a URL path segment)"
                )
        return secrets

    @field_validator("outbound_allow_cidrs")
    @classmethod
    def _networks(cls, cidrs: list[str]) -> list[str]:
        for c in cidrs:
            try:
                ipaddress.ip_network(c, strict=False)
            except ValueError:
                raise ValueError(f"{c!r} is not an IP network (e.g. 13.108.0.0/14)") from None
        return cidrs

    @property
    def parent_key(self) -> str | None:
        """The field that names the record's parent Account (Contact: AccountId)."""
        return salesforce_parent_field(self.object, self.parent_field)


class HubSpotCrm(_Model):
    kind: Literal["hubspot"]
    base_url: Annotated[str, Field(pattern=r"^https?://[^\s/]+(:\d+)?/?$")] = (
        "https://api.hubapi.com"
    )
    auth: HubSpotAuth
    object: Literal["contacts", "leads"] = "contacts"
    parent_field: str | None = None
    limit_per_10s: Annotated[int, Field(ge=1, le=1000)] = 100
    # The app's client secret(s) that sign webhooks (v3); two during a rotation.
    webhook_secrets: Annotated[list[SecretStr], Field(max_length=2)] = []
    # The HubSpot account (portalId) this org is; events of any other portal are refused.
    portal_id: Annotated[int, Field(ge=1)] | None = None
    # Property changes that re-route a record (creation events always do).
    routed_properties: list[str] = []
    # Extra properties read with each record (the rules' fields are always read).
    fetch_properties: list[str] = []

    @model_validator(mode="after")
    def _portal_for_webhooks(self) -> HubSpotCrm:
        if self.webhook_secrets and self.portal_id is None:
            raise ValueError(
                "portal_id is required with webhook_secrets: events of other portals "
                "must be told apart and refused"
            )
        return self

    @property
    def parent_key(self) -> str | None:
        return hubspot_parent_field(self.parent_field)


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
        for i, name in enumerate(value):
            if not FIELD_NAME.match(name):
                raise ValueError(
                    f"[{i}] {name!r}: not a CRM field name (letters, digits and _ only)"
                )
        dupes = sorted({n for n in value if value.count(n) > 1})
        if dupes:
            raise ValueError(f"{', '.join(dupes)} listed twice")
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
    org: Annotated[str, Field(pattern=ORG_NAME)]
    crm: Annotated[SalesforceCrm | HubSpotCrm, Field(discriminator="kind")]
    database_url: SecretStr | None = None
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

    @model_validator(mode="after")
    def _rules_name_teams(self) -> OrgConfig:
        names = [t.name for t in self.teams]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"team names must be unique: {', '.join(dupes)}")
        for i, rule in enumerate(self.rules):
            if rule.territory is not None and rule.territory not in self.territories:
                raise ValueError(f"rules[{i}] names unknown territory {rule.territory!r}")
            if rule.team is not None and rule.team not in names:
                raise ValueError(f"rules[{i}] routes to unknown team {rule.team!r}")
        for tname, territory in self.territories.items():
            for row in territory.table.rows:
                if row.team not in names:
                    raise ValueError(
                        f"territories.{tname}: {row.where} routes to unknown team {row.team!r}"
                    )
        by_name = {t.name: t for t in self.teams}
        for i, team in enumerate(self.teams):
            if team.overflow_team is None:
                continue
            if team.overflow_team not in by_name:
                raise ValueError(f"teams[{i}].overflow_team: unknown team {team.overflow_team!r}")
            chain = [team.name]
            nxt: str | None = team.overflow_team
            while nxt is not None:
                if nxt in chain:
                    raise ValueError(
                        f"teams[{i}].overflow_team: overflow goes round in a circle "
                        f"({' -> '.join([*chain, nxt])})"
                    )
                chain.append(nxt)
                nxt = by_name[nxt].overflow_team
        self._check_accounts()
        return self

    def overflow_chain(self, team: str) -> list[str]:
        """``team`` and the teams its overflow leads to, in order (no team twice)."""
        chain = [team]
        nxt = self.team(team).overflow_team
        while nxt is not None and nxt not in chain:
            chain.append(nxt)
            nxt = self.team(nxt).overflow_team
        return chain

    def _check_accounts(self) -> None:
        owner_rules = [i for i, r in enumerate(self.rules) if r.route_to == "account_owner"]
        if self.accounts is not None and not owner_rules:
            raise ValueError(
                "accounts is set but no rule has `route_to: account_owner` (remove it, or "
                "add that rule)"
            )
        if not owner_rules:
            return
        domain_field = self.accounts.domain_field if self.accounts is not None else None
        if domain_field is not None and isinstance(self.crm, HubSpotCrm):
            raise ValueError(
                "accounts.domain_field is for Salesforce only: HubSpot companies are "
                "matched by their domain and website properties"
            )
        if not self.match_fields and not self.crm.parent_key:
            raise ValueError(
                f"rules[{owner_rules[0]}] routes to account_owner, but a {self.crm.object} "
                "record has no default field to match: set accounts.match_fields or "
                "crm.parent_field"
            )

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
        if isinstance(self.crm, HubSpotCrm):
            names.extend(self.crm.fetch_properties)
        return list(dict.fromkeys(names))

    def rule_fields(self, rule: Rule) -> list[str]:
        """The lead fields a rule reads: its conditions' and its territory table's."""
        out = rule.fields
        if rule.territory is not None:
            out = out + [f for f in self.territories[rule.territory].read if f not in out]
        return out

    def warnings(self) -> list[str]:
        """Settings that are valid but almost certainly not what the operator wants."""
        out: list[str] = []
        if isinstance(self.crm, SalesforceCrm):
            if not self.intake_owner_ids:
                out.append(
                    "intake_owner_ids is empty: every Salesforce record has an owner, so "
                    "nothing will be routed (list the intake queue or integration user)"
                )
            if not self.crm.outbound_secrets:
                out.append("crm.outbound_secrets is empty: Outbound Messages are refused")
        elif not self.crm.webhook_secrets:
            out.append("crm.webhook_secrets is empty: HubSpot webhooks are refused")
        for team in self.teams:
            k = team.max_in_a_row
            total = sum(m.weight for m in team.members if m.active)
            for m in team.members:
                # K leads in a row then one other pays K - (K+1) * share of a debt
                if k is None or not m.active or k * total > (k + 1) * m.weight:
                    continue
                if total == m.weight:
                    out.append(f"team {team.name}: catch_up has no effect: {m.name} is alone")
                elif k * total == (k + 1) * m.weight:
                    out.append(
                        f"team {team.name}: with max_in_a_row {k}, {m.name} (weight "
                        f"{m.weight} of {total}) can never catch up after time away; it "
                        f"needs more than {m.weight / (total - m.weight):g}"
                    )
                else:  # more than K of every K+1 leads: K would hold it below its share
                    need = m.weight // (total - m.weight) + 1
                    fix = (
                        f"set max_in_a_row to at least {need} to limit it"
                        if need <= MAX_IN_A_ROW
                        else "no max_in_a_row up to 1000 can limit it"
                    )
                    out.append(
                        f"team {team.name}: max_in_a_row {k} does not apply to {m.name} "
                        f"(weight {m.weight} of {total} is more than {k} of every {k + 1} "
                        f"leads): back from time away it catches up without a limit on "
                        f"leads in a row; {fix}"
                    )
        for tname, territory in self.territories.items():
            gaps = territory.table.gaps
            if gaps:
                more = f" and {len(gaps) - 1} more" if len(gaps) > 1 else ""
                out.append(
                    f"territories.{tname}: {len(gaps)} gap(s) between postal ranges, "
                    f"first {gaps[0]}{more}: leads there fall to the state's or country's "
                    "row, else to the next rule"
                )
        if self.account_matching and not self.poll.enabled:
            out.append(
                "poll.enabled is false: the account mirror is refreshed by the poll, so "
                "route_to: account_owner only sees accounts synced before it was turned off"
            )
        return out

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
