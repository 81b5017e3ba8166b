"""Reassignment: history, rotation accounting, owner-safe write-back, exact refusals,
concurrent reassignment, rep deactivation with re-route. Real Postgres, the Salesforce sandbox
over real HTTP, the real dispatcher; the CLI in-process."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, text

from connector.routing.reassign import ReassignError, choose_rep, reassign_lead
from connector.routing.rotation import Seat, next_owners, pick_available
from connector.shell.adapters import adapter_for
from connector.shell.cli import main
from connector.shell.explain import format_explanation, load_explanation
from connector.shell.reps import resolve_rep, set_away
from connector.shell.store import make_engine
from connector.writeback.dispatch import Dispatcher, guard_writes
from crm_adapters.base import OwnerWrite
from crm_adapters.salesforce_ids import to_18
from crm_sandboxes import SalesforceSandbox
from testbed.crm_orgs import OUTBOUND_SECRET
from testbed.harness import worker_context
from tests.helpers.reassign_orgs import (
    ReOrg,
    counts,
    current_owner,
    outbox_rows,
    route,
    table_counts,
    write_config,
)


def dispatch(engine: Engine, org: ReOrg) -> None:
    Dispatcher(engine, "acme", adapter_for(org.cfg), intake_owner_ids=[org.intake]).drain(30)


# --- pure ----------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(
    reps=st.integers(min_value=2, max_value=6),
    ops=st.lists(st.integers(min_value=-1, max_value=40), min_size=1, max_size=80),
)
def test_rotate_accounting_keeps_fairness_among_reps_who_lost_nothing(
    reps: int, ops: list[int]
) -> None:
    """-1 = a new lead; n >= 0 = `--rotate` the n-th lead handed out so far (mod count), as
    the router decides it: the rotation's specification (``pick_available``, which
    tests/test_rotation_sql.py holds pick for pick to the server's ``rotation_picks``) with
    the current owner skipped as ``current_owner``. The receiver's count goes up by one, the
    loser's stays; the pick is never the current owner, and nobody is credited; with equal
    weights the reps that lost no lead stay within one of each other."""
    count = dict.fromkeys(range(reps), 0)
    owner_of: list[int] = []
    lost: set[int] = set()
    for op in ops:
        seats = [Seat(m, 1, count[m], m) for m in range(reps)]
        if op < 0 or not owner_of:
            m = next_owners(seats, sum(count.values()), 1)[0]
            owner_of.append(m)
        else:
            i = op % len(owner_of)
            old = owner_of[i]
            picks = pick_available(seats, {old: "current_owner"}, {}, 1)
            m = picks.turns[0].member_id  # type: ignore[assignment]
            assert m != old and picks.credited == {}
            assert count[m] == min(count[s] for s in count if s != old)  # fewest, others
            owner_of[i] = m
            lost.add(old)
        count[m] += 1
        keep = [count[r] for r in range(reps) if r not in lost]
        if keep:
            assert max(keep) - min(keep) <= 1
    assert sum(count.values()) == len(ops)


class _R:
    def __init__(
        self, id: int, team_id: int, team: str, crm_user_id: str, name: str, active: bool
    ) -> None:
        self.id, self.team_id, self.team = id, team_id, team
        self.crm_user_id, self.name, self.active = crm_user_id, name, active


def test_choose_rep_messages() -> None:
    with pytest.raises(ReassignError) as e:
        choose_rep([], "Zed", "acme", None)
    assert str(e.value) == "rep 'Zed' is not a member of org 'acme'"
    with pytest.raises(ReassignError) as e:
        choose_rep([_R(1, 1, "na", "005A", "Ed", False)], "Ed", "acme", None)
    assert str(e.value) == "rep 'Ed' is inactive in org 'acme'"
    two = [_R(1, 1, "na", "005A", "Sam", True), _R(2, 2, "emea", "005B", "Sam", True)]
    with pytest.raises(ReassignError) as e:
        choose_rep(two, "sam", "acme", None)
    assert (
        str(e.value)
        == "rep 'sam' names several reps of org 'acme' (005A, 005B): give the crm_user_id"
    )
    same = [_R(1, 1, "na", "005A", "Sam", True), _R(2, 2, "emea", "005A", "Sam", True)]
    assert choose_rep(same, "005A", "acme", 2).team == "emea"  # the lead's own team first


def test_guard_accepts_only_our_last_owner_or_intake() -> None:
    batch = [OwnerWrite(str(i), f"r{i}", "B") for i in range(4)]
    current = {"r0": "A", "r1": "P", "r2": "Q", "r3": None}
    replaces = {"0": frozenset({"A"}), "1": frozenset({"A"})}
    write, ours, superseded, missing = guard_writes(
        batch, current, "hubspot", frozenset({"Q"}), replaces
    )
    assert [w.key for w in write] == ["0", "2", "3"]
    assert superseded == [("1", "P")] and ours == [] and missing == []


# --- the database, the sandbox, the dispatcher ------------------------------------------------


def test_rotate_counts_history_and_supersede(engine: Engine, sf: SalesforceSandbox) -> None:
    org = ReOrg(sf, engine)
    leads = route(engine, org, ["US"] * 6)  # Ada, Alan, Grace, Ada, Alan, Grace
    assert counts(engine) == {"Ada": 2, "Alan": 2, "Grace": 2, "Edsger": 0, "Barbara": 0}
    m = reassign_lead(engine, org.cfg, leads[0], note="customer asked")
    # next rep among the others by the rotation: Alan (2) and Grace (2) tie, config order
    assert (m.old_owner, m.new_owner, m.reason, m.superseded) == (
        org.user["Ada"],
        org.user["Alan"],
        "rotated",
        1,
    )
    # the receiver's count goes up, the loser's does not go down
    assert counts(engine) == {"Ada": 2, "Alan": 3, "Grace": 2, "Edsger": 0, "Barbara": 0}
    assert current_owner(engine, leads[0]) == "Alan"
    assert outbox_rows(engine, leads[0]) == [("Ada", "superseded", []), ("Alan", "pending", [])]
    with engine.connect() as conn:
        hist = conn.execute(
            text("SELECT crm_user_id, reason, ended_reason FROM assignment_history")
        ).all()
        cur = conn.execute(
            text(
                "SELECT reason, note FROM assignments a JOIN leads l ON l.id = a.lead_id "
                "WHERE l.crm_id = :c"
            ),
            {"c": leads[0]},
        ).one()
    assert [tuple(h) for h in hist] == [(org.user["Ada"], "routed", "rotated")]
    assert tuple(cur) == ("rotated", "customer asked")
    # the next new lead goes to the rep with the fewest: Ada (2) before Grace (2) by order
    assert current_owner(engine, route(engine, org, ["US"])[0]) == "Ada"
    # the superseded write is never sent; the new one is
    dispatch(engine, org)
    assert org.owner(leads[0]) == org.user["Alan"]

    e = load_explanation(engine, org.cfg, leads[0])
    assert [d["kind"] for d in e["decisions"]] == ["route", "reassign"]
    r = e["decisions"][1]
    assert (r["reason"], r["mode"], r["note"], r["from"]["name"]) == (
        "rotated",
        "rotate",
        "customer asked",
        "Ada",
    )
    assert [(c["name"], c["count"], c["skip"]) for c in r["candidates"]] == [
        ("Ada", 2, "current_owner"),
        ("Alan", 2, None),
        ("Grace", 2, None),
        ("Edsger", 0, "inactive"),
    ]
    assert (r["chosen"]["name"], r["chosen"]["count_before"], r["superseded_writes"]) == (
        "Alan",
        2,
        1,
    )
    assert [(h["name"], h["reason"], h["ended_reason"]) for h in e["history"]] == [
        ("Ada", "routed", "rotated")
    ]
    assert [(w["owner_id"], w["state"]) for w in e["writes"]] == [
        (org.user["Ada"], "superseded"),
        (org.user["Alan"], "sent"),
    ]
    text_out = format_explanation(e)
    ada = org.user["Ada"]
    assert (
        f'reassigned at {r["made_at"]}: rotated (--rotate) from Ada ({ada}), note "customer asked"'
        in text_out
    )
    assert "earlier owners:" in text_out


def _away(engine: Engine, org: ReOrg, *names: str) -> None:
    now = datetime.now(UTC)
    for name in names:
        set_away(engine, org.cfg, resolve_rep(org.cfg, name), now + timedelta(days=1), None, now)


def _turns(engine: Engine) -> dict[str, tuple[int, int]]:
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT name, assigned_in_epoch, credited_in_epoch FROM members"))
        return {name: (assigned, credited) for name, assigned, credited in rows}


def test_rotate_is_the_routers_pick_with_its_credits(engine: Engine, sf: SalesforceSandbox) -> None:
    """--rotate is decided by the router (route_team), as a new lead would meet the rotation:
    Grace, away by command and behind her share, is passed over with a credited turn (a
    plain pick among the available reps other than the owner credits nobody), and Alan gets
    the lead and its caps' counters."""
    org = ReOrg(sf, engine)
    leads = route(engine, org, ["US"] * 5)  # Ada, Alan, Grace, Ada, Alan
    _away(engine, org, "Grace")
    m = reassign_lead(engine, org.cfg, leads[0])
    assert (org.name_of(m.old_owner), org.name_of(m.new_owner)) == ("Ada", "Alan")
    turns = _turns(engine)
    assert (turns["Ada"], turns["Alan"], turns["Grace"]) == ((2, 0), (3, 0), (1, 1))
    with engine.connect() as conn:
        load = conn.execute(
            text(
                "SELECT m.name, l.period, l.assigned FROM member_load l "
                "JOIN members m ON m.id = l.member_id ORDER BY 1, 2"
            )
        ).all()
    assert [tuple(r) for r in load] == [
        ("Ada", "day", 2),
        ("Ada", "week", 2),
        ("Alan", "day", 3),
        ("Alan", "week", 3),
        ("Grace", "day", 1),
        ("Grace", "week", 1),
    ]
    r = load_explanation(engine, org.cfg, leads[0])["decisions"][1]
    assert [(c["name"], c["count"], c["skip"]) for c in r["candidates"]] == [
        ("Ada", 2, "current_owner"),
        ("Alan", 2, None),
        ("Grace", 1, "away"),
        ("Edsger", 0, "inactive"),
    ]


