"""`connector explain`: decisions recorded when made, checked field by field, end to end
(Outbound Messages over real HTTP, the Salesforce sandbox, the real dispatcher)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from sqlalchemy import Engine

from connector.intake.receivers import create_app
from connector.intake.soap import OUTBOUND_MESSAGE_HEADERS, build_outbound_message
from connector.routing.assign import Lead, Router
from connector.shell.adapters import Adapters, adapter_for
from connector.shell.explain import build_explanation, format_explanation, load_explanation
from connector.shell.retention import purge
from connector.shell.service import serve_in_thread
from connector.writeback.dispatch import Dispatcher
from crm_sandboxes import SalesforceSandbox
from testbed.crm_orgs import OUTBOUND_SECRET, SF_ORG_ID
from tests.helpers.reassign_orgs import ReOrg

SOAP_HEADERS = OUTBOUND_MESSAGE_HEADERS


def push(engine: Engine, org: ReOrg, notes: list[tuple[str, str]]) -> None:
    """Send one Outbound Message (notification id, record id) and let the inbox route it."""
    adapters = Adapters({"acme": org.cfg})
    app = create_app(engine, {"acme": org.cfg}, adapters=adapters.get)
    body = build_outbound_message(SF_ORG_ID, [(n, "Lead", {"Id": rid}) for n, rid in notes])
    with serve_in_thread(app) as base, httpx.Client(base_url=base, timeout=10) as client:
        r = client.post(
            f"/webhooks/salesforce/acme/{OUTBOUND_SECRET}", content=body, headers=SOAP_HEADERS
        )
        assert r.status_code == 200
    app.state.inbox_worker.drain()


def dispatch(engine: Engine, org: ReOrg) -> None:
    d = Dispatcher(engine, "acme", adapter_for(org.cfg), intake_owner_ids=[org.intake])
    d.drain(timeout=30)


def test_explain_rule_miss_inactive_rep_and_repeat_push(
    engine: Engine, sf: SalesforceSandbox
) -> None:
    org = ReOrg(sf, engine)
    de, ca = org.lead("DE"), org.lead("CA")
    push(engine, org, [("04l000000000001AAA", ca)])
    push(engine, org, [("04l000000000002AAA", ca), ("04l000000000003AAA", de)])  # ca repeats
    e = load_explanation(engine, org.cfg, ca)
    assert (e["crm_id"], e["crm_object"], e["arrival"]["source"]) == (
        ca,
        "Lead",
        "salesforce_outbound",
    )
    events = [(ev["event_key"], ev["state"], ev["note"]) for ev in e["arrival"]["events"]]
    assert events == [
        (f"04l000000000001AAA:{ca}", "done", None),  # notification id : record id
        (f"04l000000000002AAA:{ca}", "done", "already routed"),
    ]
    [d] = e["decisions"]
    assert (d["kind"], d["source"], d["outcome"], d["team"], d["epoch"]) == (
        "route",
        "salesforce_outbound",
        "assigned",
        "na",
        1,
    )
    assert d["rules"] == [
        {
            "index": 0,
            "name": "north america",
            "team": "na",
            "matched": True,
            "checks": [{"field": "Country", "allowed": ["ca", "us"], "ok": True}],
        }
    ]
    assert d["values"] == {"Country": "CA"}
    cands = [(c["name"], c["weight"], c["count"], c["skip"]) for c in d["candidates"]]
    assert cands == [
        ("Ada", 1, 0, None),
        ("Alan", 1, 0, None),
        ("Grace", 1, 0, None),
        ("Edsger", 1, 0, "inactive"),
    ]
    ch = d["chosen"]
    assert (ch["name"], ch["crm_user_id"], ch["count_before"], ch["team_total_before"]) == (
        "Ada",
        org.user["Ada"],
        0,
        0,
    )
    assert (ch["weight"], ch["total_weight"], ch["share_before"], ch["share_after"]) == (
        1,
        3,
        0.0,
        0.3333,
    )
    assert e["owner"]["name"] == "Ada" and e["owner"]["reason"] == "routed"
    assert e["history"] == [] and [w["state"] for w in e["writes"]] == ["pending"]

    # the DE lead: the first rule missed (which field, which value), the second matched
    d2 = load_explanation(engine, org.cfg, de)["decisions"][0]
    assert [(r["name"], r["matched"], r["checks"]) for r in d2["rules"]] == [
        ("north america", False, [{"field": "Country", "allowed": ["ca", "us"], "ok": False}]),
        ("europe", True, [{"field": "Country", "allowed": ["de", "fr"], "ok": True}]),
    ]
    text_out = format_explanation(load_explanation(engine, org.cfg, de))
    assert (
        "  rule 0 \"north america\" -> team na: no match (Country: wanted ca|us, lead has 'DE')"
        in text_out.splitlines()
    )
    lines = format_explanation(e).splitlines()
    assert lines[0] == f"lead {ca} (Lead, org acme)"
    assert d["at"] and f"  caps, hours and time off judged at {d['at']}" in lines
    first_at = e["arrival"]["events"][0]["received_at"]
    assert lines[2].endswith(f"04l000000000001AAA:{ca} received {first_at}, done")
    assert lines[3].endswith(", done: already routed (a repeat: nothing new was decided)")
    assert f"    - Edsger ({org.user['Edsger']}), weight 1, count 0: skipped (inactive)" in lines
    assert (
        f"  chosen: Ada ({org.user['Ada']}): count 0 -> 1, weighted share 0.00 -> 0.33 "
        "(weight 1 of 3; the team had handed out 0 leads this epoch)"
    ) in lines


def test_explain_no_rule_and_no_active_member(engine: Engine, sf: SalesforceSandbox) -> None:
    org = ReOrg(sf, engine)
    router = Router(engine, org.cfg)
    jp = org.lead("JP")
    router.assign(Lead(jp, {"Country": "JP"}), "poll")
    e = load_explanation(engine, org.cfg, jp)
    [d] = e["decisions"]
    assert (d["outcome"], d["reason"], d["source"]) == ("unassigned", "no_rule_matched", "poll")
    assert [r["matched"] for r in d["rules"]] == [False, False]
    assert e["owner"] is None and e["unassigned_reason"] == "no_rule_matched"
    assert e["writes"] == []
    lines = format_explanation(e).splitlines()
    assert "  unassigned: no_rule_matched" in lines
    assert "owner now: none (no_rule_matched)" in lines and "write-back: none" in lines

    # a team whose every member is inactive: each candidate with its reason
    yaml_text = org._yaml(False, edsger_active=False)
    cfg = org.parse(yaml_text.replace("name: Barbara}", "name: Barbara, active: false}"))
    from connector.routing.teams import apply_teams

    apply_teams(engine, cfg)
    fr = org.lead("FR")
    Router(engine, cfg).assign(Lead(fr, {"Country": "FR"}), "import")
    d = load_explanation(engine, cfg, fr)["decisions"][0]
    assert (d["outcome"], d["reason"], d["team"]) == ("unassigned", "no_active_member", "emea")
    assert [(c["name"], c["skip"]) for c in d["candidates"]] == [("Barbara", "inactive")]


def test_explain_superseded_and_dead_writes(engine: Engine, sf: SalesforceSandbox) -> None:
    org = ReOrg(sf, engine)
    router = Router(engine, org.cfg)
    moved, poisoned, fine = org.lead("US"), org.lead("US"), org.lead("US")
    router.assign_many([Lead(x, {"Country": "US"}) for x in (moved, poisoned, fine)], "poll")
    sf.person_edit(moved, org.person)  # a person takes it before our write
    sf.poison([poisoned])
    dispatch(engine, org)
    w = load_explanation(engine, org.cfg, moved)["writes"]
    assert [(x["state"], x["found_owner"], x["attempts"]) for x in w] == [
        ("superseded", org.person, 1)
    ]
    lines = format_explanation(load_explanation(engine, org.cfg, moved)).splitlines()
    assert lines[-1].startswith(
        f"  - write {w[0]['id']}: owner {org.user['Ada']}: superseded after 1 attempt(s), "
        f"found owner {org.person}: the CRM showed another owner"
    )
    dead = load_explanation(engine, org.cfg, poisoned)["writes"]
    assert [(x["state"], x["found_owner"], x["last_error"]) for x in dead] == [
        ("dead", None, "FIELD_CUSTOM_VALIDATION_EXCEPTION: Sandbox poison record")
    ]
    assert format_explanation(load_explanation(engine, org.cfg, poisoned)).endswith(
        ": dead after 1 attempt(s): FIELD_CUSTOM_VALIDATION_EXCEPTION: Sandbox poison record"
    )
    assert [x["state"] for x in load_explanation(engine, org.cfg, fine)["writes"]] == ["sent"]
    assert org.owner(fine) == org.user["Grace"]


def test_retention_removes_quoted_values(engine: Engine, sf: SalesforceSandbox) -> None:
    org = ReOrg(sf, engine)
    de = org.lead("DE")
    Router(engine, org.cfg).assign(Lead(de, {"Country": "DE"}), "poll")
    with engine.begin() as conn:
        from sqlalchemy import text

        conn.execute(text("UPDATE routing_decisions SET made_at = now() - interval '40 days'"))
    assert purge(engine, "acme", 30).decision_values_cleared == 1
    e = load_explanation(engine, org.cfg, de)
    assert "values" not in e["decisions"][0]
    assert "Country: wanted ca|us, value purged by retention" in format_explanation(e)


def test_build_explanation_is_pure() -> None:
    lead: dict[str, Any] = {
        "id": 7,
        "crm_id": "c1",
        "crm_object": "contacts",
        "source": "import",
        "received_at": None,
        "unassigned_reason": None,
    }
    e = build_explanation("o", lead, [], [], [], None, [], [])
    assert e["owner"] is None and e["decisions"] == [] and e["arrival"]["events"] == []
    assert format_explanation(e).splitlines() == [
        "lead c1 (contacts, org o)",
        "arrived: by import at None",
        "no routing decision recorded",
        "owner now: none (unassigned)",
        "write-back: none",
    ]


# A pick as written before migration 0014 (every candidate in full) and the same pick written
# compactly (parallel lists, names looked up when explained): explained the same.
FULL_DECISION: dict[str, Any] = {
    "source": "api",
    "rules": [],
    "values": {},
    "team": "na",
    "epoch": 2,
    "outcome": "assigned",
    "candidates": [
        {
            "member_id": 11,
            "crm_user_id": "005A",
            "name": "Ada",
            "weight": 2,
            "count": 4,
            "skip": None,
        },
        {
            "member_id": 12,
            "crm_user_id": "005B",
            "name": "Bob",
            "weight": 1,
            "count": 1,
            "skip": "capped",
        },
        {
            "member_id": 13,
            "crm_user_id": "005C",
            "name": "Cy",
            "weight": 1,
            "count": 2,
            "skip": None,
        },
        {
            "member_id": 14,
            "crm_user_id": "005D",
            "name": "Di",
            "weight": 1,
            "count": 0,
            "skip": "inactive",
        },
    ],
    "chosen": {
        "member_id": 13,
        "crm_user_id": "005C",
        "name": "Cy",
        "weight": 1,
        "total_weight": 3,
        "count_before": 2,
        "team_total_before": 6,
        "share_before": 2.0,
        "share_after": 2.3333,
    },
}
COMPACT_DECISION: dict[str, Any] = {
    "source": "api",
    "rules": [],
    "values": {},
    "team": "na",
    "epoch": 2,
    "outcome": "assigned",
    "seats": {
        "ids": [11, 12, 13, 14],
        "weights": [2, 1, 1, 1],
        "counts": [4, 1, 2, 0],
        "skips": [None, "capped", None, "inactive"],
    },
    "chosen_id": 13,
}
WHO = {11: ("005A", "Ada"), 12: ("005B", "Bob"), 13: ("005C", "Cy"), 14: ("005D", "Di")}


@pytest.mark.parametrize("detail", [FULL_DECISION, COMPACT_DECISION], ids=["full", "compact"])
def test_old_full_and_compact_decisions_explain_the_same(detail: dict[str, Any]) -> None:
    lead: dict[str, Any] = {
        "id": 7,
        "crm_id": "c1",
        "crm_object": "Lead",
        "source": "api",
        "received_at": None,
        "unassigned_reason": None,
    }
    decision = {"kind": "route", "made_at": None, "detail": detail}
    e = build_explanation("o", lead, [], [], [decision], None, [], [], WHO)
    [d] = e["decisions"]
    assert "seats" not in d and "chosen_id" not in d
    assert d["candidates"] == FULL_DECISION["candidates"]
    assert d["chosen"] == FULL_DECISION["chosen"]
    text_ = format_explanation(e)
    assert "    - Bob (005B), weight 1, count 1: skipped (capped)" in text_
    assert "  chosen: Cy (005C): count 2 -> 3, weighted share 2.00 -> 2.33" in text_
