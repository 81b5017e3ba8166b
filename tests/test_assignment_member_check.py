"""An assignment names a member that exists, checked against member_keys.

assignments_member_id_fkey references member_keys, a table of the members' ids that nothing
updates, instead of members, whose rows every batch updates (a held snapshot kept every
version, and the key's check of each assigned lead walked them all). On real Postgres:

* an insert or a move naming no member is refused with the key's error and stores nothing,
  whichever row of a statement it is;
* every member has its key, the ones a later config adds too;
* a member an assignment names cannot be deleted or given another id; one that no
  assignment names can, and its key goes with it;
* a delete of a member waits for an assignment in flight that names it, then fails;
* the check locks the key, not the member's row: an assignment is recorded while another
  transaction holds that row FOR UPDATE, where the key on members waited for it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import psycopg.errors
import pytest
from sqlalchemy import Connection, Engine, text

from connector.core.config import OrgConfig
from connector.core.config_loading import parse_config
from connector.core.errors import DatabaseError
from connector.routing.assign import Lead, Router
from connector.routing.teams import apply_teams
from tests.helpers.blocking import in_thread, wait_until_blocked
from tests.helpers.sample_org import SAMPLE_ENV, SAMPLE_YAML

KEY = "assignments_member_id_fkey"
MISSING = 999_999

INSERT = text(
    "INSERT INTO assignments (lead_id, org, team_id, member_id, crm_user_id, epoch,"
    " rule_index, rule_name, source)"
    " SELECT l, 'acme', (SELECT team_id FROM members WHERE id = :real), m, 'u', 0, 0, 'r', 'api'"
    " FROM unnest(CAST(:leads AS bigint[]), CAST(:members AS bigint[])) AS x (l, m)"
)


def _refused(error: BaseException) -> str:
    """The error's detail, after checking it is the foreign key's own."""
    assert isinstance(error, DatabaseError)
    assert (error.sqlstate, error.constraint) == ("23503", KEY)
    cause: BaseException | None = error
    while cause is not None and not isinstance(cause, psycopg.Error):
        cause = cause.__cause__
    assert isinstance(cause, psycopg.errors.ForeignKeyViolation)
    assert cause.diag.constraint_name == KEY
    assert cause.diag.message_detail is not None
    return cause.diag.message_detail


def _members(conn: Connection) -> dict[str, int]:
    rows = conn.execute(text("SELECT name, id FROM members ORDER BY id")).all()
    return {r.name: r.id for r in rows}


def _lead(conn: Connection, crm_id: str) -> int:
    return int(
        conn.execute(
            text(
                "INSERT INTO leads (org, crm_object, crm_id, fields, source)"
                " VALUES ('acme', 'Lead', :c, '{}', 'api') RETURNING id"
            ),
            {"c": crm_id},
        ).scalar_one()
    )


def _count(engine: Engine, sql: str) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text(sql)).scalar_one())


def test_an_insert_naming_no_member_is_refused_and_stores_nothing(
    engine: Engine, applied: OrgConfig
) -> None:
    with engine.connect() as conn:
        ada = _members(conn)["Ada Lovelace"]
    for members in ([MISSING], [ada, ada, MISSING, ada], [MISSING, ada]):
        with pytest.raises(DatabaseError) as exc, engine.begin() as conn:
            leads = [_lead(conn, f"00Q{i:015d}") for i in range(len(members))]
            conn.execute(INSERT, {"real": ada, "leads": leads, "members": members})
        assert _refused(exc.value) == (
            f'Key (member_id)=({MISSING}) is not present in table "member_keys".'
        )
        assert _count(engine, "SELECT count(*) FROM assignments") == 0
        assert _count(engine, "SELECT count(*) FROM leads") == 0
    # the same statement naming members that exist is stored, each row once
    with engine.begin() as conn:
        leads = [_lead(conn, f"00Q{i:015d}") for i in range(3)]
        conn.execute(INSERT, {"real": ada, "leads": leads, "members": [ada, ada, ada]})
    assert _count(engine, "SELECT count(*) FROM assignments") == 3


def test_moving_an_assignment_to_no_member_is_refused(engine: Engine, applied: OrgConfig) -> None:
    router = Router(engine, applied)
    (out,) = router.assign_many([Lead("00Q000000000000001", {"Country": "US"})], "api")
    assert out.status == "assigned"
    with engine.connect() as conn:
        before = conn.execute(text("SELECT member_id, sla_due_at FROM assignments")).one()
    with pytest.raises(DatabaseError) as exc, engine.begin() as conn:
        conn.execute(text("UPDATE assignments SET member_id = :m"), {"m": MISSING})
    assert _refused(exc.value) == (
        f'Key (member_id)=({MISSING}) is not present in table "member_keys".'
    )
    with engine.connect() as conn:
        assert conn.execute(text("SELECT member_id, sla_due_at FROM assignments")).one() == before


def test_every_member_has_its_key_those_a_later_config_adds_too(
    engine: Engine, applied: OrgConfig
) -> None:
    more = SAMPLE_YAML.replace(
        '      - {crm_user_id: "0055g00000AbCdIAAV", name: Barbara Liskov}\n',
        '      - {crm_user_id: "0055g00000AbCdIAAV", name: Barbara Liskov}\n'
        '      - {crm_user_id: "0055g00000AbCdJAAV", name: Frances Allen}\n',
    )
    cfg = parse_config(more, "acme.yaml", SAMPLE_ENV)
    apply_teams(engine, cfg)
    with engine.connect() as conn:
        members = _members(conn)
        keys = set(conn.execute(text("SELECT id FROM member_keys")).scalars())
    assert len(members) == 6 and keys == set(members.values())
    # the new rep takes leads: the rotation reaches her within one round of the team
    router = Router(engine, cfg)
    outs = router.assign_many([Lead(f"00Q00000000000000{i}", {}) for i in range(4)], "api")
    assert "Frances Allen" in {o.owner_name for o in outs}


def test_a_member_an_assignment_names_stays(engine: Engine, applied: OrgConfig) -> None:
    router = Router(engine, applied)
    (out,) = router.assign_many([Lead("00Q000000000000001", {"Country": "US"})], "api")
    assert out.status == "assigned"
    with engine.connect() as conn:
        named = conn.execute(text("SELECT member_id FROM assignments")).scalar_one()
        other = next(i for i in _members(conn).values() if i != named)
    for sql in ("DELETE FROM members WHERE id = :m", "UPDATE members SET id = -id WHERE id = :m"):
        with pytest.raises(DatabaseError) as exc, engine.begin() as conn:
            # its day and week counts go first (their own foreign key would refuse earlier)
            conn.execute(text("DELETE FROM member_load WHERE member_id = :m"), {"m": named})
            conn.execute(text(sql), {"m": named})
        assert _refused(exc.value) == (
            f'Key (id)=({named}) is still referenced from table "assignments".'
        )
        assert _count(engine, f"SELECT count(*) FROM members WHERE id = {named}") == 1
        assert _count(engine, f"SELECT count(*) FROM member_keys WHERE id = {named}") == 1
    with engine.begin() as conn:  # as under the key on members: one no assignment names can go
        assert conn.execute(text("DELETE FROM members WHERE id = :m"), {"m": other}).rowcount == 1
    assert _count(engine, f"SELECT count(*) FROM member_keys WHERE id = {other}") == 0


def _concurrently(
    engine: Engine, first: Callable[[Connection], None], second: Callable[[Connection], None],
    waits: str,
) -> list[BaseException]:  # fmt: skip
    """``first`` in an open transaction; ``second`` on another connection must wait for it
    (a session whose query is LIKE ``waits`` waits for a lock); then ``first`` commits.
    What ``second`` raised."""
    errors: list[BaseException] = []
    with engine.connect() as holder:
        first(holder)
        started = threading.Event()

        def run_second() -> None:
            with engine.begin() as conn:
                started.set()
                second(conn)

        thread = in_thread(run_second, errors)
        assert started.wait(30)
        wait_until_blocked(engine, waits)
        holder.commit()
        thread.join(30)
        assert not thread.is_alive()
    return errors


def test_a_delete_waits_for_an_assignment_in_flight_then_fails(
    engine: Engine, applied: OrgConfig
) -> None:
    with engine.connect() as conn:
        ada = _members(conn)["Ada Lovelace"]

    def assign(conn: Connection) -> None:
        conn.execute(INSERT, {"real": ada, "leads": [_lead(conn, "00Q1")], "members": [ada]})

    def delete(conn: Connection) -> None:
        conn.execute(text("DELETE FROM members WHERE id = :m"), {"m": ada})

    errors = _concurrently(engine, assign, delete, "DELETE FROM members%")
    assert len(errors) == 1
    assert _refused(errors[0]) == (
        f'Key (id)=({ada}) is still referenced from table "assignments".'
    )
    assert _count(engine, f"SELECT count(*) FROM members WHERE id = {ada}") == 1
    assert _count(engine, "SELECT count(*) FROM assignments") == 1


def test_the_check_locks_the_key_not_the_members_row(engine: Engine, applied: OrgConfig) -> None:
    """The check reads member_keys: it neither waits for a lock on the members row (as the
    key on members did: FOR KEY SHARE waits for FOR UPDATE) nor walks that row's versions."""
    with engine.connect() as conn:
        ada = _members(conn)["Ada Lovelace"]
    with engine.connect() as locker:
        locker.execute(text("SELECT FROM members WHERE id = :m FOR UPDATE"), {"m": ada})
        with engine.begin() as conn:
            conn.execute(text("SET LOCAL lock_timeout = '5s'"))
            leads = [_lead(conn, "00Q1"), _lead(conn, "00Q2")]
            conn.execute(INSERT, {"real": ada, "leads": leads, "members": [ada, ada]})
        locker.rollback()
    assert _count(engine, f"SELECT count(*) FROM assignments WHERE member_id = {ada}") == 2