def test_rotate_with_nobody_else_available_is_refused_and_nothing_moves(
    engine: Engine, sf: SalesforceSandbox
) -> None:
    org = ReOrg(sf, engine)
    leads = route(engine, org, ["US"] * 3)
    _away(engine, org, "Alan", "Grace")
    before = (table_counts(engine), _turns(engine))
    with pytest.raises(ReassignError) as exc:
        reassign_lead(engine, org.cfg, leads[0])
    assert str(exc.value) == (
        f"lead {leads[0]}: no other rep of team 'na' can take a lead now; nothing changed"
    )
    assert (table_counts(engine), _turns(engine)) == before
    assert current_owner(engine, leads[0]) == "Ada"


def test_reassign_after_sent_write_is_owner_safe(engine: Engine, sf: SalesforceSandbox) -> None:
    """A sent owner is replaced (the new write may replace exactly it); a record a person
    moved is never taken, and is then refused for reassignment."""
    org = ReOrg(sf, engine)
    [lead] = route(engine, org, ["US"])
    dispatch(engine, org)
    assert org.owner(lead) == org.user["Ada"]
    m = reassign_lead(engine, org.cfg, lead, to="Grace", reason="reassigned")
    assert m.replaces_owners == (org.user["Ada"],) and m.superseded == 0
    dispatch(engine, org)
    assert org.owner(lead) == org.user["Grace"]
    # a person moves it; a rotation then must not take it back
    sf.person_edit(lead, org.person)
    reassign_lead(engine, org.cfg, lead)
    dispatch(engine, org)
    assert org.owner(lead) == org.person
    assert outbox_rows(engine, lead)[-1][1] == "superseded"
    before = table_counts(engine)
    with pytest.raises(ReassignError) as e:
        reassign_lead(engine, org.cfg, lead, to="Ada", reason="reassigned")
    assert (
        str(e.value)
        == f"lead {lead}: a person set owner {org.person} in the CRM; not ours to reassign"
    )
    assert table_counts(engine) == before


