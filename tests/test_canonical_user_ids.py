"""One rep, one stored id: a Salesforce org's YAML may name its reps and intake owners by
their 15-character ids; loading it gives them their 18-character form, so members,
assignments, owner writes and time off hold that form, and either form names a rep on the
command line. A database whose tables hold 15-character rep ids is brought to the 18 by
migration 0030 and keeps every team's epoch and counts. HubSpot ids stay as written. Real
Postgres, the Salesforce sandbox over HTTP."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text

from connector.core.config import OrgConfig
from connector.core.config_loading import ConfigProblems, parse_config
from connector.core.metrics import Metrics
from connector.core.yaml_source import read_yaml
from connector.intake.inbox import InboxWorker, store_events
from connector.notify.settings import apply_notify_settings
from connector.routing.assign import Lead, Router
from connector.routing.reassign import reassign_lead
from connector.routing.teams import apply_teams, rotation_fingerprint
from connector.shell.adapters import adapter_for
from connector.shell.cli import main
from connector.shell.migrations import migrate, pending_migrations
from connector.shell.reps import configured_reps, set_away
from connector.writeback.dispatch import Dispatcher
from crm_adapters.salesforce_ids import to_18
from crm_sandboxes import SalesforceSandbox

ADA, ALAN, GRACE = (to_18(i) for i in ("0055g00000AdaLv", "0055g00000TurNg", "0055g00000HopPr"))
INTAKE = to_18("00G5g00000Queue")
ODD = 'rep "q"'  # no Salesforce id: kept as written
ENV = {"TOKEN": "unused", "SF_ID": "id", "SF_SECRET": "secret"}


def yaml_text(
    ids: dict[str, str], url: str = "https://acme.my.salesforce.com", auth: str = ""
) -> str:
    """A Salesforce org naming its reps and intake queue by ``ids`` (18 -> the form written)."""
    auth = auth or '{method: session, access_token: "${TOKEN}"}'
    return f"""
org: acme
crm:
  kind: salesforce
  instance_url: {url}
  auth: {auth}
  object: Lead
intake_owner_ids: ["{ids[INTAKE]}"]
teams:
  - name: na
    members:
      - {{crm_user_id: "{ids[ADA]}", name: Ada}}
      - {{crm_user_id: "{ids[ALAN]}", name: Alan, weight: 2}}
  - name: row
    members:
      - {{crm_user_id: "{ids[GRACE]}", name: Grace}}
      - {{crm_user_id: '{ODD}', name: Q}}
rules:
  - {{team: na, when: {{Country: US}}}}
  - {{team: row}}
notifications:
  email: {{host: 127.0.0.1, from: routing@acme.test}}
  rep_channels: [email]
  reps:
    - {{crm_user_id: "{ids[ADA]}", email: ada@acme.test}}
    - {{crm_user_id: "{ids[ALAN]}", email: alan@acme.test, opt_out: true}}
    - {{crm_user_id: "{ids[GRACE]}", email: grace@acme.test}}
    - {{crm_user_id: '{ODD}', email: q@acme.test}}
"""


SHORT = {i: i[:15] for i in (ADA, ALAN, GRACE, INTAKE)}
LONG = {i: i for i in (ADA, ALAN, GRACE, INTAKE)}

HUBSPOT = """
org: globex
crm:
  kind: hubspot
  auth: {access_token: "${TOKEN}"}
teams:
  - name: smb
    members:
      - {crm_user_id: "101", name: One}
      - {crm_user_id: "202", name: Two}
rules:
  - {team: smb}
