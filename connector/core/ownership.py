"""Whose record is it? The CRM ownership facts both intake and write-back decide by.

A record is *unrouted* when it has no owner or one of the org's ``intake_owner_ids`` (the queue
or integration user that owns new records). Owner and record ids are compared in one canonical
form: Salesforce's 15- and 18-character forms of an id are equal.
"""

from __future__ import annotations

from connector.core.config import OrgConfig
from connector.core.crm_kinds import crm_kind

__all__ = ["intake_keys", "is_unrouted", "owner_key"]


def owner_key(kind: str, owner_id: str) -> str:
    """The form two CRM ids (owners, records) are compared in (Salesforce: the 15- and
    18-character forms are equal)."""
    owner_id = owner_id.strip()
    return crm_kind(kind).id_key(owner_id)


def intake_keys(cfg: OrgConfig) -> frozenset[str]:
    return frozenset(owner_key(cfg.crm.kind, o) for o in cfg.intake_owner_ids)


def is_unrouted(kind: str, owner: str | None, intake: frozenset[str]) -> bool:
    """No owner, or an intake owner: the record is waiting to be routed."""
    return not owner or not owner.strip() or owner_key(kind, owner) in intake
