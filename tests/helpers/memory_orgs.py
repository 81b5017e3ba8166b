"""An org routed in real Postgres whose CRM is the in-memory one (crm_adapters.memory): the
dispatcher's outcome matrix and the tests that reuse its org."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, text

from connector.core.config import OrgConfig
from connector.core.config_loading import parse_config
from connector.routing.assign import Lead, Router
from connector.routing.teams import apply_teams
from connector.writeback.dispatch import Dispatcher
from crm_adapters.memory import MemoryCrm

ORG = "mem"


def memory_config(crm: MemoryCrm, reps: list[str], intake: list[str]) -> OrgConfig:
    members = "\n".join(
        f'      - {{crm_user_id: "{r}", name: "Rep {i}"}}' for i, r in enumerate(reps)
    )
    if crm.kind == "salesforce":
        crm_yaml = """  kind: salesforce
  instance_url: https://mem.my.salesforce.com
  auth: {method: client_credentials, client_id: "${ID}", client_secret: "${SECRET}"}
  object: Contact
  outbound_secrets: ["${OM}"]"""
    else:
        crm_yaml = """  kind: hubspot
  base_url: https://api.hubapi.com
  auth: {access_token: "${SECRET}"}
  object: contacts
  webhook_secrets: ["${OM}"]
  portal_id: 1"""
    text_ = f"""
org: {ORG}
crm:
{crm_yaml}
intake_owner_ids: {intake}
teams:
  - name: ae
    members:
{members}
rules:
  - {{team: ae}}
"""
    env = {"ID": "id", "SECRET": "secret-value", "OM": "om-secret-0123456789abcdef"}
    return parse_config(text_, f"{ORG}.yaml", env)


@dataclass
class MemoryOrg:
    """An org routed in Postgres whose CRM is a MemoryCrm."""

    engine: Engine
    crm: MemoryCrm
    cfg: OrgConfig
    reps: list[str]
    intake: str

    def route(self, n: int, parents: list[str | None] | None = None) -> list[str]:
        """n new records owned by the intake user, assigned; parents cycle over `parents`."""
        cycle = parents or [None]
        ids = [self.crm.add_record(self.intake, cycle[i % len(cycle)]) for i in range(n)]
        leads = []
        for rid, i in zip(ids, range(n), strict=True):
            parent = cycle[i % len(cycle)]
            leads.append(Lead(rid, {"AccountId": parent} if parent else {}))
        Router(self.engine, self.cfg).assign_many(leads, "import")
        return ids

    def dispatcher(self, **kw: Any) -> Dispatcher:
        kw.setdefault("rng", lambda: 0.0)  # no jitter: retries are due at once
        return Dispatcher(
            self.engine, ORG, self.crm, intake_owner_ids=self.cfg.intake_owner_ids, **kw
        )

    def rows(self) -> dict[str, dict[str, Any]]:
        """crm_id -> the outbox row's state, attempts, last_error, found_owner, due_in_s."""
        with self.engine.connect() as conn:
            return {
                r.crm_id: dict(r._mapping)
                for r in conn.execute(
                    text(
                        "SELECT crm_id, state, attempts, last_error, found_owner, owner_id, "
                        "extract(epoch FROM available_at - now()) AS due_in_s "
                        "FROM outbox WHERE org = :o"
                    ),
                    {"o": ORG},
                )
            }

    def states(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.rows().values():
            out[r["state"]] = out.get(r["state"], 0) + 1
        return out

    def paused_for(self) -> float | None:
        with self.engine.connect() as conn:
            v = conn.execute(
                text("SELECT extract(epoch FROM until - now()) FROM org_pauses WHERE org = :o"),
                {"o": ORG},
            ).scalar()
        return None if v is None else float(v)


def memory_org(engine: Engine, kind: str = "salesforce", max_batch: int | None = None) -> MemoryOrg:
    crm = MemoryCrm(kind, max_batch=max_batch)
    reps = [crm.add_user() for _ in range(3)]
    intake = crm.add_user()
    cfg = memory_config(crm, reps, [intake])
    apply_teams(engine, cfg)
    return MemoryOrg(engine, crm, cfg, reps, intake)
