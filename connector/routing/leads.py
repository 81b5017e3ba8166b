"""A lead as the router takes it, and what became of it (its ``Outcome``)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

SOURCES = ("salesforce_outbound", "hubspot_webhook", "poll", "import", "api")
MAX_ID_LENGTH = 64
MAX_FIELDS_BYTES = 64 * 1024

Status = Literal["assigned", "duplicate", "unassigned"]


class LeadError(ValueError):
    """A lead that cannot be stored; ``reason`` is short and safe to log (no field values)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Lead:
    crm_id: str
    fields: Mapping[str, Any]


@dataclass(frozen=True)
class Outcome:
    crm_id: str
    status: Status
    team: str | None = None
    owner_id: str | None = None
    owner_name: str | None = None
    reason: str | None = None
    account_id: str | None = None  # set when the lead went to this account's owner
    # Every configured rep of the team that decided, with why it was skipped (None: it could
    # take the lead): (member id, reason) pairs, for a decision recorder.
    candidates: tuple[tuple[int, str | None], ...] = field(default=(), compare=False, repr=False)


def _has_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, Mapping):
        return any(_has_nul(k) or _has_nul(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_nul(v) for v in value)
    return False


def validate_lead(crm_id: object, fields: object) -> Lead:
    """Check one lead's shape before anything is stored; raise LeadError saying why not."""
    if isinstance(crm_id, int) and not isinstance(crm_id, bool):
        crm_id = str(crm_id)
    if not isinstance(crm_id, str) or not crm_id.strip():
        raise LeadError("missing CRM id")
    crm_id = crm_id.strip()
    if len(crm_id) > MAX_ID_LENGTH:
        raise LeadError(f"CRM id longer than {MAX_ID_LENGTH} characters")
    if not crm_id.isprintable():
        raise LeadError("CRM id contains control characters")
    if not isinstance(fields, Mapping):
        raise LeadError("fields must be an object")
    if not all(isinstance(k, str) and k for k in fields):
        raise LeadError("field names must be non-empty text")
    if _has_nul(fields):
        raise LeadError("a field contains a NUL character")
    try:  # NaN and Infinity are not JSON: Postgres' jsonb refuses them
        encoded = json.dumps(fields, allow_nan=False)
    except (TypeError, ValueError):
        raise LeadError("fields must be JSON values") from None
    if len(encoded) > MAX_FIELDS_BYTES:
        raise LeadError(f"fields larger than {MAX_FIELDS_BYTES} bytes")
    return Lead(crm_id, dict(fields))


class RoutingError(RuntimeError):
    """The routing state does not match the config (e.g. a team was never applied)."""


_new = object.__new__


def assigned_outcome(
    crm_id: str,
    team: str,
    owner_id: str,
    owner_name: str,
    candidates: tuple[tuple[int, str | None], ...],
) -> Outcome:
    """``Outcome(crm_id, "assigned", team, owner_id, owner_name, candidates=candidates)``,
    built without the frozen dataclass's ``__init__`` (one ``object.__setattr__`` a field:
    about 1 µs, and a batch builds one a lead); ``test_routing`` checks it equals the one
    ``__init__`` builds, field for field."""
    o = _new(Outcome)
    o.__dict__.update(
        crm_id=crm_id,
        status="assigned",
        team=team,
        owner_id=owner_id,
        owner_name=owner_name,
        reason=None,
        account_id=None,
        candidates=candidates,
    )
    return o
