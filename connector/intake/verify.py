"""Is a record ours to route? The CRM's answer, decided by pure functions.

A push (Salesforce Outbound Message, HubSpot webhook) or a file row only names a record. Before
anything is routed the connector reads the record from the CRM with its own credentials, and
routes it only when the CRM says it exists, is the configured object, and has no owner or one
of the org's intake owners (the queue or integration user that owns new records). Everything
else is a skip with a reason, and no outbox row or rotation count is made for it. The rules
match on the fields of that read, never on what the message carried.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from connector.core.config import OrgConfig
from connector.core.crm_kinds import crm_kind
from connector.core.ownership import intake_keys, is_unrouted, owner_key
from connector.routing.assign import Lead, LeadError, validate_lead
from crm_adapters.base import CrmRecord

NOT_FOUND = "not_found"
WRONG_OBJECT = "wrong_object"
OWNED = "owned"
INVALID = "invalid_record"
SKIP_REASONS = (NOT_FOUND, WRONG_OBJECT, OWNED, INVALID)

# Salesforce ids start with their object's key prefix.


@dataclass(frozen=True)
class Verdict:
    """Route ``lead``, or skip the record for ``reason`` (``owner`` = the owner the CRM has)."""

    crm_id: str
    lead: Lead | None
    reason: str | None = None
    owner: str | None = None


def wrong_object(cfg: OrgConfig, crm_id: str) -> bool:
    """An id whose key prefix names another object (Salesforce; no CRM read needed)."""
    prefix = crm_kind(cfg.crm.kind).key_prefixes.get(cfg.crm_object)
    return prefix is not None and not crm_id.startswith(prefix)


def routing_fields(record: CrmRecord, wanted: Iterable[str], owner_field: str) -> dict[str, str]:
    """The record's fields under the names the config uses (CRMs answer field names in their
    own case: a rule on ``country`` sees Salesforce's ``Country``); empty values dropped."""
    by_fold = {k.casefold(): v for k, v in record.fields.items() if k != owner_field}
    out: dict[str, str] = {}
    for name in wanted:
        value = record.fields.get(name)
        if value is None:
            value = by_fold.get(name.casefold())
        if value is not None and value != "":
            out[name] = value
    return out


def judge(
    cfg: OrgConfig,
    crm_id: str,
    record: CrmRecord | None,
    owner_field: str,
    intake: frozenset[str] | None = None,
) -> Verdict:
    """One record's verdict from the CRM's answer (None: the read did not return it);
    ``intake`` is ``intake_keys(cfg)``, computed once per batch by callers that have one."""
    if record is None:
        return Verdict(crm_id, None, WRONG_OBJECT if wrong_object(cfg, crm_id) else NOT_FOUND)
    owner = record.fields.get(owner_field)
    if not is_unrouted(cfg.crm.kind, owner, intake_keys(cfg) if intake is None else intake):
        return Verdict(crm_id, None, OWNED, owner)
    try:
        lead = validate_lead(crm_id, routing_fields(record, cfg.read_fields, owner_field))
    except LeadError:
        return Verdict(crm_id, None, INVALID, owner)
    return Verdict(crm_id, lead, None, owner)


def judge_all(
    cfg: OrgConfig, crm_ids: Sequence[str], records: Sequence[CrmRecord], owner_field: str
) -> list[Verdict]:
    """Verdicts for ``crm_ids`` in order, from the records one batched read returned
    (matched by owner_key, so Salesforce's 15- and 18-character forms meet)."""
    kind = cfg.crm.kind
    found = {owner_key(kind, r.crm_id): r for r in records}
    intake = intake_keys(cfg)
    return [
        judge(cfg, cid, found.get(owner_key(kind, cid)), owner_field, intake) for cid in crm_ids
    ]


def readable_ids(cfg: OrgConfig, crm_ids: Iterable[str]) -> list[str]:
    """The ids worth a CRM read (unique, in order; another object's ids are skipped unread)."""
    return [i for i in dict.fromkeys(crm_ids) if not wrong_object(cfg, i)]


def skip_counts(verdicts: Iterable[Verdict]) -> Mapping[str, int]:
    out: dict[str, int] = {}
    for v in verdicts:
        if v.reason:
            out[v.reason] = out.get(v.reason, 0) + 1
    return out