def test_in_flight_write_is_carried(engine: Engine, sf: SalesforceSandbox) -> None:
    """A write claimed by a dispatcher when the lead is reassigned may still land: the new
    write may replace it, and the late result of the old claim is ignored."""
    org = ReOrg(sf, engine)
    [lead] = route(engine, org, ["US"])
    d = Dispatcher(engine, "acme", adapter_for(org.cfg), intake_owner_ids=[org.intake])
    claimed = d.claim("token-1")
    assert [c.owner_id for c in claimed] == [org.user["Ada"]]
    m = reassign_lead(engine, org.cfg, lead, to="Alan", reason="reassigned")
    assert m.replaces_owners == (org.user["Ada"],) and m.superseded == 1
    sf.person_edit(lead, org.user["Ada"])  # the old claim's write landed after all
    dispatch(engine, org)
    assert org.owner(lead) == org.user["Alan"]


BAD_REASON = "connector: --reason must be printable text of at most 500 characters\n"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--to", "Zed"], "connector: rep 'Zed' is not a member of org 'acme'\n"),
        (["--to", "Edsger"], "connector: rep 'Edsger' is inactive in org 'acme'\n"),
        (["--to", "Ada", "--reason", "x" * 501], BAD_REASON),
        (["--to", "Ada", "--reason", "a\x00b"], BAD_REASON),
        (["--rotate", "00Q\x01"], "connector: '00Q\\x01' is not a CRM id\n"),
    ],
)
def test_reassign_cli_refuses_bad_input_and_stores_nothing(
    engine: Engine,
    db_url: str,
    sf: SalesforceSandbox,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    message: str,
) -> None:
    org = ReOrg(sf, engine)
    leads = route(engine, org, ["US", "US"])
    write_config(tmp_path, org, org.yaml, db_url, monkeypatch)
    before, rotation = table_counts(engine), counts(engine)
    code = main(["reassign", "--org", "acme", *argv, *leads])
    out, err = capsys.readouterr()
    assert (code, out, err) == (2, "", message)
    assert table_counts(engine) == before and counts(engine) == rotation


