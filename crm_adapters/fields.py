"""The CRM facts the connector and the adapters share, each written once.

- Owner field: Salesforce records hold their owner in ``OwnerId``, HubSpot objects in the
  ``hubspot_owner_id`` property.
- Parent field: the record that a write locks besides the record itself. A Salesforce Contact's
  owner update locks its parent Account (``AccountId``), so writes are grouped by it; a Lead has
  no parent unless one is configured. HubSpot has no such lock: a parent is only what the config
  names.
"""

from __future__ import annotations

SALESFORCE_OWNER_FIELD = "OwnerId"
HUBSPOT_OWNER_PROPERTY = "hubspot_owner_id"

OWNER_FIELDS = {"salesforce": SALESFORCE_OWNER_FIELD, "hubspot": HUBSPOT_OWNER_PROPERTY}


def salesforce_parent_field(obj: str, configured: str | None) -> str | None:
    """The field naming a Salesforce record's parent Account.

    ``configured`` wins when given (``""`` means "no parent"); otherwise Contacts use
    ``AccountId`` and Leads have none.
    """
    if configured is not None:
        return configured or None
    return "AccountId" if obj == "Contact" else None


def hubspot_parent_field(configured: str | None) -> str | None:
    """HubSpot records have a parent only when the config names one."""
    return configured or None