"""


def as_previously_loaded(text_: str) -> OrgConfig:
    """The config as the release before this one loaded it: every id as written."""
    return OrgConfig.model_validate(read_yaml(text_.replace("${TOKEN}", "unused")).data)


def column(engine: Engine, sql: str) -> list[Any]:
    with engine.connect() as conn:
        return list(conn.execute(text(sql)).scalars())


def rows(engine: Engine, sql: str) -> list[tuple[Any, ...]]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(text(sql))]


def test_loading_gives_salesforce_ids_their_18_characters() -> None:
    cfg = parse_config(yaml_text(SHORT), "acme.yaml", ENV)
    assert [[m.crm_user_id for m in t.members] for t in cfg.teams] == [[ADA, ALAN], [GRACE, ODD]]
    assert cfg.intake_owner_ids == [INTAKE]
    assert cfg.notifications is not None
    assert [r.crm_user_id for r in cfg.notifications.reps] == [ADA, ALAN, GRACE, ODD]
    assert cfg.notifications.opted_out == [ALAN]
    # the reps' contacts are the members, whichever form either is written in
    assert [w for w in cfg.warnings() if w.loc[:1] == ("notifications",)] == []
    # one rotation whichever form the file writes
    same = parse_config(yaml_text(LONG), "acme.yaml", ENV)
    assert [rotation_fingerprint(t) for t in cfg.teams] == [
        rotation_fingerprint(t) for t in same.teams
    ]
    # an 18-character id whose letters were case-folded on the way: its suffix decides
    folded = (
        parse_config(yaml_text({**LONG, ADA: ADA.lower()}), "acme.yaml", ENV).teams[0].members[0]
    )
    assert folded.crm_user_id == ADA
    # one rep written in both forms is listed twice
    twice = yaml_text(SHORT).replace(f'"{ALAN[:15]}", name: Alan', f'"{ADA}", name: Alan', 1)
    with pytest.raises(ConfigProblems) as info:
        parse_config(twice, "acme.yaml", ENV)
    assert info.value.lines == [
        f"acme.yaml:13: teams[0].members[1].crm_user_id: `{ADA}` is listed twice "
        "(also members[0]); list each rep once"
    ]
    # HubSpot ids are numbers, and stay as written
    hubspot = parse_config(HUBSPOT, "globex.yaml", ENV)
    assert [m.crm_user_id for m in hubspot.teams[0].members] == ["101", "202"]


def sandbox_yaml(sf: SalesforceSandbox, ids: dict[str, str]) -> str:
    return yaml_text(
        ids,
        sf.url,
        '{method: client_credentials, client_id: "${SF_ID}", client_secret: "${SF_SECRET}"}',
    )


def sandbox_org(sf: SalesforceSandbox) -> tuple[str, str, str, str]:
    """The sandbox's users for the reps and the intake queue (18-character ids)."""
    return (sf.add_user("Ada"), sf.add_user("Alan"), sf.add_user("Grace"), sf.add_user("Intake"))


def test_a_yaml_with_15_character_ids_routes_and_stores_18(
    engine: Engine, sf: SalesforceSandbox
) -> None:
    ada, alan, grace, intake = sandbox_org(sf)
    env = {**ENV, "SF_ID": sf.client_id, "SF_SECRET": sf.client_secret}
    written = {ADA: ada[:15], ALAN: alan[:15], GRACE: grace[:15], INTAKE: intake[:15]}
    cfg = parse_config(sandbox_yaml(sf, written), "acme.yaml", env)
    apply_teams(engine, cfg)
    apply_notify_settings(engine, cfg)
    leads = [sf.add_record("Lead", owner_id=intake, fields={"Country": "US"}) for _ in range(3)]
    with engine.begin() as conn:
        store_events(conn, cfg, ["n1", "n2", "n3"], leads)
    router = Router(engine, cfg)
    worker = InboxWorker(
        engine, {"acme": cfg}, {"acme": router}, lambda _: adapter_for(cfg), Metrics()
    )
    assert worker.drain() == 3  # the intake queue named by 15 characters is the CRM's owner
    Dispatcher(engine, "acme", adapter_for(cfg), intake_owner_ids=cfg.intake_owner_ids).drain(
        timeout=60
    )
    records = [sf.get_record(r) or {} for r in leads]
    assert sorted(str(r.get("OwnerId")) for r in records) == sorted([ada, alan, alan])
    assert sorted(column(engine, "SELECT crm_user_id FROM members")) == sorted(
        [ada, alan, grace, ODD]
    )
    assert sorted(column(engine, "SELECT crm_user_id FROM assignments")) == sorted(
        [ada, alan, alan]
    )
    assert rows(engine, "SELECT DISTINCT state FROM outbox") == [("sent",)]
    assert sorted(column(engine, "SELECT owner_id FROM outbox")) == sorted([ada, alan, alan])
    assert column(engine, "SELECT recipient FROM notifications") == [ada]  # Alan opted out
    assert column(engine, "SELECT opted_out FROM notify_settings") == [[alan]]