def test_reassign_cli_reports_each_lead(
    engine: Engine,
    db_url: str,
    sf: SalesforceSandbox,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    org = ReOrg(sf, engine)
    us, jp = route(engine, org, ["US", "JP"])
    write_config(tmp_path, org, org.yaml, db_url, monkeypatch)
    unknown = "00QSB0000009999"  # 15 characters: reported in the stored 18-character form
    code = main(["reassign", "--org", "acme", "--to", "grace", us, jp, unknown, "--reason", "vip"])
    out, err = capsys.readouterr()
    assert code == 3
    ada, grace = org.user["Ada"], org.user["Grace"]
    assert out == f"lead {us}: {ada} -> {grace} (Grace, team na), 1 unsent write superseded\n"
    assert err.splitlines() == [
        f"connector: lead {jp} has no owner (no_rule_matched): nothing to reassign",
        f"connector: lead {to_18(unknown)} is not known to org 'acme'",
    ]
    code = main(["reassign", "--org", "acme", "--to", org.user["Grace"], us])
    assert (code, capsys.readouterr().err) == (
        3,
        f"connector: lead {us} is already owned by {grace}\n",
    )
    code = main(["explain", "--org", "acme", us])
    out = capsys.readouterr().out
    assert code == 0 and f'reassigned (--to) from Ada ({org.user["Ada"]}), note "vip"' in out
    assert main(["explain", "--org", "acme", "--json", us]) == 0
    e = json.loads(capsys.readouterr().out)
    assert [(d["kind"], d.get("reason")) for d in e["decisions"]] == [
        ("route", None),
        ("reassign", "reassigned"),
    ]
    assert (e["owner"]["name"], e["owner"]["note"], e["history"][0]["name"]) == (
        "Grace",
        "vip",
        "Ada",
    )
    assert main(["explain", "--org", "acme", unknown]) == 1
    assert (
        capsys.readouterr().err == f"connector: lead {to_18(unknown)} is not known to org 'acme'\n"
    )


# --- concurrency -----------------------------------------------------------------------------


def _worker(
    db_url: str,
    yaml_text: str,
    env: dict[str, str],
    lead: str,
    expect: str,
    naive: bool,
    barrier: Any,
    out: Any,
) -> None:
    from connector.core.config_loading import parse_config

    cfg = parse_config(yaml_text, "acme.yaml", env)
    engine = make_engine(db_url, pool_size=1)
    try:
        if naive:
            naive_reassign(engine, lead, expect, barrier)
        else:
            barrier.wait(timeout=60)
            reassign_lead(engine, cfg, lead, expect_owner=expect)
        out.put("ok")
    except ReassignError as exc:
        out.put(str(exc))
    except Exception as exc:  # the race's answer, not a 120-s wait for one that never comes
        out.put(f"error: {type(exc).__name__}: {exc}")
    finally:
        engine.dispose()


NAIVE_SQL = {
    "read": """SELECT a.id, a.lead_id, a.crm_user_id, a.team_id
               FROM assignments a JOIN leads l ON l.id = a.lead_id WHERE l.crm_id = :c""",
    "seats": """SELECT id, weight, assigned_in_epoch, position FROM members
                WHERE team_id = :t AND active AND crm_user_id <> :o ORDER BY position""",
    "history": """INSERT INTO assignment_history (assignment_id, lead_id, org, team_id, member_id,
                      crm_user_id, epoch, reason, assigned_at, ended_reason)
                  SELECT id, lead_id, org, team_id, member_id, crm_user_id, epoch, reason,
                         assigned_at, 'rotated'
                  FROM assignments WHERE id = :a""",
    "bump": "UPDATE members SET assigned_in_epoch = assigned_in_epoch + 1 WHERE id = :m",
    "move": """UPDATE assignments a SET member_id = m.id, crm_user_id = m.crm_user_id
               FROM members m WHERE a.id = :a AND m.id = :m""",
    "supersede": "UPDATE outbox SET state = 'superseded' WHERE lead_id = :l AND state = 'pending'",
    "write": """INSERT INTO outbox (org, lead_id, assignment_id, crm_object, crm_id, owner_id)
                SELECT org, lead_id, id, 'Lead', :c, crm_user_id FROM assignments WHERE id = :a""",
}


def naive_reassign(engine: Engine, lead: str, expect: str, barrier: Any) -> None:
    """Check-then-act without the row lock: read the owner, then move it (what a script
    reading the assignment and writing it back would do)."""
    q = {k: text(v) for k, v in NAIVE_SQL.items()}
    with engine.begin() as conn:
        cur = conn.execute(q["read"], {"c": lead}).one()
        barrier.wait(timeout=60)  # both have read the same owner
        if cur.crm_user_id != expect:
            raise ReassignError("reassigned meanwhile")
        seats = conn.execute(q["seats"], {"t": cur.team_id, "o": expect}).all()
        pick = next_owners(
            [Seat(s.id, s.weight, s.assigned_in_epoch, s.position) for s in seats],
            sum(s.assigned_in_epoch for s in seats),
            1,
        )[0]
        conn.execute(q["history"], {"a": cur.id})
        conn.execute(q["bump"], {"m": pick})
        conn.execute(q["move"], {"a": cur.id, "m": pick})
        conn.execute(q["supersede"], {"l": cur.lead_id})
        conn.execute(q["write"], {"a": cur.id, "c": lead})


COUNT_OWNERS = """SELECT count(*) FROM assignments a JOIN leads l ON l.id = a.lead_id
                  WHERE l.crm_id = :c"""
COUNT_UNSENT = "SELECT count(*) FROM outbox WHERE crm_id = :c AND state IN ('pending', 'claimed')"


def race(engine: Engine, db_url: str, org: ReOrg, naive: bool) -> tuple[list[str], list[str]]:
    """Two processes reassign the same lead at once, both expecting its current owner.
    Returns (answers, problems with the outcome)."""
    lead = route(engine, org, ["US"] * 3)[0]
    owner = org.user["Ada"]
    before = sum(counts(engine).values())
    ctx = worker_context()  # forked from the fork server: no interpreter start
    barrier, out = ctx.Barrier(2), ctx.Queue()
    env = {
        "SF_ID": org.sf.client_id,
        "SF_SECRET": org.sf.client_secret,
        "SF_OUTBOUND": OUTBOUND_SECRET,
    }
    procs = [
        ctx.Process(target=_worker, args=(db_url, org.yaml, env, lead, owner, naive, barrier, out))
        for _ in range(2)
    ]
    for p in procs:
        p.start()
    answers = sorted(out.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(60)
    problems = []
    with engine.connect() as conn:
        owners = conn.execute(text(COUNT_OWNERS), {"c": lead}).scalar_one()
        hist = conn.execute(text("SELECT count(*) FROM assignment_history")).scalar_one()
        unsent = conn.execute(text(COUNT_UNSENT), {"c": lead}).scalar_one()
    if answers.count("ok") != 1:
        problems.append(f"{answers.count('ok')} reassignments won")
    if owners != 1:
        problems.append(f"{owners} current owners")
    if hist != 1:
        problems.append(f"{hist} owners replaced")
    if unsent != 1:
        problems.append(f"{unsent} unsent writes")
    if sum(counts(engine).values()) != before + 1:
        problems.append("rotation counted the lead more than once")
    return answers, problems


def test_concurrent_reassign_one_wins(engine: Engine, db_url: str, sf: SalesforceSandbox) -> None:
    org = ReOrg(sf, engine)
    answers, problems = race(engine, db_url, org, naive=False)
    assert problems == []
    [lost] = [a for a in answers if a != "ok"]
    assert lost.endswith("was reassigned meanwhile (now " + lost.split("(now ")[1])
    assert "nothing changed" in lost


def test_concurrent_check_catches_the_naive_reassign(
    engine: Engine, db_url: str, sf: SalesforceSandbox
) -> None:
    org = ReOrg(sf, engine)
    answers, problems = race(engine, db_url, org, naive=True)
    assert answers == ["ok", "ok"]
    # (whether both new writes stay unsent depends on when the second one's statements run)
    assert {
        "2 reassignments won",
        "2 owners replaced",
        "rotation counted the lead more than once",
    } <= set(problems)


# --- rep deactivation --------------------------------------------------------------------------


def test_rep_deactivate_reroutes_unsent_leads(
    engine: Engine,
    db_url: str,
    sf: SalesforceSandbox,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    org = ReOrg(sf, engine)
    sent = route(engine, org, ["US"] * 3)  # Ada, Alan, Grace
    dispatch(engine, org)
    unsent = route(engine, org, ["US"] * 3)  # Ada, Alan, Grace, not written yet
    write_config(tmp_path, org, org.yaml, db_url, monkeypatch)
    code = main(["rep", "deactivate", "--org", "acme", "Ada", "--reroute"])
    out, _ = capsys.readouterr()
    assert code == 0
    assert out.splitlines() == [
        f"org acme: rep {org.user['Ada']} inactive in na (until a config that lists the rep "
        "as active is applied: set `active: false` in the YAML too)",
        f"org acme: lead {unsent[0]}: {org.user['Ada']} -> {org.user['Alan']} (rep_deactivated)",
        "org acme: 1 leads re-routed, 0 left",
    ]
    # a new epoch started for na (counts restart), then the re-route counted for Alan
    assert counts(engine) == {"Ada": 0, "Alan": 1, "Grace": 0, "Edsger": 0, "Barbara": 0}
    assert current_owner(engine, sent[0]) == "Ada"  # its write was sent: not moved
    assert outbox_rows(engine, unsent[0]) == [("Ada", "superseded", []), ("Alan", "pending", [])]
    dispatch(engine, org)
    assert org.owner(unsent[0]) == org.user["Alan"] and org.owner(sent[0]) == org.user["Ada"]
    assert current_owner(engine, route(engine, org, ["US"])[0]) == "Grace"  # Ada gets none
    before = table_counts(engine)
    assert main(["rep", "deactivate", "--org", "acme", "Nobody"]) == 2
    assert capsys.readouterr().err == "connector: rep 'Nobody' is not a member of org 'acme'\n"
    assert table_counts(engine) == before


def test_yaml_deactivation_with_migrate_reroute(
    engine: Engine,
    db_url: str,
    sf: SalesforceSandbox,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    org = ReOrg(sf, engine)
    leads = route(engine, org, ["US"] * 3)
    sf.poison([leads[1]])
    dispatch(engine, org)  # Ada's and Grace's sent, Alan's dead
    leads += route(engine, org, ["US"])  # Ada's second, pending
    yaml_text = org._yaml(False, False).replace(
        "name: Ada, active: true", "name: Ada, active: false"
    )
    yaml_text = yaml_text.replace("name: Alan}", "name: Alan, active: false}")
    write_config(tmp_path, org, yaml_text, db_url, monkeypatch)
    assert main(["migrate", "--reroute"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "org acme: 2 leads re-routed, 0 left"
    assert current_owner(engine, leads[1]) == "Grace"  # the dead write of an inactive rep
    assert current_owner(engine, leads[3]) == "Grace"
    assert current_owner(engine, leads[0]) == "Ada"  # sent: stays
