"""`connector status` counts from indexes (db/status.sql); its numbers must stay those of the
plain join of leads and assignments it replaced, merged leads and account matches included."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, text

import db
from connector.core.config import OrgConfig
from connector.core.config_loading import parse_config
from connector.routing.assign import Lead, Router
from connector.routing.teams import apply_teams
from connector.shell.status import org_status
from tests.helpers.sample_org import SAMPLE_ENV, SAMPLE_YAML

# The queries status.sql had before it counted from indexes: the reference.
REFERENCE_LEADS = """
SELECT count(*) AS total, count(a.id) AS assigned
FROM leads l LEFT JOIN assignments a ON a.lead_id = l.id
WHERE l.org = :org AND l.merged_into IS NULL
"""
REFERENCE_MEMBERS = """
SELECT m.crm_user_id,
       (SELECT count(*) FROM assignments a JOIN leads l ON l.id = a.lead_id
        WHERE a.member_id = m.id AND l.merged_into IS NULL) AS assigned,
       (SELECT count(*) FROM assignments a JOIN leads l ON l.id = a.lead_id
        WHERE a.member_id = m.id AND l.merged_into IS NULL
          AND a.account_match->>'result' = 'matched') AS account_matched
FROM teams t JOIN members m ON m.team_id = t.id
WHERE t.org = :org AND t.in_config
"""
REFERENCE_OUTBOX = "SELECT state, count(*) AS n FROM outbox WHERE org = :org GROUP BY state"

MATCHED = '{"result": "matched", "account": "001000000000001AAA"}'
FALLBACK = '{"result": "fallback", "reason": "no_account"}'


def reference(engine: Engine, org: str) -> dict[str, Any]:
    with engine.connect() as conn:
        leads = conn.execute(text(REFERENCE_LEADS), {"org": org}).one()
        members = {
            r.crm_user_id: (r.assigned, r.account_matched)
            for r in conn.execute(text(REFERENCE_MEMBERS), {"org": org})
        }
        outbox = {r.state: r.n for r in conn.execute(text(REFERENCE_OUTBOX), {"org": org})}
    return {"leads": (leads.total, leads.assigned), "members": members, "outbox": outbox}


def shown(status: dict[str, Any]) -> dict[str, Any]:
    members = {
        m["crm_user_id"]: (m["assigned"], m["account_matched"])
        for t in status["teams"]
        for m in t["members"]
    }
    ob = status["outbox"]
    return {
        "leads": (status["leads"]["total"], status["leads"]["assigned"]),
        "members": members,
        "outbox": {
            "pending": ob["pending"],
            "sent": ob["sent"],
            "dead": ob["dead"],
            "superseded": ob["superseded"],
        },
    }


def with_account_matching(org: str) -> OrgConfig:
    """The sample config, its first rule sending leads to their account's owner."""
    rule = "  - {team: na_ae, when: {Country: [US, CA]}}"
    assert rule in SAMPLE_YAML
    yaml = SAMPLE_YAML.replace(rule, rule[:-1] + ", route_to: account_owner}")
    cfg = parse_config(yaml.replace("org: acme", f"org: {org}"), f"{org}.yaml", SAMPLE_ENV)
    assert cfg.account_matching
    return cfg


def merge_copy(engine: Engine, winner_crm_id: str, member: str | None, match: str | None) -> None:
    """A second lead of the same record pointing at its winner (as migration 0006 leaves
    one), with its own assignment to ``member`` when given."""
    with engine.begin() as conn:
        lead_id = conn.execute(
            text(
                "INSERT INTO leads (org, crm_object, crm_id, fields, source, merged_into) "
                "SELECT org, crm_object, crm_id, '{}', 'api', id FROM leads "
                "WHERE org = 'acme' AND crm_id = :crm_id AND merged_into IS NULL RETURNING id"
            ),
            {"crm_id": winner_crm_id},
        ).scalar_one()
        if member is None:
            return
        conn.execute(
            text(
                "INSERT INTO assignments (lead_id, org, team_id, member_id, crm_user_id, epoch, "
                "rule_index, rule_name, source, account_match) "
                "SELECT :lead_id, 'acme', m.team_id, m.id, m.crm_user_id, 1, 0, 'r', 'api', "
                "CAST(:match AS jsonb) FROM members m JOIN teams t ON t.id = m.team_id "
                "WHERE t.org = 'acme' AND m.crm_user_id = :member"
            ),
            {"lead_id": lead_id, "member": member, "match": match},
        )