def test_rep_away_and_reassign_to_take_either_form(
    engine: Engine,
    db_url: str,
    sf: SalesforceSandbox,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    ada, alan, grace, intake = sandbox_org(sf)
    written = {ADA: ada[:15], ALAN: alan[:15], GRACE: grace[:15], INTAKE: intake[:15]}
    path = tmp_path / "acme.yaml"
    path.write_text(sandbox_yaml(sf, written), encoding="utf-8")
    for name, value in {
        **ENV,
        "SF_ID": sf.client_id,
        "SF_SECRET": sf.client_secret,
        "DATABASE_URL": db_url,
        "CONNECTOR_CONFIG": str(path),
    }.items():
        monkeypatch.setenv(name, value)
    cfg = parse_config(path.read_text(encoding="utf-8"), str(path), ENV)
    apply_teams(engine, cfg)
    first = to_18("00Q5g00000Lead1")
    Router(engine, cfg).assign_many([Lead(first, {"Country": "US"})], "api")

    assert main(["rep", "away", grace[:15], "--until", "2099-01-01T00:00Z"]) == 0
    assert capsys.readouterr().out == f"Grace ({grace}) is away until 2099-01-01 00:00 UTC\n"
    assert column(engine, "SELECT crm_user_id FROM rep_time_off") == [grace]
    assert main(["rep", "back", grace]) == 0
    assert capsys.readouterr().out == f"Grace ({grace}) is back\n"
    assert main(["rep", "away", grace.lower(), "--until", "2099-01-01T00:00Z"]) == 0
    assert column(engine, "SELECT crm_user_id FROM rep_time_off") == [grace]
    assert main(["rep", "back", grace[:15]]) == 0
    assert column(engine, "SELECT crm_user_id FROM rep_time_off") == []
    capsys.readouterr()

    lead = f"(SELECT id FROM leads WHERE crm_id = '{first}')"
    (routed_to,) = column(engine, f"SELECT crm_user_id FROM assignments WHERE lead_id = {lead}")
    assert main(["reassign", "--org", "acme", "--to", grace[:15], first]) == 0
    assert main(["reassign", "--org", "acme", "--to", ada, first]) == 0
    assert capsys.readouterr().err == ""
    assert column(engine, f"SELECT crm_user_id FROM assignments WHERE lead_id = {lead}") == [ada]
    assert column(
        engine, f"SELECT crm_user_id FROM assignment_history WHERE lead_id = {lead} ORDER BY id"
    ) == [routed_to, grace]
    assert column(engine, f"SELECT owner_id FROM outbox WHERE lead_id = {lead} ORDER BY id") == [
        routed_to,
        grace,
        ada,
    ]


def stored_ids(engine: Engine) -> dict[str, list[Any]]:
    """Every stored rep id, per column."""
    return {
        "members": sorted(column(engine, "SELECT crm_user_id FROM members")),
        "assignments": sorted(column(engine, "SELECT crm_user_id FROM assignments")),
        "history": sorted(column(engine, "SELECT crm_user_id FROM assignment_history")),
        "outbox": sorted(column(engine, "SELECT owner_id FROM outbox")),
        "replaces": sorted(column(engine, "SELECT DISTINCT unnest(replaces_owners) FROM outbox")),
        "time_off": column(engine, "SELECT crm_user_id FROM rep_time_off ORDER BY 1"),
        "opted_out": column(engine, "SELECT opted_out FROM notify_settings"),
        "recipients": sorted(column(engine, "SELECT recipient FROM notifications")),
    }


def test_migration_0030_brings_stored_rep_ids_to_18_and_keeps_epochs_and_counts(
    engine: Engine,
) -> None:
    """A database the previous release filled from a YAML of 15-character ids (an edit made
    na's epoch 2), and a HubSpot org beside it: 0030 rewrites the ids and the fingerprints,
    and the same YAML loaded now is the same rotation."""
    legacy = as_previously_loaded(yaml_text(SHORT))
    apply_teams(engine, as_previously_loaded(yaml_text(SHORT).replace("weight: 2", "weight: 3")))
    apply_teams(engine, legacy)
    apply_notify_settings(engine, legacy)
    router = Router(engine, legacy)
    us = [Lead(to_18(f"00Q5g00000UsLd{i}"), {"Country": "US"}) for i in range(3)]
    fr = [Lead(to_18(f"00Q5g00000FrLd{i}"), {"Country": "FR"}) for i in range(2)]
    assert {o.owner_id for o in router.assign_many([*us, *fr], "api")} == {
        ADA[:15],
        ALAN[:15],
        GRACE[:15],
        ODD,
    }
    with engine.begin() as conn:  # its write went out: the reassignment replaces that owner
        conn.execute(
            text("UPDATE outbox SET state = 'sent', finished_at = now() WHERE crm_id = :id"),
            {"id": us[0].crm_id},
        )
    reassign_lead(engine, legacy, us[0].crm_id, to=GRACE[:15], reason="reassigned")
    grace = next(r for r in configured_reps(legacy) if r.name == "Grace")
    now = datetime.now(UTC)
    set_away(engine, legacy, grace, datetime(2099, 1, 1, tzinfo=UTC), None, now)
    (away,) = router.assign_many([Lead(to_18("00Q5g00000FrLd9"), {"Country": "FR"})], "api")
    assert away.owner_id == ODD  # Grace is away (the decision names her)
    hubspot = as_previously_loaded(HUBSPOT)
    apply_teams(engine, hubspot)
    Router(engine, hubspot).assign_many([Lead("9001", {}), Lead("9002", {})], "api")
    teams_before = rows(engine, "SELECT id, org, name, epoch FROM teams ORDER BY id")
    counts_before = rows(
        engine, "SELECT id, assigned_in_epoch, credited_in_epoch FROM members ORDER BY id"
    )
    assert ("na", 2) in {(r[2], r[3]) for r in teams_before}
    before = stored_ids(engine)
    decisions = "SELECT string_agg(detail::text, ' ') FROM routing_decisions"
    (recorded,) = column(engine, decisions)  # the away rep, the replaced owner, ...
    assert f'"{GRACE[:15]}"' in str(recorded)
    assert ADA[:15] in before["members"] and [GRACE[:15]] == before["time_off"]
    assert len(before["replaces"]) == 1 and before["replaces"][0] in (ADA[:15], ALAN[:15])
    with engine.begin() as conn:  # the database as 0029 left it: 0030 changes no table's shape
        conn.execute(text("DELETE FROM schema_migrations WHERE version = 30"))
    assert pending_migrations(engine) == [30]

    assert migrate(engine) == [30]

    long_of = {i[:15]: i for i in (ADA, ALAN, GRACE, INTAKE)}

    def canonical(ids: list[Any]) -> list[Any]:
        return sorted(long_of.get(i, i) for i in ids)

    after = stored_ids(engine)
    assert after == {
        k: [canonical(v[0])] if k == "opted_out" else canonical(v) for k, v in before.items()
    }
    assert {"101", "202", ODD} <= set(after["members"])  # HubSpot's and a non-id, as they were
    (recorded,) = column(engine, decisions)
    assert all(f'"{i[:15]}"' not in str(recorded) for i in (ADA, ALAN, GRACE))
    assert f'"{GRACE}"' in str(recorded)

    cfg = parse_config(yaml_text(SHORT), "acme.yaml", ENV)
    by_name = {t.name: rotation_fingerprint(t) for t in cfg.teams}
    assert dict(rows(engine, "SELECT name, fingerprint FROM teams WHERE org = 'acme'")) == by_name
    assert apply_teams(engine, cfg) == []
    assert apply_teams(engine, parse_config(HUBSPOT, "globex.yaml", ENV)) == []
    assert rows(engine, "SELECT id, org, name, epoch FROM teams ORDER BY id") == teams_before
    assert (
        rows(engine, "SELECT id, assigned_in_epoch, credited_in_epoch FROM members ORDER BY id")
        == counts_before
    )
    # the rotation goes on from its counts: Ada 1 and Alan 2 of weights 1 and 2 (us[0] was
    # moved to Grace after it counted), then three more
    more = [Lead(to_18(f"00Q5g00000UsMr{i}"), {"Country": "US"}) for i in range(3)]
    Router(engine, cfg).assign_many(more, "api")
    assert rows(
        engine,
        "SELECT m.crm_user_id, m.assigned_in_epoch FROM members m JOIN teams t ON t.id = m.team_id"
        " WHERE t.name = 'na' ORDER BY m.position",
    ) == [(ADA, 2), (ALAN, 4)]
    # Grace's time off, set by her 15 characters, still holds: the France lead goes to Q
    (fr_more,) = Router(engine, cfg).assign_many(
        [Lead(to_18("00Q5g00000FrMr1"), {"Country": "FR"})], "api"
    )
    assert fr_more.owner_id == ODD


def test_a_rep_whose_yaml_changed_form_keeps_its_counts(engine: Engine) -> None:
    """A team stored under Ada's 18 characters, then under her 15 (the YAML changed form:
    a new epoch, her 18-character row retired): the row in the config takes the 18
    characters and keeps her counts; the retired row takes the 15."""
    apply_teams(engine, as_previously_loaded(yaml_text(LONG)))
    legacy = as_previously_loaded(yaml_text({**LONG, ADA: ADA[:15]}))
    assert [c.team for c in apply_teams(engine, legacy)] == ["na"]
    Router(engine, legacy).assign_many(
        [Lead(to_18(f"00Q5g00000UsLd{i}"), {"Country": "US"}) for i in range(3)], "api"
    )
    members = "SELECT id, crm_user_id, in_config, assigned_in_epoch FROM members ORDER BY id"
    (retired, alan, *_), (configured,) = (
        rows(engine, members),
        rows(engine, f"SELECT id FROM members WHERE crm_user_id = '{ADA[:15]}'"),
    )
    assert retired[1:] == (ADA, False, 0) and alan[1] == ALAN
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM schema_migrations WHERE version = 30"))
    assert migrate(engine) == [30]
    assert apply_teams(engine, parse_config(yaml_text(LONG), "acme.yaml", ENV)) == []
    got = {r[0]: r[1:] for r in rows(engine, members)}
    assert got[retired[0]] == (ADA[:15], False, 0)
    assert got[configured[0]] == (ADA, True, 1)
    assert rows(engine, "SELECT epoch FROM teams WHERE name = 'na'") == [(2,)]
