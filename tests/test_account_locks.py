"""Account-matched leads and the team locks: no deadlock between two batches.

Recording an assignment takes a FOR KEY SHARE lock on its team row (the foreign key check),
and that conflicts with the FOR UPDATE that serialises a team's rotation. A matched lead may
be recorded under another team than the one its batch rotates in, so recording matched leads
before the team locks (the naive order) lets two batches lock two teams in opposite orders.
The router records them in the same name-ordered pass as the team locks. The test stops
batch X right after it recorded its matched lead, lets batch Y run until Postgres says Y
waits for a lock, then lets X go on: the naive order deadlocks, the router's does not.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, text

from connector.core.config import OrgConfig
from connector.core.config_loading import parse_config
from connector.core.errors import Conflict, DatabaseError
from connector.intake.accounts_sync import account_rows, store_accounts
from connector.routing import accounts, batch
from connector.routing.assign import Lead, Outcome, Router
from connector.routing.teams import apply_teams
from crm_adapters.base import CrmAccount
from crm_adapters.salesforce_ids import to_18

A1, A2, B1, B2 = (to_18(f"005SB00000000{i:02d}") for i in range(1, 5))
YAML = f"""
org: acme
crm:
  kind: salesforce
  instance_url: https://acme.my.salesforce.com
  auth: {{method: session, access_token: "${{TOKEN}}"}}
  object: Lead
intake_owner_ids: ["00G000000000001"]
teams:
  - name: a
    members: [{{crm_user_id: "{A1}", name: A1}}, {{crm_user_id: "{A2}", name: A2}}]
  - name: b
    members: [{{crm_user_id: "{B1}", name: B1}}, {{crm_user_id: "{B2}", name: B2}}]
rules:
  - {{team: a, when: {{Country: A}}, route_to: account_owner}}
  - {{team: b, when: {{Country: B}}, route_to: account_owner}}
