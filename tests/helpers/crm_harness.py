"""Shared harness for crm_adapters tests: one interface over both sandboxes and adapters, and
over the in-memory CRM (crm_adapters.memory) in either dialect."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from crm_adapters.base import CrmAdapter
from crm_adapters.hubspot import HubSpotAdapter, HubSpotSettings
from crm_adapters.memory import MemoryCrm
from crm_adapters.salesforce import SalesforceAdapter, SalesforceSettings
from crm_sandboxes import HubSpotSandbox, SalesforceSandbox

SF_CLIENT_CREDENTIALS = {
    "method": "client_credentials",
    "client_id": "sandbox-client",
    "client_secret": "sandbox-secret",
}


def sf_settings(sb: SalesforceSandbox, **kw: Any) -> SalesforceSettings:
    """Settings pointing at a running Salesforce sandbox (Contacts, client credentials)."""
    base: dict[str, Any] = {
        "instance_url": sb.url,
        "auth": dict(SF_CLIENT_CREDENTIALS),
        "object": "Contact",
        "timeout": 5.0,
    }
    base.update(kw)
    return SalesforceSettings(**base)


_TOKENS = iter(range(1, 1_000_000))


def hs_settings(sb: HubSpotSandbox, **kw: Any) -> HubSpotSettings:
    """Settings for a running HubSpot sandbox; a fresh token so rate windows are not shared."""
    token = f"test-token-{next(_TOKENS)}"
    sb.add_token(token)
    base: dict[str, Any] = {
        "access_token": token,
        "base_url": sb.url,
        "search_per_s": 50.0,
        "timeout": 5.0,
    }
    base.update(kw)
    return HubSpotSettings(**base)


@dataclass
class Harness:
    """Drive any CRM the same way: seed, make adapters, inspect, inject faults.

    With a MemoryCrm the CRM and its adapter are one object; `kind` is its dialect."""

    kind: str
    sandbox: SalesforceSandbox | HubSpotSandbox | MemoryCrm
    parent: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def in_memory(self) -> bool:
        return isinstance(self.sandbox, MemoryCrm)

    def adapter(self, **kw: Any) -> CrmAdapter:
        if isinstance(self.sandbox, MemoryCrm):
            return self.sandbox  # no wire: transport settings (timeouts) do not apply
        if isinstance(self.sandbox, SalesforceSandbox):
            return SalesforceAdapter(sf_settings(self.sandbox, **kw))
        return HubSpotAdapter(hs_settings(self.sandbox, **kw))

    def owner(self, active: bool = True) -> str:
        if isinstance(self.sandbox, MemoryCrm):
            return self.sandbox.add_user(active=active)
        if isinstance(self.sandbox, SalesforceSandbox):
            return self.sandbox.add_user(active=active)
        return self.sandbox.add_owner(archived=not active)

    def new_parent(self) -> str | None:
        if isinstance(self.sandbox, MemoryCrm):
            if self.kind == "salesforce":
                self.parent = self.sandbox.add_parent()
        elif isinstance(self.sandbox, SalesforceSandbox):
            self.parent = self.sandbox.add_account()
        return self.parent

    def record(self, owner: str | None = None) -> str:
        if isinstance(self.sandbox, MemoryCrm):
            return self.sandbox.add_record(owner, self.parent)
        if isinstance(self.sandbox, SalesforceSandbox):
            return self.sandbox.add_record("Contact", owner, self.parent)
        return self.sandbox.add_record("contacts", owner)

    def delete(self, record_id: str) -> None:
        if isinstance(self.sandbox, MemoryCrm):
            self.sandbox.delete(record_id)
        elif isinstance(self.sandbox, SalesforceSandbox):
            self.sandbox.delete_record(record_id)
        else:
            self.sandbox.delete_record(record_id, "contacts")

    def poison(self, record_ids: list[str]) -> None:
        """Writes to these records always fail a validation rule."""
        self.sandbox.poison(record_ids)

    def clear_faults(self) -> None:
        self.sandbox.clear_faults()

    def owner_of(self, record_id: str) -> str | None:
        if isinstance(self.sandbox, MemoryCrm):
            return self.sandbox.owner_of(record_id)
        if isinstance(self.sandbox, SalesforceSandbox):
            rec = self.sandbox.get_record(record_id)
            return None if rec is None else rec.get("OwnerId")
        hrec = self.sandbox.get_record(record_id, "contacts")
        return None if hrec is None else hrec["properties"].get("hubspot_owner_id")

    @property
    def owner_field(self) -> str:
        return "OwnerId" if self.kind == "salesforce" else "hubspot_owner_id"

    def missing_id(self) -> str:
        return "003SB9999999999AAA" if self.kind == "salesforce" else "99999999"

    def inject_5xx(self, n: int = 1, status: int = 503) -> None:
        if isinstance(self.sandbox, MemoryCrm):
            self.sandbox.fail_transient(n)
        elif self.kind == "salesforce":
            self.sandbox.inject_failures(n, status)
        else:
            body = {"status": "error", "message": "Service unavailable", "category": "INTERNAL"}
            self.sandbox.inject_failures(n, status, body)

    def inject_429(self) -> None:
        """The CRM's answer to being over quota (Salesforce: the org's daily API limit)."""
        if isinstance(self.sandbox, MemoryCrm):
            if self.kind == "salesforce":
                self.sandbox.fail_rate_limited(900.0, scope="org")
            else:
                self.sandbox.fail_rate_limited(1.0, scope="request")
        elif self.kind == "salesforce":
            sf_body = [
                {"message": "TotalRequests Limit exceeded.", "errorCode": "REQUEST_LIMIT_EXCEEDED"}
            ]
            self.sandbox.inject_failures(1, 403, sf_body)
        else:
            body = {
                "status": "error",
                "message": "You have reached your ten_secondly_rolling limit.",
                "errorType": "RATE_LIMIT",
                "correlationId": "x",
                "policyName": "TEN_SECONDLY_ROLLING",
            }
            self.sandbox.inject_failures(1, 429, body)


@pytest.fixture(scope="module")
def sf_sandbox() -> Iterator[SalesforceSandbox]:
    sb = SalesforceSandbox(record_work_ms=0.0, lock_wait_s=1.0).start()
    yield sb
    sb.stop()


@pytest.fixture(scope="module")
def hs_sandbox() -> Iterator[HubSpotSandbox]:
    sb = HubSpotSandbox(limit_per_10s=10_000, search_per_s=None).start()
    yield sb
    sb.stop()
