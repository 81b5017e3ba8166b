"""The org every single-lead and batch routing test configures, and what a routing run
leaves behind in a form two runs (two databases, two paths) can be compared by."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Engine, text

from connector.routing.assign import Outcome

ENV = {"TOKEN": "unused"}
MONDAY = datetime(2026, 12, 7, 13, 0, tzinfo=UTC)
# every test config's org and CRM
HEADER = """
org: acme
crm:
  kind: salesforce
  instance_url: https://x.my.salesforce.com
  auth: {method: session, access_token: "${TOKEN}"}
"""


def decisions_by_lead(engine: Engine) -> list[tuple[str, dict[str, Any]]]:
    """Each lead's decision with member ids replaced by CRM user ids (two databases)."""
    with engine.connect() as c:
        users = dict(c.execute(text("SELECT id, crm_user_id FROM members")).all())
        rows = c.execute(
            text(
                "SELECT l.crm_id, d.detail FROM decision_details d JOIN leads l "
                "ON l.id = d.lead_id ORDER BY l.crm_id"
            )
        ).all()
        leads = dict(c.execute(text("SELECT id, crm_id FROM leads")).all())
    out = []
    for crm_id, detail in rows:
        # the lead's own id (a lead id is drawn even for an insert that conflicts or is
        # rolled back, so ids differ between paths that try the insert a different number
        # of times)
        if detail.get("batch") is not None:
            detail["batch"] = leads[detail["batch"]]
        if "seats" in detail:
            detail["seats"]["ids"] = [users[i] for i in detail["seats"]["ids"]]
        if detail.get("chosen_id") is not None:
            detail["chosen_id"] = users[detail["chosen_id"]]
        out.append((crm_id, detail))
    return out


def routing_state(engine: Engine) -> dict[str, Any]:
    with engine.connect() as c:

        def rows(sql: str) -> list[tuple[Any, ...]]:
            return [tuple(r) for r in c.execute(text(sql))]

        return {
            "members": rows(
                "SELECT crm_user_id, assigned_in_epoch, credited_in_epoch FROM members ORDER BY 1"
            ),
            "load": rows(
                "SELECT m.crm_user_id, l.period, l.starts_on, l.assigned FROM member_load l "
                "JOIN members m ON m.id = l.member_id ORDER BY 1, 2, 3"
            ),
            "assignments": rows(
                "SELECT l.crm_id, a.crm_user_id, a.rule_name, a.epoch, a.source, "
                "a.sla_due_at - a.assigned_at FROM assignments a JOIN leads l ON l.id = a.lead_id "
                "ORDER BY a.id"
            ),
            "outbox": rows("SELECT crm_id, owner_id, state FROM outbox ORDER BY id"),
            "leads": rows("SELECT crm_id, unassigned_reason, source FROM leads ORDER BY crm_id"),
        }


def outcome_row(o: Outcome, users: dict[int, str]) -> tuple[Any, ...]:
    cands = tuple((users[m], r) for m, r in o.candidates)
    return (o.crm_id, o.status, o.team, o.owner_id, o.owner_name, o.reason, cands)
