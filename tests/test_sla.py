"""SLA re-route, end to end: the poll routes leads from the Salesforce sandbox, the dispatcher
writes the owners, and the poll's SLA step reads the due leads back and re-routes, once, only
those still with our owner and still in their initial status."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Engine, text

from connector.core.config import ConfigError, Sla
from connector.intake.poller import Poller
from connector.routing.sla import sla_verdict
from connector.shell.adapters import adapter_for
from connector.shell.explain import format_explanation, load_explanation
from connector.writeback.dispatch import Dispatcher
from crm_adapters.base import CrmRecord
from crm_sandboxes import SalesforceSandbox
from tests.helpers.reassign_orgs import SLA, ReOrg, counts, current_owner

OPEN = "Open - Not Contacted"


def dispatch(engine: Engine, org: ReOrg) -> None:
    Dispatcher(engine, "acme", adapter_for(org.cfg), intake_owner_ids=[org.intake]).drain(30)


def history(engine: Engine, crm_id: str) -> list[tuple[str, str]]:
    with engine.connect() as conn:
        return [
            (r.reason, r.ended_reason)
            for r in conn.execute(
                text(
                    "SELECT h.reason, h.ended_reason FROM assignment_history h "
                    "JOIN leads l ON l.id = h.lead_id WHERE l.crm_id = :c ORDER BY h.id"
                ),
                {"c": crm_id},
            )
        ]


def test_sla_reroutes_once_and_never_a_lead_a_person_moved(
    engine: Engine, sf: SalesforceSandbox
) -> None:
    org = ReOrg(sf, engine, sla=True)
    now = [datetime.now(UTC)]
    poller = Poller(engine, org.cfg, adapter_for(org.cfg), clock=lambda: now[0])
    idle, moved, worked = (org.lead("US", Status=OPEN) for _ in range(3))
    assert poller.poll_once().new == 3  # Ada, Alan, Grace (not yet due: nothing checked)
    dispatch(engine, org)
    late = org.lead("US", Status=OPEN)
    poller.poll_once()  # routed to Ada; its write stays unsent for now
    sf.person_edit(moved, org.person)  # a person gives it to someone else
    sf.person_set(worked, "Status", "Working - Contacted")  # the rep worked it

    now[0] += timedelta(minutes=31)
    r = poller.poll_once()
    assert (r.sla_rerouted, r.sla_closed) == (1, 2)  # `late` waits for its write
    assert current_owner(engine, idle) == "Alan"  # next other than Ada: Alan 1, Grace 1: order
    assert history(engine, idle) == [("routed", "sla_expired")]
    assert current_owner(engine, moved) == "Alan" and history(engine, moved) == []
    assert current_owner(engine, worked) == "Grace" and history(engine, worked) == []
    dispatch(engine, org)
    assert org.owner(idle) == org.user["Alan"]  # replaced the owner we had written
    assert org.owner(moved) == org.person  # never taken
    assert org.owner(late) == org.user["Ada"]

    e = load_explanation(engine, org.cfg, moved)
    assert [(d["kind"], d.get("outcome")) for d in e["decisions"]] == [
        ("route", "assigned"),
        ("sla", "owner_changed"),
    ]
    assert e["decisions"][1]["found_owner"] == org.person
    made_at = e["decisions"][1]["made_at"]
    assert (
        f"SLA check at {made_at}: owner_changed: a person set owner {org.person}; not taken"
        in format_explanation(e)
    )
    e = load_explanation(engine, org.cfg, idle)
    assert e["decisions"][0]["sla_minutes"] == 30
    assert (e["decisions"][1]["kind"], e["decisions"][1]["reason"]) == ("reassign", "sla_expired")
    assert e["owner"]["reason"] == "sla_expired" and e["owner"]["sla_due_at"] is None
    worked_decisions = load_explanation(engine, org.cfg, worked)["decisions"]
    assert worked_decisions[1]["outcome"] == "met"
    assert worked_decisions[1]["values"] == {"Status": "Working - Contacted"}

    # later rounds: `late` is now due with our owner in the CRM; `idle` is never re-routed
    # again, though it is still open and its new owner did nothing
    now[0] += timedelta(minutes=60)
    r = poller.poll_once()
    assert (r.sla_rerouted, r.sla_closed) == (1, 0)
    assert history(engine, late) == [("routed", "sla_expired")]
    now[0] += timedelta(minutes=60)
    r = poller.poll_once()
    assert (r.sla_rerouted, r.sla_closed) == (0, 0)
    assert history(engine, idle) == [("routed", "sla_expired")]
    # every re-route counted once for its receiver
    assert sum(counts(engine).values()) == 4 + 2


def test_sla_check_loses_to_a_concurrent_reassignment(
    engine: Engine, sf: SalesforceSandbox
) -> None:
    """The due list was read with owner Ada; a reassignment that commits before the SLA step
    acts wins, and the SLA step changes nothing (it expected Ada)."""
    from connector.routing.reassign import ReassignError, reassign_lead

    org = ReOrg(sf, engine, sla=True)
    lead = org.lead("US", Status=OPEN)
    Poller(engine, org.cfg, adapter_for(org.cfg)).poll_once()
    dispatch(engine, org)
    reassign_lead(engine, org.cfg, lead, to="Alan", reason="reassigned")
    with pytest.raises(ReassignError, match="was reassigned meanwhile"):
        reassign_lead(engine, org.cfg, lead, reason="sla_expired", expect_owner=org.user["Ada"])
    assert history(engine, lead) == [("routed", "reassigned")]


def rec(owner: str | None, status: str | None) -> CrmRecord:
    return CrmRecord("r1", {"OwnerId": owner, "Status": status}, datetime.now(UTC))


SLA_SPEC = Sla(minutes=30, status_field="Status", initial=[OPEN, "New"])


@pytest.mark.parametrize(
    ("record", "write_open", "verdict"),
    [
        (None, False, "not_found"),
        (rec("005A", "open - not contacted "), False, "expired"),  # compared trimmed, any case
        (rec("005A", "NEW"), False, "expired"),
        (rec("005A", "Working"), False, "met"),
        (rec("005A", None), False, "met"),
        (rec("005P", OPEN), False, "owner_changed"),
        (rec("00GQ", OPEN), True, "wait"),  # an intake owner: our write is on its way
        (rec(None, OPEN), True, "wait"),
        (rec("00GQ", OPEN), False, "not_delivered"),
    ],
)
def test_sla_verdict(record: CrmRecord | None, write_open: bool, verdict: str) -> None:
    intake = frozenset({"00GQ"})
    got = sla_verdict(record, "OwnerId", "005A", SLA_SPEC, "hubspot", intake, write_open)
    assert got == verdict


@pytest.mark.parametrize(
    ("sla", "message"),
    [
        (
            "{minutes: 0, status_field: Status, initial: [New]}",
            "teams[0].sla.minutes: must be at least 1, not 0",
        ),
        (
            "{minutes: 5, status_field: 'Sta tus', initial: [New]}",
            "teams[0].sla.status_field: not a CRM field name (letters, digits and _ only)",
        ),
        (
            "{minutes: 5, status_field: Status, initial: []}",
            "teams[0].sla.initial: List should have at least 1 item after validation, not 0",
        ),
        ("{minutes: 5, status_field: Status}", "teams[0].sla.initial: missing; add `initial:`"),
        (
            "{minutes: 5, status_field: Status, initial: [New], hours: 1}",
            "teams[0].sla.hours: unknown key; write one of: initial, minutes, status_field",
        ),
    ],
)
def test_sla_config_errors(sla: str, message: str, engine: Engine, sf: SalesforceSandbox) -> None:
    org = ReOrg(sf, engine)
    with pytest.raises(ConfigError) as e:
        org.parse(org._yaml(True, False).replace(SLA, sla))
    where, said = str(e.value).split(": ", 1)
    assert re.fullmatch(r"acme\.yaml:\d+", where) is not None
    assert said == message
