"""A Salesforce org on the sandbox for the reassignment, SLA and explain tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text

from connector.core.config import OrgConfig
from connector.core.config_loading import parse_config
from connector.routing.assign import Lead, Router
from connector.routing.teams import apply_teams
from crm_sandboxes import SalesforceSandbox
from testbed.crm_orgs import OUTBOUND_SECRET, SF_ORG_ID

SLA = '{minutes: 30, status_field: Status, initial: ["Open - Not Contacted"]}'


class ReOrg:
    """Team `na` (Ada, Alan, Grace; Edsger inactive) for US/CA, `emea` (Barbara) for DE/FR,
    no default rule; an intake user owns new records; a person owns some."""

    def __init__(self, sf: SalesforceSandbox, engine: Engine, sla: bool = False) -> None:
        self.sf, self.engine = sf, engine
        names = ["Ada", "Alan", "Grace", "Edsger", "Barbara"]
        self.user = {n: sf.add_user(n) for n in names}
        self.intake = sf.add_user("Lead intake")
        self.person = sf.add_user("A person")
        self.yaml = self._yaml(sla, edsger_active=False)
        self.cfg = self.parse(self.yaml)
        apply_teams(engine, self.cfg)

    def _yaml(self, sla: bool, edsger_active: bool, ada_active: bool = True) -> str:
        u = self.user
        return f"""
org: acme
crm:
  kind: salesforce
  instance_url: {self.sf.url}
  auth: {{method: client_credentials, client_id: "${{SF_ID}}", client_secret: "${{SF_SECRET}}"}}
  object: Lead
  organization_id: {SF_ORG_ID}
  outbound_secrets: ["${{SF_OUTBOUND}}"]
intake_owner_ids: ["{self.intake}"]
teams:
  - name: na
    members:
      - {{crm_user_id: "{u["Ada"]}", name: Ada, active: {str(ada_active).lower()}}}
      - {{crm_user_id: "{u["Alan"]}", name: Alan}}
      - {{crm_user_id: "{u["Grace"]}", name: Grace}}
      - {{crm_user_id: "{u["Edsger"]}", name: Edsger, active: {str(edsger_active).lower()}}}
{"    sla: " + SLA if sla else ""}
  - name: emea
    members:
      - {{crm_user_id: "{u["Barbara"]}", name: Barbara}}
rules:
  - {{name: north america, team: na, when: {{Country: [US, CA]}}}}
  - {{name: europe, team: emea, when: {{Country: [DE, FR]}}}}
"""

    def parse(self, yaml_text: str) -> OrgConfig:
        env = {
            "SF_ID": self.sf.client_id,
            "SF_SECRET": self.sf.client_secret,
            "SF_OUTBOUND": OUTBOUND_SECRET,
        }
        return parse_config(yaml_text, "acme.yaml", env)

    def lead(self, country: str, **fields: Any) -> str:
        return self.sf.add_record(
            "Lead", owner_id=self.intake, fields={"Country": country, **fields}
        )

    def owner(self, rid: str) -> str | None:
        rec = self.sf.get_record(rid)
        assert rec is not None
        owner: str | None = rec["OwnerId"]
        return owner

    def name_of(self, user_id: str) -> str:
        return next(n for n, u in self.user.items() if u == user_id)


def counts(engine: Engine) -> dict[str, int]:
    """Rotation counts by member name (team na and emea)."""
    with engine.connect() as conn:
        return dict(conn.execute(text("SELECT name, assigned_in_epoch FROM members")).all())


def current_owner(engine: Engine, crm_id: str) -> str:
    with engine.connect() as conn:
        return str(
            conn.execute(
                text(
                    "SELECT m.name FROM assignments a JOIN leads l ON l.id = a.lead_id "
                    "JOIN members m ON m.id = a.member_id WHERE l.crm_id = :c"
                ),
                {"c": crm_id},
            ).scalar_one()
        )


def outbox_rows(engine: Engine, crm_id: str) -> list[tuple[Any, ...]]:
    with engine.connect() as conn:
        return [
            tuple(r)
            for r in conn.execute(
                text(
                    "SELECT m.name, o.state, o.replaces_owners FROM outbox o "
                    "JOIN members m ON m.crm_user_id = o.owner_id "
                    "WHERE o.crm_id = :c ORDER BY o.id"
                ),
                {"c": crm_id},
            )
        ]


def table_counts(engine: Engine) -> dict[str, int]:
    tables = ("leads", "assignments", "assignment_history", "outbox", "routing_decisions")
    with engine.connect() as conn:
        return {t: conn.execute(text(f"SELECT count(*) FROM {t}")).scalar_one() for t in tables}


def route(engine: Engine, org: ReOrg, countries: list[str]) -> list[str]:
    ids = [org.lead(c) for c in countries]
    Router(engine, org.cfg).assign_many(
        [Lead(i, {"Country": c}) for i, c in zip(ids, countries, strict=True)], "poll"
    )
    return ids


def write_config(
    tmp_path: Path, org: ReOrg, yaml_text: str, db_url: str, mp_: pytest.MonkeyPatch
) -> Path:
    path = tmp_path / "acme.yaml"
    path.write_text(yaml_text, encoding="utf-8")
    mp_.setenv("DATABASE_URL", db_url)
    mp_.setenv("SF_ID", org.sf.client_id)
    mp_.setenv("SF_SECRET", org.sf.client_secret)
    mp_.setenv("SF_OUTBOUND", OUTBOUND_SECRET)
    mp_.setenv("CONNECTOR_CONFIG", str(path))
    return path
