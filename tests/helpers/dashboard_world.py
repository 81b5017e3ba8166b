"""A small routed world for the dashboard tests, built through the real paths: leads routed
by the Router and by the inbox worker (pushes read back from the Salesforce sandbox), owners
written by the dispatcher over HTTP, one record deleted in the CRM (a dead row) and one moved
by a person (a superseded row)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import Engine, text

from connector.core.config import OrgConfig
from connector.core.config_loading import parse_config
from connector.core.metrics import Metrics
from connector.intake.inbox import InboxWorker, store_events
from connector.routing.assign import Lead, Router
from connector.routing.teams import apply_teams
from connector.shell.adapters import Adapters, adapter_for
from connector.writeback.dispatch import Dispatcher
from crm_sandboxes import SalesforceSandbox

ORG = "dash"
YAML = """
org: dash
crm:
  kind: salesforce
  instance_url: {url}
  auth: {{method: client_credentials, client_id: "${{SF_ID}}", client_secret: "${{SF_SECRET}}"}}
  object: Lead
  outbound_secrets: ["${{SF_OUTBOUND}}"]
teams:
  - name: americas
    members:
      - {{crm_user_id: "{r0}", name: "Ada Lovelace", weight: 1}}
      - {{crm_user_id: "{r1}", name: "Alan Turing", weight: 2}}
      - {{crm_user_id: "{r2}", name: "Grace Hopper", weight: 1}}
  - name: emea
    members:
      - {{crm_user_id: "{r3}", name: "Edsger Dijkstra", weight: 1}}
rules:
  - {{team: emea, when: {{Country: [DE, FR]}}}}
  - {{team: americas}}
"""


@dataclass
class World:
    cfg: OrgConfig
    yaml: str
    env: dict[str, str]
    reps: list[str]
    lead_ids: dict[str, int]  # CRM id -> lead id
    dead_crm_id: str
    superseded_crm_id: str
    pushed_crm_id: str

    def write_config(self, folder: Path) -> Path:
        path = folder / f"{ORG}.yaml"
        path.write_text(self.yaml, encoding="utf-8")
        return path


def build_world(engine: Engine, sf: SalesforceSandbox) -> World:
    reps = [sf.add_user(f"Rep {i}") for i in range(4)]
    env = {"SF_ID": sf.client_id, "SF_SECRET": sf.client_secret, "SF_OUTBOUND": "o" * 32}
    yaml = YAML.format(url=sf.url, r0=reps[0], r1=reps[1], r2=reps[2], r3=reps[3])
    cfg = parse_config(yaml, f"{ORG}.yaml", env)
    apply_teams(engine, cfg)
    countries = ["US", "DE", "CA", "US", "FR", "US", "US", "CA", "US", "DE", "US", "US"]
    ids = [sf.add_record("Lead", fields={"Country": c}) for c in countries]
    Router(engine, cfg).assign_many(
        [Lead(i, {"Country": c}) for i, c in zip(ids, countries, strict=True)][:10], "import"
    )
    # The last two arrive as pushes: stored as hints, read back from the CRM, then routed.
    with engine.begin() as conn:
        store_events(conn, cfg, [f"04l{n:015d}" for n in (1, 2)], ids[10:])
    worker = InboxWorker(
        engine, {ORG: cfg}, {ORG: Router(engine, cfg)}, Adapters({ORG: cfg}).get, Metrics()
    )
    worker.drain()
    sf.delete_record(ids[2])
    sf.person_edit(ids[5], reps[3])
    Dispatcher(engine, ORG, adapter_for(cfg), intake_owner_ids=cfg.intake_owner_ids).drain(
        timeout=60
    )
    with engine.connect() as conn:
        lead_ids = {
            r.crm_id: r.id
            for r in conn.execute(text("SELECT id, crm_id FROM leads WHERE org = :o"), {"o": ORG})
        }
    return World(cfg, yaml, env, reps, lead_ids, ids[2], ids[5], ids[10])


def outbox_states(engine: Engine) -> dict[int, tuple[str, int]]:
    """Every outbox row: id -> (state, attempts): a refused request must change none."""
    with engine.connect() as conn:
        return {
            r.id: (r.state, r.attempts)
            for r in conn.execute(text("SELECT id, state, attempts FROM outbox ORDER BY id"))
        }


def dead_row(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT id FROM outbox WHERE state = 'dead'")).scalar_one())
