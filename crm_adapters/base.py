"""The one port the connector uses to talk to a CRM, plus errors that say what to do next."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal, Protocol, runtime_checkable

__all__ = [
    "AccountSource",
    "AuthError",
    "CrmAccount",
    "CrmAdapter",
    "CrmError",
    "CrmRecord",
    "OwnerWrite",
    "PermanentError",
    "RateLimitedError",
    "RetryableError",
    "WriteOutcome",
]


class CrmError(Exception):
    """Base CRM failure; `code` is the CRM's own code (statusCode, category or HTTP status)."""

    def __init__(self, code: str, message: str = "") -> None:
        super().__init__(f"{code}: {message}" if message else code)
        self.code = code
        self.message = message

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code!r}, message={self.message!r})"


class RetryableError(CrmError):
    """Try again later (lock contention, 5xx, timeouts); wait at least `retry_after` if set."""

    def __init__(self, code: str, message: str = "", retry_after: float | None = None) -> None:
        super().__init__(code, message)
        self.retry_after = retry_after


class RateLimitedError(RetryableError):
    """Over a CRM quota: scope "request" = back off this call, "org" = pause all org writes."""

    def __init__(
        self,
        code: str,
        message: str = "",
        retry_after: float | None = None,
        scope: Literal["request", "org"] = "request",
    ) -> None:
        super().__init__(code, message, retry_after)
        self.scope: Literal["request", "org"] = scope


class PermanentError(CrmError):
    """Retrying cannot help (bad owner, deleted record, validation rule): dead-letter it."""


class AuthError(CrmError):
    """Credentials are missing, expired beyond refresh, or lack permission: stop the org."""


@dataclass(frozen=True)
class OwnerWrite:
    """Set `owner_id` on `record_id`; `key` is the caller's opaque id to match outcomes."""

    key: str
    record_id: str
    owner_id: str
    parent_id: str | None = None


@dataclass(frozen=True)
class WriteOutcome:
    """Result of one OwnerWrite, in input order."""

    key: str
    ok: bool
    error: CrmError | None = None


@dataclass(frozen=True)
class CrmRecord:
    """A CRM record as read back: id, selected fields (as strings) and last-modified time."""

    crm_id: str
    fields: dict[str, str | None]
    modified_at: datetime


@runtime_checkable
class CrmAdapter(Protocol):
    """What the connector may call. Whole-request failures raise a CrmError subclass."""

    kind: str
    max_batch: int
    owner_field: str  # the record field that holds the owner (OwnerId, hubspot_owner_id)

    def write_owners(self, batch: Sequence[OwnerWrite]) -> list[WriteOutcome]:
        """One outcome per input, same order; per-record failures are outcomes, not raises."""
        ...

    def changed_since(
        self, since: datetime, until: datetime | None = None, page_size: int = 200
    ) -> Iterator[list[CrmRecord]]:
        """Pages of records with since <= modified_at (< until), ascending by modified_at."""
        ...

    def fetch_records(self, ids: Sequence[str], fields: Sequence[str]) -> list[CrmRecord]:
        """Records that exist among `ids` (input order), with the requested fields; the
        owner (`owner_field`) and the parent are always among the fields."""
        ...

    def check_owners(self, owner_ids: Sequence[str]) -> dict[str, str | None]:
        """owner id -> None if it exists and is active, else a short reason."""
        ...

    def usage(self) -> dict[str, object]:
        """Last seen quota figures (Salesforce api-usage, HubSpot rate-limit budget)."""
        ...


@dataclass(frozen=True)
class CrmAccount:
    """An Account (Salesforce) or Company (HubSpot) as read for lead-to-account matching:
    its owner and the raw values of its domain-bearing fields (website, domain), in the
    order they were asked for; the connector normalises them."""

    crm_id: str
    owner_id: str | None
    domain_values: tuple[str | None, ...]
    modified_at: datetime


@runtime_checkable
class AccountSource(Protocol):
    """An adapter that can list accounts for the account mirror (a separate port, so an
    adapter without accounts still satisfies CrmAdapter)."""

    def accounts_changed_since(
        self, since: datetime, until: datetime | None = None, page_size: int = 200
    ) -> Iterator[list[CrmAccount]]:
        """Pages of accounts with since <= modified_at (< until), ascending by modified_at."""
        ...
