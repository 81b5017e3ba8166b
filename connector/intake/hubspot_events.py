"""HubSpot webhook deliveries: parse the JSON array of events, keep the ones that route leads.

HubSpot batches events (possibly from several portals) into one POST, repeats deliveries and
does not preserve order, so ``dedupe_latest`` collapses a batch to the newest event per object
and the ingest layer stays idempotent per ``event_id``. All functions are pure.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from crm_adapters.fields import HUBSPOT_OWNER_PROPERTY

DEFAULT_MAX_BYTES = 1_048_576
DEFAULT_MAX_EVENTS = 1000
_MAX_ID = 2**63 - 1  # ids land in BIGINT columns

# The object type ids of the CRM objects a HubSpot org routes (`crm.object`).
HUBSPOT_OBJECT_TYPE_IDS = {"contacts": "0-1", "leads": "0-136"}

# The legacy "<object>.<action>" subscription types name standard objects by word.
LEGACY_OBJECT_TYPE_IDS = {
    "contact": "0-1",
    "company": "0-2",
    "deal": "0-3",
    "ticket": "0-5",
}


class EventError(Exception):
    """A rejected webhook body; ``index`` points at the offending event when there is one."""

    def __init__(self, code: str, http_status: int, message: str, index: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.http_status = http_status
        self.message = message
        self.index = index

    def __repr__(self) -> str:
        return f"EventError({self.code!r}, {self.http_status}, {self.message!r})"


@dataclass(frozen=True, slots=True)
class HubSpotEvent:
    """One webhook event; optional fields are None when HubSpot did not send them."""

    event_id: int
    subscription_id: int
    portal_id: int
    app_id: int | None
    occurred_at: int
    subscription_type: str
    attempt_number: int
    object_id: int
    object_type_id: str | None = None
    property_name: str | None = None
    property_value: str | None = None
    change_source: str | None = None

    @property
    def action(self) -> str:
        """``creation``, ``propertyChange``, ``deletion``, ... (the part after the dot)."""
        return self.subscription_type.rpartition(".")[2]

    @property
    def object_type(self) -> str | None:
        """HubSpot's object type id ("0-1" contacts, "0-136" leads), legacy names mapped."""
        if self.object_type_id is not None:
            return self.object_type_id
        return LEGACY_OBJECT_TYPE_IDS.get(self.subscription_type.partition(".")[0])


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


class _BadEvent(Exception):
    pass


def _opt_int(raw: dict[str, Any], key: str) -> int | None:
    value = raw.get(key)
    if value is None:
        return None
    # bool is an int subclass: JSON true must not pass as 1.
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _MAX_ID:
        raise _BadEvent(f"{key} must be a non-negative integer")
    return value


def _int(raw: dict[str, Any], key: str) -> int:
    value = _opt_int(raw, key)
    if value is None:
        raise _BadEvent(f"{key} is missing")
    return value


def _opt_str(raw: dict[str, Any], key: str) -> str | None:
    value = raw.get(key)
    if value is None or isinstance(value, str):
        return value
    raise _BadEvent(f"{key} must be a string")


def _event(raw: object) -> HubSpotEvent:
    if not isinstance(raw, dict):
        raise _BadEvent("event is not an object")
    subscription_type = _opt_str(raw, "subscriptionType")
    if subscription_type is None:
        raise _BadEvent("subscriptionType is missing")
    if "." not in subscription_type:
        raise _BadEvent("subscriptionType must look like 'object.action'")
    return HubSpotEvent(
        event_id=_int(raw, "eventId"),
        subscription_id=_int(raw, "subscriptionId"),
        portal_id=_int(raw, "portalId"),
        app_id=_opt_int(raw, "appId"),
        occurred_at=_int(raw, "occurredAt"),
        subscription_type=subscription_type,
        attempt_number=_opt_int(raw, "attemptNumber") or 0,
        object_id=_int(raw, "objectId"),
        object_type_id=_opt_str(raw, "objectTypeId"),
        property_name=_opt_str(raw, "propertyName"),
        property_value=_opt_str(raw, "propertyValue"),
        change_source=_opt_str(raw, "changeSource"),
    )


