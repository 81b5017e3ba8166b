"""Scenario 7: a Hypothesis stateful test of the routing model, on the real PostgreSQL.

Random steps: ingest batches (with repeats inside and across batches), team edits (reps
added, removed, deactivated, reweighted), and crashes in the middle of an ingest (the
transaction rolled back after the assignment ran, or its connection killed before the
commit). After every step: at most one owner per lead and never a changed owner, exactly the
committed leads exist, every accepted lead is assigned (each team keeps an active rep) with
one outbox row, and every active rep is strictly within one lead of its weighted share of the
team's current epoch.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test
from sqlalchemy import Engine, text

from connector.core.config import OrgConfig
from connector.core.config_loading import parse_config
from connector.core.errors import DatabaseUnavailable
from connector.routing.assign import Lead, Router
from connector.routing.teams import apply_teams
from crm_adapters.salesforce_ids import to_18
from tests.helpers.faults import record_figures

pytestmark = [pytest.mark.fault, pytest.mark.slow]

USERS = [f"0055g00000Us{i:03d}AAB" for i in range(6)]
ENV = {"ID": "id", "SECRET": "secret"}
# Each run draws new examples (no fixed seed), so the runs together cover more than one does.
EXAMPLES, MAX_STEPS = 30, 30
STEPS = {"ingest": 0, "repeat": 0, "edit": 0, "crash": 0, "leads": 0, "epochs": 0}


def _config(teams: dict[str, list[tuple[str, int, bool]]]) -> OrgConfig:
    lines = []
    for name, members in sorted(teams.items()):
        lines.append(f"  - name: {name}\n    members:")
        for uid, weight, active in members:
            lines.append(
                f'      - {{crm_user_id: "{uid}", name: "R {uid[-6:-3]}", weight: {weight}, '
                f"active: {str(active).lower()}}}"
            )
    yaml = (
        "org: model\ncrm:\n  kind: salesforce\n  instance_url: https://x.my.salesforce.com\n"
        '  auth: {method: client_credentials, client_id: "${ID}", client_secret: "${SECRET}"}\n'
        "teams:\n" + "\n".join(lines) + "\nrules:\n"
        "  - {team: na, when: {Country: [US, CA]}}\n  - {team: row}\n"
    )
    return parse_config(yaml, "model.yaml", ENV)


member = st.tuples(st.sampled_from(USERS), st.integers(1, 3), st.booleans())
team_members = (
    st.lists(member, min_size=1, max_size=4, unique_by=lambda m: m[0]).filter(
        lambda ms: any(a for _, _, a in ms)
    )  # a team always keeps an active rep
)
# valid ids: the router stores a Salesforce id in its 18-character form
lead_ids = st.integers(0, 60).map(lambda i: to_18(f"00Q5g00000Ld{i:03d}"))
countries = st.sampled_from(["US", "CA", "DE", "FR", "us "])
batches = st.lists(st.tuples(lead_ids, countries), min_size=1, max_size=12)


class RoutingModel(RuleBasedStateMachine):
    engine: Engine  # set by make_machine

    def __init__(self) -> None:
        super().__init__()
        with self.engine.begin() as conn:
            conn.execute(
                text(
                    "TRUNCATE outbox, assignments, leads, members, teams, intake_events, "
                    "skipped_records RESTART IDENTITY CASCADE"
                )
            )
        self.teams = {
            "na": [(USERS[0], 1, True), (USERS[1], 2, True)],
            "row": [(USERS[2], 1, True), (USERS[3], 1, True), (USERS[4], 1, True)],
        }
        self.cfg = _config(self.teams)
        apply_teams(self.engine, self.cfg)
        self.owner: dict[str, str] = {}  # committed lead -> its owner, as first reported

    def _router(self) -> Router:
        return Router(self.engine, self.cfg)

    @rule(batch=batches)
    def ingest(self, batch: list[tuple[str, str]]) -> None:
        leads = [Lead(i, {"Country": c}) for i, c in batch]
        outcomes = self._router().assign_many(leads, "api")
        STEPS["ingest"] += 1
        for lead, o in zip(leads, outcomes, strict=True):
            assert o.crm_id == lead.crm_id
            if lead.crm_id in self.owner:
                assert o.status == "duplicate" and o.owner_id == self.owner[lead.crm_id]
            else:
                assert o.status == "assigned" and o.owner_id, o
                self.owner[lead.crm_id] = o.owner_id
                STEPS["leads"] += 1

    @rule(data=st.data())
    def repeat(self, data: st.DataObject) -> None:
        if not self.owner:
            return
        ids = data.draw(st.lists(st.sampled_from(sorted(self.owner)), min_size=1, max_size=5))
        country = data.draw(countries)  # the repeat may carry other fields: no re-route
        outcomes = self._router().assign_many([Lead(i, {"Country": country}) for i in ids], "api")
        STEPS["repeat"] += 1
        for i, o in zip(ids, outcomes, strict=True):
            assert o.status == "duplicate" and o.owner_id == self.owner[i], (i, o)

    @rule(na=team_members, row=team_members)
    def edit_teams(self, na: list[tuple[str, int, bool]], row: list[tuple[str, int, bool]]) -> None:
        self.teams = {"na": na, "row": row}
        self.cfg = _config(self.teams)
        STEPS["epochs"] += len(apply_teams(self.engine, self.cfg))
        STEPS["edit"] += 1

    @rule(batch=batches, how=st.sampled_from(["rollback", "connection_killed"]))
    def crash_mid_ingest(self, batch: list[tuple[str, str]], how: str) -> None:
        leads = [Lead(i, {"Country": c}) for i, c in batch]
        STEPS["crash"] += 1
        with self.engine.connect() as conn:
            trans = conn.begin()
            self._router().assign_in(conn, leads, "api")
            if how == "rollback":
                trans.rollback()
                return
            pid = conn.execute(text("SELECT pg_backend_pid()")).scalar_one()
            with self.engine.connect() as killer:
                killer.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
                killer.commit()
            with pytest.raises(DatabaseUnavailable) as lost:
                trans.commit()
            assert lost.value.connection_invalidated

    @invariant()
    def one_owner_each_and_only_committed_leads(self) -> None:
        with self.engine.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT l.crm_id, a.crm_user_id, "
                    "(SELECT count(*) FROM assignments x WHERE x.lead_id = l.id) AS n, "
                    "(SELECT count(*) FROM outbox o WHERE o.lead_id = l.id) AS boxes "
                    "FROM leads l LEFT JOIN assignments a ON a.lead_id = l.id"
                )
            ).all()
        assert {r.crm_id for r in rows} == set(self.owner)
        for r in rows:
            assert r.n == 1 and r.boxes == 1, r  # assigned, exactly once, one write-back
            assert r.crm_user_id == self.owner[r.crm_id], r  # an owner never changes

    @invariant()
    def fair_within_the_current_epoch(self) -> None:
        with self.engine.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT t.name, m.weight, m.assigned_in_epoch FROM members m "
                    "JOIN teams t ON t.id = m.team_id "
                    "WHERE m.active AND m.in_config AND t.in_config"
                )
            ).all()
        for team in ("na", "row"):
            seats = [(r.weight, r.assigned_in_epoch) for r in rows if r.name == team]
            total = sum(n for _, n in seats)
            weight = sum(w for w, _ in seats)
            for w, n in seats:
                assert abs(n - total * w / weight) < 1, (team, seats)


def make_machine(engine: Engine) -> type[RuleBasedStateMachine]:
    return type("BoundRoutingModel", (RoutingModel,), {"engine": engine})


def test_routing_model_holds_under_random_ingests_edits_and_crashes(engine: Engine) -> None:
    machine = make_machine(engine)
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=EXAMPLES,
            stateful_step_count=MAX_STEPS,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )
    record_figures("routing_model", {"examples": EXAMPLES, "max_steps": MAX_STEPS, **STEPS})
