"""Salesforce Outbound Messages: parse the SOAP 1.1 ``notifications`` call and answer it.

Everything here is a pure function on bytes. The parser enforces a size cap before any XML is
read, then parses with defusedxml with DTDs, entity declarations and external references all
forbidden, so XXE and entity-expansion ("billion laughs") payloads fail fast. While parsing it
also counts elements and nesting depth and stops at the first one over a cap, so a body of
many tiny or deeply nested elements costs no more than a legitimate message. Every failure is
one ``SoapError`` carrying a stable ``code`` and the HTTP status to answer with.

Salesforce retries a message for 24 hours until it receives ``<Ack>true</Ack>``, and may deliver
duplicates or reorder them: callers should answer with ``ack_response()`` only after the ingest
transaction committed, and treat ``notification_id`` as an idempotency key.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from xml.etree.ElementTree import Element, ParseError, TreeBuilder

import defusedxml
import defusedxml.ElementTree as safe_et

SOAP_ENV_NS = "http://schemas.xmlsoap.org/soap/envelope/"
OUTBOUND_NS = "http://soap.sforce.com/2005/09/outbound"
SOBJECT_NS = "urn:sobject.enterprise.soap.sforce.com"
XSI_NS = "http://www.w3.org/2001/XMLSchema-instance"

MAX_NOTIFICATIONS = 100
"""Salesforce sends at most 100 notifications in one message (``maxOccurs="100"``)."""

DEFAULT_MAX_BYTES = 1_048_576

DEFAULT_MAX_ELEMENTS = 50_000
"""A maximal real message (100 notifications x 200 fields) has 20,308 elements: 2.5x margin."""

DEFAULT_MAX_DEPTH = 16
"""A real message nests 6 deep (Envelope/Body/notifications/Notification/sObject/field)."""

_ENVELOPE = f"{{{SOAP_ENV_NS}}}Envelope"
_BODY = f"{{{SOAP_ENV_NS}}}Body"
_NOTIFICATIONS = f"{{{OUTBOUND_NS}}}notifications"
_NOTIFICATION = f"{{{OUTBOUND_NS}}}Notification"
_XSI_TYPE = f"{{{XSI_NS}}}type"
_XSI_NIL = f"{{{XSI_NS}}}nil"

# The shape of a record id; whether its suffix fits is crm_adapters.salesforce_ids' call.
_SF_ID_RE = re.compile(r"[A-Za-z0-9]{15}(?:[A-Za-z0-9]{3})?")
_XML_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Characters XML 1.0 cannot carry at all, even escaped.
_XML_INVALID_RE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


class SoapError(Exception):
    """A rejected Outbound Message: ``code`` is stable for tests and logs, ``http_status`` is
    what to answer (Salesforce retries anything that is not a 200 with ``<Ack>true</Ack>``)."""

    def __init__(self, code: str, http_status: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.http_status = http_status
        self.message = message

    def __repr__(self) -> str:
        return f"SoapError({self.code!r}, {self.http_status}, {self.message!r})"


@dataclass(frozen=True, slots=True)
class Notification:
    """One record change: ``fields`` holds every sent field (``Id`` included); nil is None."""

    notification_id: str
    sobject_type: str
    sobject_id: str
    fields: dict[str, str | None] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class OutboundMessage:
    """The parsed ``notifications`` call; ``session_id`` is None unless "Send Session ID"."""

    organization_id: str
    action_id: str
    session_id: str | None
    enterprise_url: str
    partner_url: str
    notifications: list[Notification]


def _local(tag: str) -> str:
    return tag.rpartition("}")[2]


def _is_nil(element: Element) -> bool:
    return element.get(_XSI_NIL, "").strip() in ("true", "1")


def _leaf_text(element: Element) -> str:
    """Text of an element that must be a leaf (ids, urls)."""
    if len(element):
        raise SoapError("missing_field", 400, f"<{_local(element.tag)}> must hold text")
    return (element.text or "").strip()


def _required(parent: Element, ns: str, name: str) -> str:
    child = parent.find(f"{{{ns}}}{name}")
    if child is None or _is_nil(child):
        raise SoapError("missing_field", 400, f"<{name}> is missing")
    value = _leaf_text(child)
    if not value:
        raise SoapError("missing_field", 400, f"<{name}> is empty")
    return value


class _CappedTreeBuilder:
    """An ElementTree target that refuses, at the element that crosses it, a count or depth cap."""

    def __init__(self, max_elements: int, max_depth: int) -> None:
        self._builder = TreeBuilder()
        self._max_elements = max_elements
        self._max_depth = max_depth
        self._elements = 0
        self._depth = 0

    def start(self, tag: str, attrs: dict[str, str]) -> Element:
        self._elements += 1
        self._depth += 1
        if self._elements > self._max_elements:
            raise SoapError(
                "too_many_elements",
                413,
                f"more than {self._max_elements} XML elements; an Outbound Message has far fewer",
            )
        if self._depth > self._max_depth:
            raise SoapError(
                "too_deep",
                400,
                f"XML nested deeper than {self._max_depth} elements; "
                "an Outbound Message nests 6 deep",
            )
        return self._builder.start(tag, attrs)

    def end(self, tag: str) -> Element:
        self._depth -= 1
        return self._builder.end(tag)

    def data(self, data: str) -> None:
        self._builder.data(data)

    def close(self) -> Element:
        return self._builder.close()


def _parse_xml(body: bytes, max_elements: int, max_depth: int) -> Element:
    try:
        parser = safe_et.DefusedXMLParser(
            target=_CappedTreeBuilder(max_elements, max_depth),
            forbid_dtd=True,
            forbid_entities=True,
            forbid_external=True,
        )
        # expat calls the target per element, so a cap stops the parse where it is crossed.
        parser.feed(body)
        root: Element = parser.close()
    except defusedxml.DTDForbidden as exc:
        raise SoapError("forbidden_xml", 400, "DTDs are not allowed") from exc
    except defusedxml.EntitiesForbidden as exc:
        raise SoapError("forbidden_xml", 400, "entity declarations are not allowed") from exc
    except defusedxml.ExternalReferenceForbidden as exc:
        raise SoapError("forbidden_xml", 400, "external references are not allowed") from exc
    except defusedxml.DefusedXmlException as exc:
        raise SoapError("forbidden_xml", 400, "forbidden XML construct") from exc
    except ParseError as exc:
        raise SoapError("malformed_xml", 400, f"malformed XML: {exc}") from exc
    except (ValueError, LookupError, RecursionError) as exc:
        # Unknown encodings and other decoder failures surface as these rather than ParseError.
        raise SoapError("malformed_xml", 400, f"malformed XML: {type(exc).__name__}") from exc
    return root


def _parse_notification(element: Element, index: int) -> Notification:
    try:
        notification_id = _required(element, OUTBOUND_NS, "Id")
        sobject = element.find(f"{{{OUTBOUND_NS}}}sObject")
        if sobject is None:
            raise SoapError("missing_field", 400, "<sObject> is missing")
        xsi_type = sobject.get(_XSI_TYPE, "").strip()
        sobject_type = xsi_type.rpartition(":")[2]
        if not sobject_type:
            raise SoapError("missing_field", 400, "<sObject> has no xsi:type")
        fields: dict[str, str | None] = {}
        for child in sobject:
            if not isinstance(child.tag, str) or not child.tag.startswith(f"{{{SOBJECT_NS}}}"):
                continue
            if len(child):
                # Outbound Messages carry only the record's own fields; skip anything nested.
                continue
            name = _local(child.tag)
            if name in fields:
                continue
            fields[name] = None if _is_nil(child) else (child.text or "")
        sobject_id = (fields.get("Id") or "").strip()
        if not sobject_id:
            raise SoapError("missing_field", 400, "<sObject> has no Id field")
        if not _SF_ID_RE.fullmatch(sobject_id):
            # not stored, and not echoed: it is not a record id (it may be anything, an email)
            raise SoapError("invalid_lead", 400, "<sObject> Id is not a 15 or 18 character id")
        fields["Id"] = sobject_id
    except SoapError as exc:
        raise SoapError(exc.code, exc.http_status, f"Notification {index}: {exc.message}") from exc
    return Notification(notification_id, sobject_type, sobject_id, fields)


def parse_outbound_message(
    body: bytes,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_elements: int = DEFAULT_MAX_ELEMENTS,
    max_depth: int = DEFAULT_MAX_DEPTH,
) -> OutboundMessage:
    """Parse one Outbound Message body; raises SoapError and nothing else on bad input.

    Over ``max_elements`` elements is ``too_many_elements`` (413, a size limit like
    ``body_too_large``); nesting over ``max_depth`` is ``too_deep`` (400, no real message
    has that shape).
    """
    if len(body) > max_bytes:
        raise SoapError("body_too_large", 413, f"body exceeds {max_bytes} bytes")
    root = _parse_xml(body, max_elements, max_depth)
    if root.tag != _ENVELOPE:
        raise SoapError("not_outbound_message", 400, "root element is not a SOAP 1.1 Envelope")
    soap_body = root.find(_BODY)
    if soap_body is None:
        raise SoapError("not_outbound_message", 400, "SOAP Envelope has no Body")
    call = soap_body.find(_NOTIFICATIONS)
    if call is None:
        raise SoapError("not_outbound_message", 400, "SOAP Body holds no <notifications> call")
    elements = call.findall(_NOTIFICATION)
    if len(elements) > MAX_NOTIFICATIONS:
        raise SoapError(
            "too_many_notifications",
            400,
            f"{len(elements)} notifications, at most {MAX_NOTIFICATIONS} are allowed",
        )
    if not elements:
        raise SoapError("missing_field", 400, "<notifications> holds no <Notification>")

    organization_id = _required(call, OUTBOUND_NS, "OrganizationId")
    action_id = _required(call, OUTBOUND_NS, "ActionId")
    enterprise_url = _required(call, OUTBOUND_NS, "EnterpriseUrl")
    partner_url = _required(call, OUTBOUND_NS, "PartnerUrl")
    session_id: str | None = None
    session = call.find(f"{{{OUTBOUND_NS}}}SessionId")
    if session is not None and not _is_nil(session):
        session_id = _leaf_text(session) or None

    notifications = [_parse_notification(el, i) for i, el in enumerate(elements)]
    return OutboundMessage(
        organization_id=organization_id,
        action_id=action_id,
        session_id=session_id,
        enterprise_url=enterprise_url,
        partner_url=partner_url,
        notifications=notifications,
    )


# --- responses ----------------------------------------------------------------------------


def ack_response(ack: bool = True) -> bytes:
    """The ``notificationsResponse`` body; only ``true`` stops Salesforce retrying."""
    value = "true" if ack else "false"
    return (
        f'<soapenv:Envelope xmlns:soapenv="{SOAP_ENV_NS}"><soapenv:Body>'
        f'<notificationsResponse xmlns="{OUTBOUND_NS}"><Ack>{value}</Ack>'
        "</notificationsResponse></soapenv:Body></soapenv:Envelope>"
    ).encode()


def _escape_text(value: str) -> str:
    # \r would be normalized to \n by any XML parser; a character reference survives.
    return (
        value.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("\r", "&#13;")
    )


def soap_fault(message: str, faultcode: str = "Client") -> bytes:
    """A SOAP 1.1 Fault body (``Client`` for bad input, ``Server`` for our own failures)."""
    if faultcode not in ("Client", "Server"):
        raise ValueError("faultcode must be 'Client' or 'Server'")
    text = _escape_text(_XML_INVALID_RE.sub("\ufffd", message))
    return (
        f'<soapenv:Envelope xmlns:soapenv="{SOAP_ENV_NS}"><soapenv:Body><soapenv:Fault>'
        f"<faultcode>soapenv:{faultcode}</faultcode><faultstring>{text}</faultstring>"
        "</soapenv:Fault></soapenv:Body></soapenv:Envelope>"
    ).encode()


# --- builder (`connector send`, the demo, tests) -------------------------------------------

OUTBOUND_MESSAGE_HEADERS = {"Content-Type": "text/xml; charset=utf-8", "SOAPAction": '""'}
"""The headers Salesforce sends with an Outbound Message."""


def _xml_value(value: str, what: str) -> str:
    if _XML_INVALID_RE.search(value):
        raise ValueError(f"{what} holds a character XML cannot carry")
    return _escape_text(value)


def build_outbound_message(
    organization_id: str,
    notifications: Sequence[tuple[str, str, Mapping[str, str | None]]],
    action_id: str = "04k000000000001AAA",
    session_id: str | None = None,
    enterprise_url: str | None = None,
    partner_url: str | None = None,
) -> bytes:
    """Build a body shaped like the ones Salesforce sends; ``parse_outbound_message`` reads it
    back unchanged. Each notification is ``(notification_id, sobject_type, fields)`` and
    ``fields`` must hold ``Id``. Raises ValueError for input XML cannot carry."""
    base = "https://example.my.salesforce.com/services/Soap"
    enterprise_url = enterprise_url or f"{base}/c/60.0/{organization_id}"
    partner_url = partner_url or f"{base}/u/60.0/{organization_id}"
    session = (
        '<SessionId xsi:nil="true"/>'
        if session_id is None
        else f"<SessionId>{_xml_value(session_id, 'session_id')}</SessionId>"
    )
    parts = [
        '<?xml version="1.0" encoding="UTF-8"?>',
        f'<soapenv:Envelope xmlns:soapenv="{SOAP_ENV_NS}"'
        ' xmlns:xsd="http://www.w3.org/2001/XMLSchema"'
        f' xmlns:xsi="{XSI_NS}">',
        "<soapenv:Body>",
        f'<notifications xmlns="{OUTBOUND_NS}">',
        f"<OrganizationId>{_xml_value(organization_id, 'organization_id')}</OrganizationId>",
        f"<ActionId>{_xml_value(action_id, 'action_id')}</ActionId>",
        session,
        f"<EnterpriseUrl>{_xml_value(enterprise_url, 'enterprise_url')}</EnterpriseUrl>",
        f"<PartnerUrl>{_xml_value(partner_url, 'partner_url')}</PartnerUrl>",
    ]
    for notification_id, sobject_type, fields in notifications:
        if not _XML_NAME_RE.fullmatch(sobject_type):
            raise ValueError(f"bad sObject type {sobject_type!r}")
        if not fields.get("Id"):
            raise ValueError("every notification's fields must hold an Id")
        parts.append(f"<Notification><Id>{_xml_value(notification_id, 'notification_id')}</Id>")
        parts.append(f'<sObject xsi:type="sf:{sobject_type}" xmlns:sf="{SOBJECT_NS}">')
        ordered = ["Id", *(name for name in fields if name != "Id")]
        for name in ordered:
            if not _XML_NAME_RE.fullmatch(name):
                raise ValueError(f"bad field name {name!r}")
            value = fields[name]
            if value is None:
                parts.append(f'<sf:{name} xsi:nil="true"/>')
            else:
                parts.append(f"<sf:{name}>{_xml_value(value, name)}</sf:{name}>")
        parts.append("</sObject></Notification>")
    parts.append("</notifications></soapenv:Body></soapenv:Envelope>")
    return "".join(parts).encode("utf-8")