"""
# X: a lead of rule b whose account owner sits in team a, and one for team b's rotation.
BATCH_X = [
    Lead(to_18("00QSB0000000001"), {"Country": "B", "Email": "x@a-corp.com"}),
    Lead(to_18("00QSB0000000002"), {"Country": "B", "Email": "x@nobody-x.com"}),
]
# Y: the mirror image: owner in team b, rotation in team a.
BATCH_Y = [
    Lead(to_18("00QSB0000000003"), {"Country": "A", "Email": "y@b-corp.com"}),
    Lead(to_18("00QSB0000000004"), {"Country": "A", "Email": "y@nobody-y.com"}),
]


@pytest.fixture
def cfg(engine: Engine) -> OrgConfig:
    c = parse_config(YAML, "acme.yaml", {"TOKEN": "t"})
    apply_teams(engine, c)
    now = datetime.now(UTC)
    page = [
        CrmAccount(to_18("001SB0000000001"), A1, ("a-corp.com",), now),
        CrmAccount(to_18("001SB0000000002"), B1, ("b-corp.com",), now),
    ]
    with engine.begin() as conn:
        store_accounts(conn, c.org, account_rows("salesforce", page))
    return c


def _naive_match_accounts(original: Any) -> Any:
    """Record matched leads as soon as they are found, before any team lock."""

    def naive(b: batch.Batch, picked: Sequence[Any], first: Any) -> Any:
        matched, fallbacks = original(b, picked, first)
        for rows in matched.values():
            accounts.record_matched(b.conn, b.cfg, "api", rows)
        return {}, fallbacks

    return naive


def _waiting_for_a_lock(engine: Engine) -> bool:
    with engine.connect() as conn:
        n = conn.execute(
            text(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE datname = current_database() AND wait_event_type = 'Lock'"
            )
        ).scalar_one()
    return bool(n)


def _run_x_then_y(engine: Engine, cfg: OrgConfig, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """X records its matched lead and stops; Y runs until it waits for a lock; X goes on."""
    x_recorded, x_go = threading.Event(), threading.Event()
    original = accounts.record_matched

    def pausing(conn: Connection, c: OrgConfig, source: str, rows: Sequence[Any]) -> None:
        original(conn, c, source, rows)
        if rows and threading.current_thread().name == "X" and not x_recorded.is_set():
            x_recorded.set()
            assert x_go.wait(60), "the test never let batch X go on"

    monkeypatch.setattr(accounts, "record_matched", pausing)
    router = Router(engine, cfg)
    results: dict[str, Any] = {}

    def run(name: str, batch: list[Lead]) -> None:
        try:
            results[name] = router.assign_many(batch, "api")
        except DatabaseError as exc:
            results[name] = exc

    x = threading.Thread(target=run, args=("X", BATCH_X), name="X")
    y = threading.Thread(target=run, args=("Y", BATCH_Y), name="Y")
    x.start()
    assert x_recorded.wait(60)
    y.start()
    deadline = time.monotonic() + 60  # a bound, not a synchronisation: we wait for a state
    while not _waiting_for_a_lock(engine):
        assert time.monotonic() < deadline, "batch Y never waited for a lock"
        time.sleep(0.01)
    x_go.set()
    x.join(60)
    y.join(60)
    return [results["X"], results["Y"]]


def test_matched_and_rotated_batches_in_opposite_teams_do_not_deadlock(
    engine: Engine, cfg: OrgConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    out_x, out_y = _run_x_then_y(engine, cfg, monkeypatch)
    assert isinstance(out_x, list) and isinstance(out_y, list)
    assert (out_x[0].owner_id, out_x[0].team, out_x[0].account_id is not None) == (A1, "a", True)
    assert (out_y[0].owner_id, out_y[0].team, out_y[0].account_id is not None) == (B1, "b", True)
    assert out_x[1].team == "b" and out_y[1].team == "a"
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM assignments")).scalar_one() == 4
        assert conn.execute(text("SELECT count(*) FROM outbox")).scalar_one() == 4


def test_the_naive_order_deadlocks(
    engine: Engine, cfg: OrgConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(batch, "match_accounts", _naive_match_accounts(batch.match_accounts))
    outcomes = _run_x_then_y(engine, cfg, monkeypatch)
    errors = [o for o in outcomes if isinstance(o, DatabaseError)]
    assert len(errors) == 1
    assert isinstance(errors[0], Conflict) and errors[0].sqlstate == "40P01"  # deadlock


def test_an_account_lead_of_a_catch_up_team_is_recorded_under_its_lock(engine: Engine) -> None:
    """Catch-up reads a team's latest owners by assignment id, account owners' leads included,
    so a batch that only gives a catch-up team an account-matched lead takes the team's lock
    before it records the lead. Recorded without it, the insert draws its id at once and only
    then waits for the lock holder (the foreign key check): its id would come before the
    holder's assignments although it follows them, and the team's next pick, and
    `connector simulate`'s replay of it, would see a different order."""
    c = parse_config(
        YAML.replace("  - name: a\n", "  - name: a\n    catch_up: {max_in_a_row: 2}\n"),
        "acme.yaml",
        {"TOKEN": "t"},
    )
    apply_teams(engine, c)
    page = [CrmAccount(to_18("001SB0000000001"), A1, ("a-corp.com",), datetime.now(UTC))]
    with engine.begin() as conn:
        store_accounts(conn, c.org, account_rows("salesforce", page))
    router = Router(engine, c)
    done: list[Outcome] = []
    lead = Lead(to_18("00QSB0000000009"), {"Country": "A", "Email": "z@a-corp.com"})
    with engine.connect() as holder:
        holder.execute(text("SELECT id FROM teams WHERE name = 'a' FOR UPDATE"))
        t = threading.Thread(target=lambda: done.extend(router.assign_many([lead], "api")))
        t.start()
        deadline = time.monotonic() + 60  # a bound, not a synchronisation: we wait for a state
        while not _waiting_for_a_lock(engine):
            assert time.monotonic() < deadline, "the batch never waited for the team's lock"
            time.sleep(0.01)
        # the lock holder's own assignment would take this id, after the batch began waiting
        holders_id = holder.execute(text("SELECT nextval('assignments_id_seq')")).scalar_one()
        holder.commit()
    t.join(60)
    assert [(o.owner_id, o.team, o.account_id is not None) for o in done] == [(A1, "a", True)]
    with engine.connect() as conn:
        account_id = conn.execute(text("SELECT id FROM assignments")).scalar_one()
    assert account_id > holders_id
