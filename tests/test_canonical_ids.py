"""One record, one stored id: a Salesforce record named by its 15-character id (a report
export, an old inbox row) is stored in its 18-character form in every table, and a database
that holds the 15-character form is brought to the 18 by migration 0028. Real Postgres, the
Salesforce sandbox over HTTP, the real adapter."""

from __future__ import annotations

import json
from pathlib import Path

from sqlalchemy import Engine, text

from connector.core.metrics import Metrics
from connector.intake.importer import ingest_file
from connector.intake.inbox import InboxWorker, store_events
from connector.routing.assign import Router
from connector.routing.teams import apply_teams
from connector.shell.adapters import adapter_for
from connector.shell.migrations import migrate
from crm_adapters.salesforce_ids import canonical_15
from crm_sandboxes import SalesforceSandbox
from testbed.crm_orgs import salesforce_org


def rows(engine: Engine, sql: str) -> list[tuple[object, ...]]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(text(sql))]


def short(rid: str) -> str:
    id15 = canonical_15(rid)
    assert id15 is not None
    return id15


def test_reimport_by_15_character_id_keeps_one_row_per_record(
    engine: Engine, sf: SalesforceSandbox, tmp_path: Path
) -> None:
    reps = [sf.add_user(f"Rep {i}") for i in range(2)]
    intake, person = sf.add_user("Lead intake"), sf.add_user("A person")
    cfg = salesforce_org(sf, reps, org="acme", obj="Lead", intake=[intake])
    apply_teams(engine, cfg)
    free = [sf.add_record("Lead", owner_id=intake, fields={"Country": "US"}) for _ in range(2)]
    owned = [sf.add_record("Lead", owner_id=person, fields={"Country": "US"}) for _ in range(2)]
    router = Router(engine, cfg)
    for form in (short, lambda r: r, short):  # 15, then 18, then 15 characters again
        path = tmp_path / "leads.jsonl"
        path.write_text("".join(json.dumps({"Id": form(r)}) + "\n" for r in [*free, *owned]))
        ingest_file(router, path, "jsonl", "Id", adapter=adapter_for(cfg))
    assert sorted(
        rows(engine, "SELECT crm_id, reason, owner_found, times FROM skipped_records")
    ) == (sorted((r, "owned", person, 3) for r in owned))
    assert sorted(r for (r,) in rows(engine, "SELECT crm_id FROM leads")) == sorted(free)
    assert sorted(r for (r,) in rows(engine, "SELECT crm_id FROM outbox")) == sorted(free)


def test_an_inbox_row_with_a_15_character_id_is_judged_and_stored_in_18(
    engine: Engine, sf: SalesforceSandbox
) -> None:
    """An event stored before the receivers kept the 18-character form: its verdict is found
    (a skip, not "already routed") and the skip is stored under the 18 characters."""
    reps = [sf.add_user("Rep 0")]
    intake, person = sf.add_user("Lead intake"), sf.add_user("A person")
    cfg = salesforce_org(sf, reps, org="acme", obj="Lead", intake=[intake])
    apply_teams(engine, cfg)
    owned = sf.add_record("Lead", owner_id=person, fields={"Country": "US"})
    free = sf.add_record("Lead", owner_id=intake, fields={"Country": "US"})
    with engine.begin() as conn:
        store_events(conn, cfg, ["n1", "n2"], [short(owned), short(free)])
    worker = InboxWorker(
        engine, {"acme": cfg}, {"acme": Router(engine, cfg)}, lambda _: adapter_for(cfg), Metrics()
    )
    assert worker.drain() == 2
    assert rows(engine, "SELECT crm_id, reason, owner_found FROM skipped_records") == [
        (owned, "owned", person)
    ]
    assert sorted(rows(engine, "SELECT event_key, state, last_error FROM intake_events")) == [
        ("n1", "skipped", "owned"),
        ("n2", "done", None),
    ]
    assert rows(engine, "SELECT crm_id FROM leads") == [(free,)]


def test_migration_0028_brings_stored_15_character_ids_to_18(engine: Engine) -> None:
    a18, b18, owner18 = "00Q5g00000Lm001EAB", "00Q5g00000Lm002EAB", "0055g00000AbCdEAAV"
    a15, b15, owner15 = a18[:15], b18[:15], owner18[:15]
    hubspot = "123456789012345"  # a HubSpot id of 15 digits is no Salesforce id: unchanged
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO skipped_records (org, crm_object, crm_id, reason, owner_found, "
                "source, times) VALUES "
                "('acme', 'Lead', :a15, 'owned', :owner15, 'import', 1), "
                "('acme', 'Lead', :a18, 'owned', :owner18, 'import', 2), "
                "('acme', 'Lead', :b15, 'not_found', NULL, 'import', 1), "
                "('globex', 'contacts', :hs, 'owned', '77', 'import', 1)"
            ),
            {
                "a15": a15,
                "a18": a18,
                "b15": b15,
                "owner15": owner15,
                "owner18": owner18,
                "hs": hubspot,
            },
        )
        conn.execute(
            text(
                "INSERT INTO intake_events (org, source, event_key, crm_object, crm_id) VALUES "
                "('acme', 'salesforce_outbound', 'n1', 'Lead', :b15), "
                "('globex', 'hubspot_webhook', '1:2:3', 'contacts', :hs)"
            ),
            {"b15": b15, "hs": hubspot},
        )
        # the database as 0027 left it: 0028 not applied yet
        conn.execute(text("DELETE FROM schema_migrations WHERE version = 28"))
        conn.execute(text("DROP TABLE crm_budgets"))
    assert migrate(engine) == [28]
    assert sorted(
        rows(engine, "SELECT org, crm_id, reason, owner_found, times FROM skipped_records")
    ) == [
        ("acme", a18, "owned", owner18, 2),  # the row already under 18 characters is kept
        ("acme", b18, "not_found", None, 1),
        ("globex", hubspot, "owned", "77", 1),
    ]
    assert sorted(rows(engine, "SELECT org, crm_id FROM intake_events")) == [
        ("acme", b18),
        ("globex", hubspot),
    ]
