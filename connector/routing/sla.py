"""SLA re-route: what to do with a lead whose SLA time has come (pure, no I/O).

A lead routed by a rule or team with ``sla: {minutes, status_field, initial}`` is read back
from the CRM ``minutes`` after its assignment (by the poll). It is re-routed once, to the next
rep of its team, only when the CRM still shows the owner we assigned AND the status is still
one of ``initial``. Anything else ends the check, with the reason recorded: the rep worked it
(``met``), a person gave it to someone else (``owner_changed``: never taken back), the record
is gone (``not_found``), or our owner write never reached the CRM (``not_delivered``). While
our write is still on its way the check waits for the next poll (``wait``).
"""

from __future__ import annotations

from typing import Literal

from connector.core.config import Sla
from connector.core.ownership import is_unrouted, owner_key
from connector.routing.rules import _norm as norm
from crm_adapters.base import CrmRecord

Verdict = Literal["expired", "met", "owner_changed", "not_found", "not_delivered", "wait"]


def sla_verdict(
    record: CrmRecord | None,
    owner_field: str,
    assigned_owner: str,
    sla: Sla,
    kind: str,
    intake: frozenset[str],
    write_open: bool,
) -> Verdict:
    """Decide one due lead from the CRM's record (None: the CRM does not have it)."""
    if record is None:
        return "not_found"
    owner = record.fields.get(owner_field)
    owner_text = str(owner) if owner else None
    if not owner_text or owner_key(kind, owner_text) != owner_key(kind, assigned_owner):
        if is_unrouted(kind, owner_text, intake):
            return "wait" if write_open else "not_delivered"
        return "owner_changed"
    status = record.fields.get(sla.status_field)
    if status is not None and norm(status) in {norm(v) for v in sla.initial}:
        return "expired"
    return "met"
