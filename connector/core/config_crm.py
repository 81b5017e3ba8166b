"""The ``crm`` section of an org's configuration: which CRM, how to reach it, and what its
pushes must carry to be accepted."""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated, Literal

from pydantic import BaseModel, Field, SecretStr, field_validator, model_validator

from connector.core.config_base import STRICT
from connector.core.config_checks import Invalid
from crm_adapters.fields import hubspot_parent_field, salesforce_parent_field
from crm_adapters.salesforce_ids import is_id as is_salesforce_id

# The shared secret Salesforce sends as the last path segment of the endpoint URL.
URL_SECRET = re.compile(r"^[A-Za-z0-9._~-]{24,200}$")


class _Model(BaseModel):
    model_config = STRICT


SECRET_AUTH_KEYS = ("client_id", "client_secret", "password", "access_token", "private_key")


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
        found = [
            ((k,), f"auth method {self.method} needs it; add `{k}: ${{ENV_NAME}}`")
            if k in SECRET_AUTH_KEYS
            else ((k,), f"auth method {self.method} needs it; add `{k}: ...`")
            for k in missing
        ]
        if self.method == "jwt" and not (self.private_key or self.private_key_file):
            found.append(
                (
                    ("private_key",),
                    "auth method jwt needs it; add `private_key: ${ENV_NAME}` or "
                    "`private_key_file: PATH`",
                )
            )
        if found:
            raise Invalid(*found)
        return self


class HubSpotAuth(_Model):
    method: Literal["private_app"] = "private_app"
    access_token: SecretStr


class SalesforceCrm(_Model):
    kind: Literal["salesforce"]
    instance_url: Annotated[
        str,
        Field(
            pattern=r"^https?://[^\s/]+(:\d+)?/?$",
            description="a base URL with no path, such as https://acme.my.salesforce.com",
        ),
    ]
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
    api_version: Annotated[
        str, Field(pattern=r"^\d+\.\d$", description="a version such as 62.0")
    ] = "62.0"

    @field_validator("organization_id")
    @classmethod
    def _org_id(cls, value: str | None) -> str | None:
        if value is not None and not (value.startswith("00D") and is_salesforce_id(value)):
            raise ValueError("not a Salesforce organization id (15 or 18 characters, 00D...)")
        return value

    @field_validator("outbound_secrets")
    @classmethod
    def _url_safe_secrets(cls, secrets: list[SecretStr]) -> list[SecretStr]:
        bad = [
            i for i, secret in enumerate(secrets) if not URL_SECRET.match(secret.get_secret_value())
        ]
        if bad:
            raise Invalid(
                *(
                    (
                        (i,),
                        "must be 24 to 200 characters of A-Z a-z 0-9 . _ ~ - (it is sent as a "
                        "URL path segment); generate one with "
                        "`python3 -c 'import secrets; print(secrets.token_urlsafe(32))'`",
                    )
                    for i in bad
                )
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
    base_url: Annotated[
        str,
        Field(
            pattern=r"^https?://[^\s/]+(:\d+)?/?$",
            description="a base URL with no path, such as https://api.hubapi.com",
        ),
    ] = "https://api.hubapi.com"
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
            raise Invalid(
                (
                    ("portal_id",),
                    "required with webhook_secrets (events of other portals must be told apart "
                    "and refused); add `portal_id: N`, your HubSpot account id",
                )
            )
        return self

    @property
    def parent_key(self) -> str | None:
        return hubspot_parent_field(self.parent_field)
