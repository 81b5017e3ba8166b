"""Scenario 6: 1% poison records (the CRM rejects them permanently, every time).

Leads come in through `connector ingest` (the bulk path), then `connector dispatch --once`
writes the owners back through both real client libraries. Exactly the poison records end
dead, each with the CRM's reason; every healthy lead's owner reaches the CRM; and `connector
outbox list` shows them for an operator.
"""

from __future__ import annotations

import json
import random
import subprocess
from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from testbed.processes import Forked, finish
from tests.helpers.faults import (
    ROOT,
    TwoOrgs,
    assert_clean_logs,
    check_invariants,
    connector_env,
    lead_email,
    record_figures,
)

pytestmark = [
    pytest.mark.fault,
    pytest.mark.slow,
    pytest.mark.two_orgs(sf={"record_work_ms": 0.0}, hs={"limit_per_10s": 1000}),
]

SF_LEADS, HS_LEADS, POISON_SHARE = 1_000, 600, 0.01


def _connector(
    args: list[str], env: dict[str, str], log: Path, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """``connector ARGS`` forked from the fork server (testbed/processes.py), its stderr in
    ``log`` and its stdout returned."""
    out = log.with_suffix(".out")
    proc = Forked(["--log-level", "INFO", *args], env, out, ROOT, err=log)
    return finish(proc, out, log, timeout)


def test_exactly_the_poison_records_end_dead(
    engine: Engine, db_url: str, tmp_path: Path, two_orgs: TwoOrgs
) -> None:
    rng = random.Random(6)
    sf, hs, intake, config_dir = two_orgs.sf, two_orgs.hs, two_orgs.intake, two_orgs.config_dir
    sf_ids = [sf.add_record("Lead", owner_id=intake) for _ in range(SF_LEADS)]
    hs_ids = [hs.add_record("contacts") for _ in range(HS_LEADS)]
    poison = set(rng.sample(sf_ids, int(SF_LEADS * POISON_SHARE)))
    poison |= set(rng.sample(hs_ids, int(HS_LEADS * POISON_SHARE)))
    sf.poison([i for i in poison if i in set(sf_ids)])
    hs.poison([i for i in poison if i in set(hs_ids)])
    (tmp_path / "sf.jsonl").write_text(
        "".join(
            json.dumps({"Id": i, "Country": rng.choice(["US", "FR"]), "Email": lead_email(i)})
            + "\n"
            for i in sf_ids
        )
    )
    (tmp_path / "hs.jsonl").write_text(
        "".join(json.dumps({"id": i, "country": "Japan"}) + "\n" for i in hs_ids)
    )
    env = connector_env(db_url)
    cfg = ["--config", str(config_dir)]
    for org, f in (("demo-sf", "sf.jsonl"), ("demo-hs", "hs.jsonl")):
        r = _connector(
            [*cfg, "ingest", "--no-verify", "--org", org, str(tmp_path / f)],
            env,
            tmp_path / f"ingest-{org}.log",
        )
        assert r.returncode == 0, r
    r = _connector([*cfg, "dispatch", "--once", "--timeout", "60"], env, tmp_path / "dispatch.log")
    dispatch_out = r.stdout
    assert r.returncode == 0, (dispatch_out, (tmp_path / "dispatch.log").read_text()[-2000:])
    listing = _connector(
        [*cfg, "outbox", "list", "--org", "demo-sf"], env, tmp_path / "list.log"
    ).stdout

    with engine.connect() as conn:
        dead: dict[str, str] = {
            r.crm_id: r.last_error
            for r in conn.execute(
                text("SELECT crm_id, last_error FROM outbox WHERE state = 'dead'")
            )
        }
        sent = conn.execute(text("SELECT count(*) FROM outbox WHERE state = 'sent'")).scalar()
    inv = check_invariants(engine, sf, hs, skip_crm=poison)
    healthy_wrong = [i for i in inv.crm_mismatches if i not in poison]
    figures = {
        "leads": SF_LEADS + HS_LEADS,
        "poison": len(poison),
        "dead": len(dead),
        "sent": sent,
        "dead_reasons": sorted({v.split(":")[0] for v in dead.values()}),
        "healthy_crm_mismatches": len(healthy_wrong),
        "repeated_crm_record_writes": sf.writes.duplicates()[0] + hs.writes.duplicates()[0],
    }
    record_figures("poison", figures)
    assert set(dead) == poison, figures
    assert all(v for v in dead.values())
    assert {v.split(":")[0] for v in dead.values()} == {
        "FIELD_CUSTOM_VALIDATION_EXCEPTION",  # Salesforce's statusCode
        "VALIDATION_ERROR",  # HubSpot's category
    }
    assert all("poison" in v for v in dead.values())  # the CRM's own message is kept
    assert sent == SF_LEADS + HS_LEADS - len(poison)
    assert healthy_wrong == [] and inv.double_owners == 0 and inv.open_outbox == 0
    for p in poison:  # the CRM still has the intake owner (or none) on the poison records
        rec = sf.get_record(p)
        assert (rec or {}).get("OwnerId") in (None, intake)
    for i in (i for i in poison if i in set(sf_ids)):
        assert i in listing
    assert_clean_logs(sorted(tmp_path.glob("*.log")))
