"""HubSpot webhook bodies: parsing, every error code, lead filtering, dedupe, fuzz."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from connector.intake.hubspot_events import (
    EventError,
    HubSpotEvent,
    dedupe_latest,
    lead_events,
    parse_events,
)

# Shaped like HubSpot's documented deliveries: a creation, a property change, a generic
# object event (leads are object type 0-136), and fields we do not model (changeFlag,
# sourceId, isSensitive) that must be ignored.
REAL_BODY = json.dumps(
    [
        {
            "eventId": 100,
            "subscriptionId": 12345,
            "portalId": 62515,
            "appId": 54321,
            "occurredAt": 1_700_000_000_000,
            "subscriptionType": "contact.creation",
            "attemptNumber": 0,
            "objectId": 123,
            "changeFlag": "NEW",
            "changeSource": "CRM",
            "sourceId": "userId:1",
        },
        {
            "eventId": 101,
            "subscriptionId": 12346,
            "portalId": 62515,
            "appId": 54321,
            "occurredAt": 1_700_000_000_500,
            "subscriptionType": "contact.propertyChange",
            "attemptNumber": 2,
            "objectId": 123,
            "propertyName": "country",
            "propertyValue": "DE",
            "changeSource": "CRM_UI",
            "isSensitive": False,
        },
        {
            "eventId": 102,
            "subscriptionId": 12347,
            "portalId": 62515,
            "appId": 54321,
            "occurredAt": 1_700_000_001_000,
            "subscriptionType": "object.creation",
            "objectTypeId": "0-136",
            "attemptNumber": 0,
            "objectId": 9001,
            "changeSource": "INTEGRATION",
        },
    ]
).encode()


def _raw(**overrides: Any) -> dict[str, Any]:
    event: dict[str, Any] = {
        "eventId": 1,
        "subscriptionId": 2,
        "portalId": 3,
        "appId": 4,
        "occurredAt": 1_700_000_000_000,
        "subscriptionType": "contact.creation",
        "attemptNumber": 0,
        "objectId": 5,
    }
    for key, value in overrides.items():
        if value is _DROP:
            event.pop(key, None)
        else:
            event[key] = value
    return event


_DROP = object()


def _event(**overrides: Any) -> HubSpotEvent:
    (event,) = parse_events(json.dumps([_raw(**overrides)]).encode())
    return event


def _error(body: bytes, **kwargs: int) -> EventError:
    with pytest.raises(EventError) as info:
        parse_events(body, **kwargs)
    return info.value


# --- parsing ----------------------------------------------------------------------------


def test_parses_real_shaped_body() -> None:
    created, changed, lead = parse_events(REAL_BODY)
    assert created == HubSpotEvent(
        event_id=100,
        subscription_id=12345,
        portal_id=62515,
        app_id=54321,
        occurred_at=1_700_000_000_000,
        subscription_type="contact.creation",
        attempt_number=0,
        object_id=123,
        change_source="CRM",
    )
    assert created.action == "creation"
    assert created.object_type == "0-1"
    assert changed.action == "propertyChange"
    assert (changed.property_name, changed.property_value) == ("country", "DE")
    assert changed.attempt_number == 2
    assert lead.object_type_id == "0-136"
    assert lead.object_type == "0-136"
    assert lead.action == "creation"


def test_empty_array_is_fine() -> None:
    assert parse_events(b"[]") == []
    assert parse_events(b" [ ] \n") == []


def test_optional_fields_default() -> None:
    event = _event(appId=_DROP, attemptNumber=_DROP, propertyValue=None)
    assert event.app_id is None
    assert event.attempt_number == 0
    assert event.property_value is None
    assert _event(subscriptionType="widget.creation").object_type is None


# --- error codes ------------------------------------------------------------------------


def test_body_too_large() -> None:
    err = _error(REAL_BODY, max_bytes=len(REAL_BODY) - 1)
    assert (err.code, err.http_status) == ("body_too_large", 413)
    assert len(parse_events(REAL_BODY, max_bytes=len(REAL_BODY))) == 3


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"[",
        b"[{]",
        b"nope",
        b'[{"eventId": 1,}]',
        b"[NaN]",
        b"[Infinity]",
        b'["\xff\xfe\xfd"]',
        b"[" * 100_000 + b"]" * 100_000,
        b"[" + b"9" * 5000 + b"]",
    ],
)
def test_malformed_json(body: bytes) -> None:
    err = _error(body, max_bytes=10**7)
    assert (err.code, err.http_status) == ("malformed_json", 400)


@pytest.mark.parametrize("body", [b"{}", b'{"eventId": 1}', b"1", b'"x"', b"null", b"true"])
def test_not_an_array(body: bytes) -> None:
    err = _error(body)
    assert (err.code, err.http_status) == ("not_an_array", 400)


def test_too_many_events() -> None:
    body = json.dumps([_raw(eventId=i) for i in range(11)]).encode()
    err = _error(body, max_events=10)
    assert (err.code, err.http_status) == ("too_many_events", 400)
    assert len(parse_events(body, max_events=11)) == 11
    big = json.dumps([_raw(eventId=i) for i in range(1001)]).encode()
    assert _error(big).code == "too_many_events"


@pytest.mark.parametrize(
    ("overrides", "mentions"),
    [
        ({"eventId": _DROP}, "eventId"),
        ({"eventId": "1"}, "eventId"),
        ({"eventId": 1.5}, "eventId"),
        ({"eventId": True}, "eventId"),
        ({"eventId": -1}, "eventId"),
        ({"eventId": 2**63}, "eventId"),
        ({"subscriptionId": None}, "subscriptionId"),
        ({"portalId": _DROP}, "portalId"),
        ({"occurredAt": "yesterday"}, "occurredAt"),
        ({"objectId": _DROP}, "objectId"),
        ({"objectId": [1]}, "objectId"),
        ({"subscriptionType": _DROP}, "subscriptionType"),
        ({"subscriptionType": 7}, "subscriptionType"),
        ({"subscriptionType": "creation"}, "subscriptionType"),
        ({"appId": "x"}, "appId"),
        ({"attemptNumber": False}, "attemptNumber"),
        ({"propertyName": 3}, "propertyName"),
        ({"propertyValue": {"a": 1}}, "propertyValue"),
        ({"objectTypeId": 136}, "objectTypeId"),
        ({"changeSource": ["CRM"]}, "changeSource"),
    ],
)
def test_bad_event(overrides: dict[str, Any], mentions: str) -> None:
    body = json.dumps([_raw(), _raw(), _raw(**overrides)]).encode()
    err = _error(body)
    assert (err.code, err.http_status) == ("bad_event", 400)
    assert err.index == 2
    assert "event 2" in err.message
    assert mentions in err.message


@pytest.mark.parametrize("item", [1, "x", None, [], True])
def test_bad_event_not_an_object(item: object) -> None:
    err = _error(json.dumps([_raw(), item]).encode())
    assert (err.code, err.index) == ("bad_event", 1)


# --- lead_events ------------------------------------------------------------------------

ROUTED = {"country", "industry", "hubspot_owner_id"}


def test_lead_events_filters() -> None:
    creation = _event(eventId=1)
    object_creation = _event(eventId=2, subscriptionType="object.creation", objectTypeId="0-136")
    routed = _event(eventId=3, subscriptionType="contact.propertyChange", propertyName="country")
    unrouted = _event(eventId=4, subscriptionType="contact.propertyChange", propertyName="phone")
    owner = _event(
        eventId=5, subscriptionType="contact.propertyChange", propertyName="hubspot_owner_id"
    )
    nameless = _event(eventId=6, subscriptionType="contact.propertyChange")
    deletion = _event(eventId=7, subscriptionType="contact.deletion")
    merge = _event(eventId=8, subscriptionType="contact.merge")
    events = [creation, object_creation, routed, unrouted, owner, nameless, deletion, merge]
    assert lead_events(events, routed_properties=ROUTED) == [creation, object_creation, routed]
    # A different owner property: hubspot_owner_id is then an ordinary routed property.
    assert lead_events(events, routed_properties=ROUTED, owner_property="lead_owner") == [
        creation,
        object_creation,
        routed,
        owner,
    ]
    assert lead_events(events, routed_properties=()) == [creation, object_creation]
    assert lead_events(events, routed_properties=ROUTED, object_type_ids={"0-136"}) == [
        object_creation
    ]
    assert lead_events(iter(events), routed_properties=ROUTED)[0] is creation


# --- dedupe_latest ----------------------------------------------------------------------


def test_dedupe_latest_keeps_newest_in_first_seen_order() -> None:
    a_old = _event(eventId=1, objectId=10, occurredAt=100)
    b = _event(eventId=2, objectId=20, occurredAt=150)
    a_new = _event(eventId=3, objectId=10, occurredAt=300)
    a_older = _event(eventId=4, objectId=10, occurredAt=50)  # arrives late, out of order
    c = _event(eventId=5, objectId=30, occurredAt=10)
    b_tie = _event(eventId=6, objectId=20, occurredAt=150)
    assert dedupe_latest([a_old, b, a_new, a_older, c, b_tie]) == [a_new, b, c]
    assert dedupe_latest([]) == []


def test_dedupe_keeps_distinct_portals_and_object_types_apart() -> None:
    contact = _event(eventId=1, objectId=10)
    other_portal = _event(eventId=2, objectId=10, portalId=999)
    lead = _event(eventId=3, objectId=10, subscriptionType="object.creation", objectTypeId="0-136")
    same_contact_generic = _event(
        eventId=4,
        objectId=10,
        subscriptionType="object.creation",
        objectTypeId="0-1",
        occurredAt=1_800_000_000_000,
    )
    assert dedupe_latest([contact, other_portal, lead, same_contact_generic]) == [
        same_contact_generic,
        other_portal,
        lead,
    ]


# --- fuzz -------------------------------------------------------------------------------

_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=10),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=20,
)
_event_like = st.fixed_dictionaries(
    {},
    optional={
        "eventId": _json | st.integers(0, 2**63),
        "subscriptionId": _json | st.integers(0, 10**6),
        "portalId": _json | st.integers(0, 10**6),
        "appId": _json,
        "occurredAt": _json | st.integers(0, 2**50),
        "subscriptionType": _json | st.sampled_from(["contact.creation", "contact.propertyChange"]),
        "attemptNumber": _json,
        "objectId": _json | st.integers(0, 10**9),
        "propertyName": _json,
        "propertyValue": _json,
    },
)


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=512))
def test_fuzz_random_bytes(body: bytes) -> None:
    try:
        parse_events(body)
    except EventError as exc:
        assert exc.code in {"malformed_json", "not_an_array", "bad_event"}


@settings(max_examples=200, deadline=None)
@given(_json | st.lists(_event_like, max_size=5))
def test_fuzz_json_shapes(value: object) -> None:
    try:
        events = parse_events(json.dumps(value).encode())
    except EventError as exc:
        assert exc.code in {"not_an_array", "bad_event"}
        return
    kept = lead_events(events, routed_properties={"country"})
    assert set(kept) <= set(events)
    deduped = dedupe_latest(events)
    assert len({(e.portal_id, e.object_type, e.object_id) for e in events}) == len(deduped)


def test_the_event_count_is_bounded_before_the_rest_is_parsed() -> None:
    """1,001 items followed by bytes that are not JSON at all: too_many_events, so the
    parser stopped at the 1,001st item (a full parse would call it malformed)."""
    body = b"[" + b",".join([b"{}"] * 1001) + b"," + b"\x00garbage" * 50_000
    err = _error(body)
    assert (err.code, err.http_status) == ("too_many_events", 400)
    assert err.message == "more than 1000 events are not allowed"
    assert _error(b"[" + b",".join([b"1"] * 500_000) + b"]").code == "too_many_events"
    assert _error(b"[1] x").code == "malformed_json"
    assert _error(b"[1 2]").code == "malformed_json"
    assert _error(b" {}").code == "not_an_array"