def test_status_counts_equal_the_plain_join(engine: Engine) -> None:
    acme, globex = with_account_matching("acme"), with_account_matching("globex")
    for cfg in (acme, globex):
        apply_teams(engine, cfg)
    with engine.connect() as conn:
        ids = dict(conn.execute(text("SELECT DISTINCT name, crm_user_id FROM members")).all())
    ada, alan = ids["Ada Lovelace"], ids["Alan Turing"]
    grace, barbara = ids["Grace Hopper"], ids["Barbara Liskov"]
    acme_leads = [
        Lead(f"00Q5g00000Acme{i:02d}", {"Country": "US" if i % 2 else "DE"}) for i in range(14)
    ]
    Router(engine, acme).assign_many(acme_leads, "api")
    Router(engine, globex).assign_many(
        [Lead(f"00Q5g00000Glob{i:02d}", {"Country": "US"}) for i in range(5)], "api"
    )
    with engine.begin() as conn:
        # two of Ada's leads went to their account's owner, one fell back to the rotation
        conn.execute(
            text(
                "UPDATE assignments SET account_match = CAST(CASE WHEN rn <= 2 THEN :m ELSE :f "
                "END AS jsonb) FROM (SELECT a.id, row_number() OVER (ORDER BY a.id) AS rn "
                "FROM assignments a WHERE a.org = 'acme' AND a.crm_user_id = :ada) x "
                "WHERE assignments.id = x.id AND x.rn <= 3"
            ),
            {"m": MATCHED, "f": FALLBACK, "ada": ada},
        )
        # a lead stored but never assigned
        conn.execute(
            text(
                "INSERT INTO leads (org, crm_object, crm_id, fields, source, unassigned_reason) "
                "VALUES ('acme', 'Lead', '00Q5g00000Lone00AAA', '{}', 'api', 'no_rule')"
            )
        )
        conn.execute(text("UPDATE outbox SET state = 'sent', finished_at = now() WHERE id % 3 = 0"))
        conn.execute(text("UPDATE outbox SET state = 'dead' WHERE id % 7 = 1"))
        conn.execute(
            text(
                "UPDATE outbox SET state = 'claimed', claimed_by = 't', "
                "lease_until = now() + interval '1 minute' WHERE id % 5 = 2 AND state = 'pending'"
            )
        )
        conn.execute(
            text(
                "UPDATE outbox SET state = 'superseded', finished_at = now() "
                "WHERE id % 11 = 4 AND state = 'pending'"
            )
        )
    winners = {r: a for a, r in _owners(engine)}
    merge_copy(engine, winners[ada], ada, MATCHED)  # a matched copy: out of both counts
    merge_copy(engine, winners[ada], ada, None)
    merge_copy(engine, winners[alan], alan, FALLBACK)
    merge_copy(engine, winners[grace], None, None)  # a copy never assigned
    # Barbara leaves the config: her leads still count (she is shown, inactive)
    apply_teams(engine, acme.model_copy(update={"teams": _without(acme, barbara)}))

    status = org_status(engine, acme)
    expected = reference(engine, "acme")
    got = shown(status)
    assert got["leads"] == expected["leads"]
    assert got["members"] == expected["members"]
    # status shows claimed rows as pending (the CRM has not seen them either)
    plain_outbox = {**expected["outbox"]}
    plain_outbox["pending"] = plain_outbox.get("pending", 0) + plain_outbox.get("claimed", 0)
    assert got["outbox"] == {s: plain_outbox.get(s, 0) for s in got["outbox"]}
    # the cases above are all there (so the comparison can tell the two apart)
    assert got["leads"] == (15, 14)
    assert got["members"][ada][1] == 2 and got["members"][barbara][0] > 0
    every_state = ("pending", "claimed", "sent", "dead", "superseded")
    assert all(expected["outbox"].get(s) for s in every_state)
    # the dashboard's depth and the metrics' gauges count the same rows by state
    plain = {s: n for s, n in expected["outbox"].items() if s != "sent"}
    with engine.connect() as conn:
        depth = conn.execute(text(db.queries("dashboard")["outbox_depth"]), {"org": "acme"}).all()
        gauges = conn.execute(text(db.queries("metrics")["outbox_gauges"])).all()
    assert {r.state: r.n for r in depth} == plain
    assert {r.state: r.n for r in gauges if r.org == "acme"} == plain
    with engine.connect() as conn:
        merged_assigned = conn.execute(
            text(
                "SELECT count(*) FROM assignments a JOIN leads l ON l.id = a.lead_id "
                "WHERE l.merged_into IS NOT NULL"
            )
        ).scalar_one()
        all_assigned = conn.execute(
            text("SELECT count(*) FROM assignments WHERE org = 'acme'")
        ).scalar_one()
    assert merged_assigned == 3 and all_assigned == 17
    # the other org's numbers are its own
    assert shown(org_status(engine, globex))["leads"] == (5, 5)


def _owners(engine: Engine) -> list[tuple[str, str]]:
    """(crm_id, owner) of acme's assignments, oldest first."""
    with engine.connect() as conn:
        return [
            (r.crm_id, r.crm_user_id)
            for r in conn.execute(
                text(
                    "SELECT l.crm_id, a.crm_user_id FROM assignments a "
                    "JOIN leads l ON l.id = a.lead_id WHERE a.org = 'acme' ORDER BY a.id"
                )
            )
        ]


def _without(cfg: OrgConfig, crm_user_id: str) -> list[Any]:
    return [
        t.model_copy(update={"members": [m for m in t.members if m.crm_user_id != crm_user_id]})
        for t in cfg.teams
    ]


def test_the_inbox_gauge_counts_pending_and_claimed_events(engine: Engine) -> None:
    """metrics.sql reads claimed events through their lease index; the count is still that of
    `state IN ('pending', 'claimed')`."""
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO intake_events (org, source, event_key, crm_object, crm_id, state,"
                " claimed_by, lease_until)"
                " SELECT 'g', 'hubspot_webhook', 'e' || s, 'contacts', 'c' || s,"
                " (ARRAY['pending', 'claimed', 'done', 'skipped', 'dead'])[1 + s % 5],"
                " CASE WHEN s % 5 = 1 THEN 'w' END,"
                " CASE WHEN s % 5 = 1 THEN now() + interval '1 minute' END"
                " FROM generate_series(0, 49) AS s"
            )
        )
        gauges = conn.execute(text(db.queries("metrics")["inbox_gauges"])).all()
        plain = conn.execute(
            text("SELECT count(*) FROM intake_events WHERE state IN ('pending', 'claimed')")
        ).scalar_one()
    assert [(r.org, r.n) for r in gauges] == [("g", plain)] == [("g", 20)]