def parse_events(
    body: bytes, max_bytes: int = DEFAULT_MAX_BYTES, max_events: int = DEFAULT_MAX_EVENTS
) -> list[HubSpotEvent]:
    """Parse one webhook body; raises EventError and nothing else on bad input."""
    if len(body) > max_bytes:
        raise EventError("body_too_large", 413, f"body exceeds {max_bytes} bytes")
    try:
        data = json.loads(body, parse_constant=_reject_constant)
    except RecursionError:
        raise EventError("malformed_json", 400, "JSON nests too deeply") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, huge integers
        raise EventError("malformed_json", 400, f"malformed JSON: {exc}") from None
    if not isinstance(data, list):
        raise EventError("not_an_array", 400, "body must be a JSON array of events")
    if len(data) > max_events:
        raise EventError(
            "too_many_events", 400, f"{len(data)} events, at most {max_events} are allowed"
        )
    events = []
    for index, raw in enumerate(data):
        try:
            events.append(_event(raw))
        except _BadEvent as exc:
            raise EventError("bad_event", 400, f"event {index}: {exc}", index=index) from None
    return events


def lead_events(
    events: Iterable[HubSpotEvent],
    *,
    routed_properties: Collection[str],
    owner_property: str = HUBSPOT_OWNER_PROPERTY,
    object_type_ids: Collection[str] | None = None,
) -> list[HubSpotEvent]:
    """Keep the events that can change a lead's routing: creations, and changes to one of
    ``routed_properties``. Changes to ``owner_property`` are always dropped: they are the echo
    of our own write-back (or a manual reassignment), and routing on them would loop.
    ``object_type_ids`` (e.g. ``{"0-1", "0-136"}``) limits which object types count."""
    kept = []
    for event in events:
        if object_type_ids is not None and event.object_type not in object_type_ids:
            continue
        routed_change = (
            event.action == "propertyChange"
            and event.property_name is not None
            and event.property_name != owner_property
            and event.property_name in routed_properties
        )
        if event.action == "creation" or routed_change:
            kept.append(event)
    return kept


def dedupe_latest(events: Iterable[HubSpotEvent]) -> list[HubSpotEvent]:
    """One event per object (per portal and object type), the one that occurred last; the
    result keeps the order in which each object was first seen. Ties keep the earlier one."""
    latest: dict[tuple[int, str | None, int], HubSpotEvent] = {}
    for event in events:
        key = (event.portal_id, event.object_type, event.object_id)
        current = latest.get(key)
        if current is None or event.occurred_at > current.occurred_at:
            latest[key] = event
    return list(latest.values())


# --- builder (`connector send`, the demo, tests) --------------------------------------------


def webhook_event(
    event_id: int,
    object_id: int,
    portal_id: int,
    occurred_at_ms: int,
    *,
    subscription_type: str = "contact.creation",
    object_type_id: str | None = None,
    property_name: str | None = None,
    property_value: str | None = None,
    subscription_id: int = 9001,
    app_id: int = 1160452,
    attempt_number: int = 0,
) -> dict[str, Any]:
    """One event as HubSpot sends it in a webhook body; ``parse_events`` reads it back."""
    event: dict[str, Any] = {
        "eventId": event_id,
        "subscriptionId": subscription_id,
        "portalId": portal_id,
        "appId": app_id,
        "occurredAt": occurred_at_ms,
        "subscriptionType": subscription_type,
        "attemptNumber": attempt_number,
        "objectId": object_id,
        "changeSource": "CRM",
    }
    if object_type_id is not None:
        event["objectTypeId"] = object_type_id
    if property_name is not None:
        event["propertyName"], event["propertyValue"] = property_name, property_value
    return event


def creation_events(
    portal_id: int,
    crm_object: str,
    object_ids: Sequence[int],
    first_event_id: int,
    occurred_at_ms: int,
) -> list[dict[str, Any]]:
    """The creation events of these records of ``crm_object`` (``contacts``: the legacy
    ``contact.creation``; ``leads``: ``object.creation`` of type 0-136), one per record."""
    if crm_object not in HUBSPOT_OBJECT_TYPE_IDS:
        raise ValueError(f"unknown HubSpot object {crm_object!r}")
    legacy = crm_object == "contacts"
    return [
        webhook_event(
            first_event_id + i,
            object_id,
            portal_id,
            occurred_at_ms,
            subscription_type="contact.creation" if legacy else "object.creation",
            object_type_id=None if legacy else HUBSPOT_OBJECT_TYPE_IDS[crm_object],
        )
        for i, object_id in enumerate(object_ids)
    ]


def events_body(events: Sequence[dict[str, Any]]) -> bytes:
    """A webhook body: the JSON array of ``events``."""
    return json.dumps(list(events)).encode()
