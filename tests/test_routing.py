"""connector.routing.assign on a real PostgreSQL: one owner per lead, fair rotations, team edits."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import pytest
from sqlalchemy import Engine, text

from connector.core.config import OrgConfig
from connector.core.config_loading import parse_config
from connector.intake.importer import ingest_file
from connector.routing.assign import Lead, LeadError, Outcome, Router, validate_lead
from connector.routing.leads import MAX_FIELDS_BYTES, assigned_outcome
from connector.routing.rotation import max_lag
from connector.routing.teams import apply_teams
from connector.shell.store import make_engine
from testbed.harness import worker_context
from tests.helpers.sample_org import SAMPLE_ENV, SAMPLE_YAML

ENV = {"TOKEN": "unused"}


def team_yaml(members: list[tuple[str, int, bool]], obj: str = "Lead", org: str = "acme") -> str:
    """One team ``t`` of members (crm_user_id, weight, active); route US leads only."""
    lines = "\n".join(
        f'      - {{crm_user_id: "{uid}", name: "Rep {uid}", weight: {w}, '
        f"active: {str(a).lower()}}}"
        for uid, w, a in members
    )
    return f"""
org: {org}
crm:
  kind: salesforce
  instance_url: https://x.my.salesforce.com
  auth: {{method: session, access_token: "${{TOKEN}}"}}
  object: {obj}
teams:
  - name: t
    members:
{lines}
rules:
  - {{team: t, when: {{Country: US}}}}
"""


def cfg_of(members: list[tuple[str, int, bool]], obj: str = "Lead") -> OrgConfig:
    return parse_config(team_yaml(members, obj), "t.yaml", ENV)


def counts(engine: Engine) -> dict[str, int]:
    with engine.connect() as conn:
        return {
            t: conn.execute(text(f"SELECT count(*) FROM {t}")).scalar_one()
            for t in ("leads", "assignments", "outbox")
        }


def member_state(engine: Engine) -> dict[str, tuple[int, int]]:
    """crm_user_id -> (assigned_in_epoch, epoch of the team)."""
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT m.crm_user_id, m.assigned_in_epoch, t.epoch FROM members m "
                "JOIN teams t ON t.id = m.team_id"
            )
        )
        return {r[0]: (r[1], r[2]) for r in rows}


def team_epoch(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT epoch FROM teams WHERE name = 't'")).scalar_one())


def epoch_counts(engine: Engine, epoch: int) -> Counter[str]:
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT crm_user_id FROM assignments WHERE epoch = :e"), {"e": epoch}
        )
        return Counter(r[0] for r in rows)


def us(i: int | str, prefix: str = "00Q") -> Lead:
    return Lead(f"{prefix}{i}", {"Country": "US"})


def test_one_lead_gets_one_assignment_and_one_outbox_row(engine: Engine) -> None:
    cfg = cfg_of([("005A", 1, True), ("005B", 1, True)], obj="Contact")
    apply_teams(engine, cfg)
    o = Router(engine, cfg).assign(
        Lead("003X1", {"Country": "US", "AccountId": "001ACC"}), "salesforce_outbound"
    )
    assert o == Outcome("003X1", "assigned", "t", "005A", "Rep 005A")
    assert counts(engine) == {"leads": 1, "assignments": 1, "outbox": 1}
    with engine.connect() as conn:
        lead = conn.execute(text("SELECT * FROM leads")).one()
        a = conn.execute(text("SELECT * FROM assignments")).one()
        ob = conn.execute(text("SELECT * FROM outbox")).one()
    assert (lead.org, lead.crm_object, lead.crm_id, lead.parent_id, lead.source) == (
        "acme",
        "Contact",
        "003X1",
        "001ACC",
        "salesforce_outbound",
    )
    assert lead.fields == {"Country": "US", "AccountId": "001ACC"}
    assert lead.unassigned_reason is None
    epoch = team_epoch(engine)
    assert (a.lead_id, a.crm_user_id, a.epoch, a.rule_index, a.source) == (
        lead.id,
        "005A",
        epoch,
        0,
        "salesforce_outbound",
    )
    assert (ob.lead_id, ob.assignment_id, ob.crm_object, ob.crm_id) == (
        lead.id,
        a.id,
        "Contact",
        "003X1",
    )
    assert (ob.owner_id, ob.parent_id, ob.state, ob.attempts) == ("005A", "001ACC", "pending", 0)
    assert member_state(engine) == {"005A": (1, epoch), "005B": (0, epoch)}


def test_repeat_returns_the_existing_owner_and_changes_nothing(
    engine: Engine, applied: OrgConfig
) -> None:
    router = Router(engine, applied)
    first = router.assign(Lead("00Q1", {"Country": "US"}), "api")
    assert first.status == "assigned" and first.team == "na_ae"
    before, members_before = counts(engine), member_state(engine)
    # the same CRM id with other fields (it would match another team now): still a no-op
    again = router.assign(Lead("00Q1", {"Country": "FR"}), "hubspot_webhook")
    assert again == Outcome("00Q1", "duplicate", "na_ae", first.owner_id, first.owner_name)
    assert counts(engine) == before == {"leads": 1, "assignments": 1, "outbox": 1}
    assert member_state(engine) == members_before
    with engine.connect() as conn:
        assert conn.execute(text("SELECT fields FROM leads")).scalar_one() == {"Country": "US"}


def test_same_id_in_another_object_is_another_lead(engine: Engine) -> None:
    lead_cfg, contact_cfg = cfg_of([("005A", 1, True)]), cfg_of([("005A", 1, True)], "Contact")
    apply_teams(engine, lead_cfg)
    lead = Lead("00Q1", {"Country": "US", "AccountId": "001"})
    assert Router(engine, lead_cfg).assign(lead, "api").status == "assigned"
    assert Router(engine, contact_cfg).assign(lead, "api").status == "assigned"
    assert counts(engine) == {"leads": 2, "assignments": 2, "outbox": 2}
    with engine.connect() as conn:
        parents = conn.execute(text("SELECT crm_object, parent_id FROM outbox ORDER BY 1")).all()
    assert [tuple(r) for r in parents] == [("Contact", "001"), ("Lead", None)]


def _check_single_owner(engine: Engine, outcomes: list[Outcome]) -> None:
    assert counts(engine) == {"leads": 1, "assignments": 1, "outbox": 1}
    owners = {(o.owner_id, o.team) for o in outcomes}
    assert len(owners) == 1 and None not in next(iter(owners))
    assert sorted(o.status for o in outcomes) == ["assigned"] + ["duplicate"] * (len(outcomes) - 1)
    assert sum(c for c, _ in member_state(engine).values()) == 1


def test_same_lead_from_8_threads_at_once(engine: Engine, applied: OrgConfig) -> None:
    router = Router(engine, applied)
    barrier = threading.Barrier(8)
    outcomes: list[Outcome] = []
    errors: list[BaseException] = []

    def send() -> None:
        try:
            barrier.wait(timeout=30)
            outcomes.append(router.assign(Lead("00QRACE", {"Country": "CA"}), "api"))
        except BaseException as exc:  # collected and asserted on below
            errors.append(exc)

    threads = [threading.Thread(target=send) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == [] and len(outcomes) == 8
    _check_single_owner(engine, outcomes)


def _send_once(db_url: str, yaml_text: str, barrier: Any, out: Any) -> None:
    try:
        engine = make_engine(db_url, pool_size=1)
        router = Router(engine, parse_config(yaml_text, "acme.yaml", SAMPLE_ENV))
        with engine.connect():
            pass
        barrier.wait(timeout=60)
        o = router.assign(Lead("00QRACE", {"Country": "CA"}), "api")
        out.put(("ok", o.status, o.team, o.owner_id))
        engine.dispose()
    except Exception as exc:  # reported to the parent, which fails the test
        out.put(("error", f"{type(exc).__name__}: {exc}", None, None))


@pytest.mark.slow
def test_same_lead_from_4_processes_at_once(
    engine: Engine, db_url: str, applied: OrgConfig
) -> None:
    ctx = worker_context()  # forked from the fork server: no interpreter start
    barrier, out = ctx.Barrier(4), ctx.Queue()
    procs = [
        ctx.Process(target=_send_once, args=(db_url, SAMPLE_YAML, barrier, out)) for _ in "abcd"
    ]
    for p in procs:
        p.start()
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    assert [r for r in results if r[0] == "error"] == []
    _check_single_owner(
        engine, [Outcome("00QRACE", status, team, owner) for _, status, team, owner in results]
    )


def test_duplicates_inside_one_batch(engine: Engine, applied: OrgConfig) -> None:
    router = Router(engine, applied)
    leads = [
        Lead("00Q1", {"Country": "US"}),
        Lead("00Q2", {"Country": "US"}),
        Lead("00Q1", {"Country": "DE"}),  # a repeat: the first occurrence decides
        Lead("00Q3", {"Country": "US"}),
        Lead("00Q2", {"Country": "US"}),
    ]
    out = router.assign_many(leads, "import")
    assert [(o.crm_id, o.status) for o in out] == [
        ("00Q1", "assigned"),
        ("00Q2", "assigned"),
        ("00Q1", "duplicate"),
        ("00Q3", "assigned"),
        ("00Q2", "duplicate"),
    ]
    assert out[2].owner_id == out[0].owner_id and out[2].team == "na_ae"
    assert out[4].owner_id == out[1].owner_id
    # weights 1 (Ada) and 2 (Alan): Alan, Alan, Ada
    assert [out[i].owner_name for i in (0, 1, 3)] == ["Alan Turing", "Alan Turing", "Ada Lovelace"]
    assert counts(engine) == {"leads": 3, "assignments": 3, "outbox": 3}


def test_equal_weights_round_robin_across_batches(engine: Engine, applied: OrgConfig) -> None:
    router = Router(engine, applied)
    names = [router.assign(Lead(f"00Q{i}", {}), "api").owner_name for i in range(4)]
    names += [
        o.owner_name for o in router.assign_many([Lead(f"00Qb{i}", {}) for i in range(5)], "api")
    ]
    assert names == ["Grace Hopper", "Edsger Dijkstra", "Barbara Liskov"] * 3


def test_weights(engine: Engine) -> None:
    weights = {"005A": 1, "005B": 3, "005C": 2}
    cfg = cfg_of([(k, w, True) for k, w in weights.items()])
    apply_teams(engine, cfg)
    router = Router(engine, cfg)
    got: Counter[str] = Counter()
    for i in range(0, 120, 7):  # uneven batch sizes
        for o in router.assign_many([us(j) for j in range(i, min(i + 7, 120))], "import"):
            assert o.owner_id is not None
            got[o.owner_id] += 1
            assert max_lag(list(weights.values()), [got[k] for k in weights]) < 1
    assert got == {"005A": 20, "005B": 60, "005C": 40}


def test_inactive_rep_gets_none(engine: Engine) -> None:
    cfg = cfg_of([("005A", 1, True), ("005B", 5, False), ("005C", 1, True)])
    apply_teams(engine, cfg)
    outs = Router(engine, cfg).assign_many([us(i) for i in range(10)], "import")
    assert Counter(o.owner_id for o in outs) == {"005A": 5, "005C": 5}


def test_no_rule_matched_is_stored_unassigned(engine: Engine) -> None:
    cfg = cfg_of([("005A", 1, True)])
    apply_teams(engine, cfg)
    router = Router(engine, cfg)
    out = router.assign_many([Lead("00Q1", {"Country": "FR"}), Lead("00Q2", {})], "import")
    assert out == [
        Outcome("00Q1", "unassigned", reason="no_rule_matched"),
        Outcome("00Q2", "unassigned", reason="no_rule_matched"),
    ]
    assert counts(engine) == {"leads": 2, "assignments": 0, "outbox": 0}
    with engine.connect() as conn:
        reasons = conn.execute(text("SELECT DISTINCT unassigned_reason FROM leads")).all()
    assert reasons == [("no_rule_matched",)]
    # a repeat reports the same reason and stays unassigned
    again = router.assign(Lead("00Q1", {"Country": "US"}), "api")
    assert again == Outcome("00Q1", "duplicate", reason="no_rule_matched")
    assert counts(engine) == {"leads": 2, "assignments": 0, "outbox": 0}


def test_team_with_no_active_member(engine: Engine) -> None:
    cfg = cfg_of([("005A", 1, False), ("005B", 1, False)])
    apply_teams(engine, cfg)
    router = Router(engine, cfg)
    assert router.assign(us(1), "api") == Outcome(
        "00Q1", "unassigned", "t", reason="no_active_member"
    )
    assert counts(engine) == {"leads": 1, "assignments": 0, "outbox": 0}
    with engine.connect() as conn:
        assert conn.execute(text("SELECT unassigned_reason FROM leads")).scalar_one() == (
            "no_active_member"
        )
    assert router.assign(us(1), "api") == Outcome(
        "00Q1", "duplicate", None, reason="no_active_member"
    )


def test_team_edits_restart_the_epoch_and_stay_fair(engine: Engine) -> None:
    original = [("005A", 1, True), ("005B", 1, True), ("005C", 1, True)]
    apply_teams(engine, cfg_of(original))
    router = Router(engine, cfg_of(original))  # built once; it must see every edit below
    router.assign_many([us(i, "e1-") for i in range(7)], "import")  # A one ahead of B and C
    epoch = team_epoch(engine)
    assert epoch_counts(engine, epoch) == {"005A": 3, "005B": 2, "005C": 2}

    edits: list[tuple[str, list[tuple[str, int, bool]]]] = [
        ("add", [*original, ("005D", 1, True)]),
        ("remove", [("005A", 1, True), ("005C", 1, True), ("005D", 1, True)]),
        ("deactivate", [("005A", 1, True), ("005C", 1, False), ("005D", 1, True)]),
        ("reweight", [("005A", 1, True), ("005C", 2, True), ("005D", 3, True)]),
    ]
    for what, members in edits:
        changes = apply_teams(engine, cfg_of(members))
        assert [(c.team, c.epoch_restarted) for c in changes] == [("t", True)], what
        epoch += 1
        state = member_state(engine)
        assert all(n == 0 and e == epoch for n, e in state.values()), (what, state)
        n = 13
        for i in range(n):  # one at a time: the fairness bound holds after every lead
            router.assign(us(i, f"e{epoch}-"), "api")
            got = epoch_counts(engine, epoch)
            live = [(uid, w) for uid, w, active in members if active]
            lag = max_lag([w for _, w in live], [got[uid] for uid, _ in live])
            assert lag < 1, (what, dict(got))
            assert set(got) <= {uid for uid, _ in live}, (what, dict(got))
    assert counts(engine)["assignments"] == 7 + 4 * 13


def test_rename_only_does_not_restart_the_epoch(engine: Engine) -> None:
    members = [("005A", 1, True), ("005B", 1, True), ("005C", 1, True)]
    cfg = cfg_of(members)
    apply_teams(engine, cfg)
    router = Router(engine, cfg)
    router.assign_many([us(i) for i in range(4)], "import")  # A B C A
    epoch = team_epoch(engine)
    renamed = parse_config(
        team_yaml(members).replace('name: "Rep 005B"', 'name: "Beatrice"'), "t.yaml", ENV
    )
    assert apply_teams(engine, renamed) == []
    assert member_state(engine) == {"005A": (2, epoch), "005B": (1, epoch), "005C": (1, epoch)}
    # the rotation continues where it was, and the new name is used
    assert router.assign(us(10), "api") == Outcome("00Q10", "assigned", "t", "005B", "Beatrice")
    assert router.assign(us(11), "api").owner_id == "005C"


def test_apply_is_idempotent_and_reorder_restarts_the_epoch(engine: Engine) -> None:
    cfg = cfg_of([("005A", 1, True), ("005B", 1, True)])
    assert apply_teams(engine, cfg) == []  # a new team starts in its first epoch
    epoch = team_epoch(engine)
    assert epoch == 1
    assert apply_teams(engine, cfg) == []
    reordered = cfg_of([("005B", 1, True), ("005A", 1, True)])
    assert [c.team for c in apply_teams(engine, reordered)] == ["t"]
    assert team_epoch(engine) == epoch + 1
    router = Router(engine, reordered)
    assert [o.owner_id for o in router.assign_many([us(1), us(2)], "api")] == ["005B", "005A"]


BAD_LEADS = [
    (None, {}, "missing CRM id"),
    ("", {}, "missing CRM id"),
    ("   ", {}, "missing CRM id"),
    (True, {}, "missing CRM id"),
    (["00Q1"], {}, "missing CRM id"),
    ("x" * 65, {}, "CRM id longer than 64 characters"),
    ("00Q\x001", {}, "CRM id contains control characters"),
    ("00Q\n1", {}, "CRM id contains control characters"),
    ("00Q1", ["Country", "US"], "fields must be an object"),
    ("00Q1", "Country=US", "fields must be an object"),
    ("00Q1", None, "fields must be an object"),
    ("00Q1", {"": 1}, "field names must be non-empty text"),
    ("00Q1", {1: "x"}, "field names must be non-empty text"),
    ("00Q1", {"Note": "a\x00b"}, "a field contains a NUL character"),
    ("00Q1", {"Tags": ["ok", {"k\x00": 1}]}, "a field contains a NUL character"),
    ("00Q1", {"x": object()}, "fields must be JSON values"),
    ("00Q1", {"x": {1, 2}}, "fields must be JSON values"),
    ("00Q1", {"Score": float("nan")}, "fields must be JSON values"),
    ("00Q1", {"Score": float("inf")}, "fields must be JSON values"),
    ("00Q1", {"Note": "x" * MAX_FIELDS_BYTES}, f"fields larger than {MAX_FIELDS_BYTES} bytes"),
]


@pytest.mark.parametrize(("crm_id", "fields", "reason"), BAD_LEADS)
def test_validate_lead_rejections(crm_id: object, fields: object, reason: str) -> None:
    with pytest.raises(LeadError) as info:
        validate_lead(crm_id, fields)
    assert info.value.reason == reason == str(info.value)


def test_validate_lead_accepts_and_normalises() -> None:
    assert validate_lead(" 00Q1 ", {"Country": "US"}) == Lead("00Q1", {"Country": "US"})
    assert validate_lead(12345, {}) == Lead("12345", {})
    assert validate_lead("x" * 64, {"n": [1, 2.5, None, True]}).crm_id == "x" * 64


def test_rejected_rows_store_nothing(engine: Engine, applied: OrgConfig, tmp_path: Any) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(
        '{"Id": ""}\n{"Id": "00Q1", "Score": NaN}\n{"Id": "00Q2", "Note": "a\\u0000"}\n'
        '{"Id": "' + "x" * 65 + '"}\n[]\n'
    )
    summary = ingest_file(Router(engine, applied), path, "jsonl", "Id")
    assert [(r.line, r.reason) for r in summary.rejected] == [
        (1, "missing CRM id (column 'Id')"),
        (2, "fields must be JSON values"),
        (3, "a field contains a NUL character"),
        (4, "CRM id longer than 64 characters"),
        (5, "expected a JSON object"),
    ]
    assert counts(engine) == {"leads": 0, "assignments": 0, "outbox": 0}


def test_router_rejects_unknown_source(engine: Engine, applied: OrgConfig) -> None:
    with pytest.raises(ValueError) as info:
        Router(engine, applied).assign(us(1), "email")
    assert str(info.value) == "unknown source 'email'"
    assert counts(engine) == {"leads": 0, "assignments": 0, "outbox": 0}


def test_team_missing_from_the_database(engine: Engine, sample_cfg: OrgConfig) -> None:
    from connector.routing.assign import RoutingError

    with pytest.raises(RoutingError) as info:
        Router(engine, sample_cfg).assign(us(1), "api")
    assert str(info.value) == (
        "team 'na_ae' of org 'acme' is not in the database: "
        "run `connector migrate` with this config"
    )
    assert counts(engine) == {"leads": 0, "assignments": 0, "outbox": 0}


# --- Salesforce ids: one record, one lead, whichever form of its id arrives ----------------

ID15 = "00Q5g00000LmAbC"
ID18 = "00Q5g00000LmAbCEAV"  # ID15 with its case suffix


def test_salesforce_lead_by_15_then_18_char_id_is_one_lead(
    engine: Engine, applied: OrgConfig
) -> None:
    router = Router(engine, applied)
    first = router.assign(Lead(ID15, {"Country": "US"}), "import")
    assert first.status == "assigned" and first.crm_id == ID18
    second = router.assign(Lead(ID18, {"Country": "US"}), "salesforce_outbound")
    assert second == Outcome(ID18, "duplicate", first.team, first.owner_id, first.owner_name)
    # an 18-character id case-folded on the way still names the same record
    for folded in (ID18.upper(), ID18.lower()):
        again = router.assign(Lead(folded, {"Country": "DE"}), "poll")
        assert (again.crm_id, again.status, again.owner_id) == (ID18, "duplicate", first.owner_id)
    assert counts(engine) == {"leads": 1, "assignments": 1, "outbox": 1}
    with engine.connect() as conn:
        lead = conn.execute(text("SELECT crm_id, source, merged_into FROM leads")).one()
        outbox = conn.execute(text("SELECT crm_id, owner_id FROM outbox")).one()
    assert tuple(lead) == (ID18, "import", None)
    assert tuple(outbox) == (ID18, first.owner_id)


def test_salesforce_ids_in_one_batch_and_parent_ids(engine: Engine) -> None:
    cfg = cfg_of([("005A", 1, True), ("005B", 1, True)], obj="Contact")
    apply_teams(engine, cfg)
    account15, account18 = "0015g00000AcMeQ", "0015g00000AcMeQAAV"
    leads = [
        Lead("003000000000001", {"Country": "US", "AccountId": account15}),
        Lead("003000000000001aaa", {"Country": "US", "AccountId": account18}),
        Lead("003X1", {"Country": "US", "AccountId": "001ACC"}),  # not well-formed: as is
    ]
    outcomes = Router(engine, cfg).assign_many(leads, "import")
    assert [(o.crm_id, o.status, o.owner_id) for o in outcomes] == [
        ("003000000000001AAA", "assigned", "005A"),
        ("003000000000001AAA", "duplicate", "005A"),
        ("003X1", "assigned", "005B"),
    ]
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT crm_id, parent_id FROM outbox ORDER BY crm_id")).all()
    assert [tuple(r) for r in rows] == [
        ("003000000000001AAA", account18),
        ("003X1", "001ACC"),
    ]


def test_a_batch_builds_its_outcomes_as_outcome_does() -> None:
    """Assigned outcomes are built without Outcome's __init__ (a batch builds 500): every
    field set, equal to the one __init__ builds; a field added to Outcome fails this."""
    cands = ((1, None), (2, "away"))
    fast = assigned_outcome("00Q1", "t", "005A", "Ann", cands)
    slow = Outcome("00Q1", "assigned", "t", "005A", "Ann", candidates=cands)
    assert fast == slow
    assert vars(fast) == vars(slow)
    assert fast.candidates == cands


def test_deferred_outcomes_are_built_after_the_commit_from_what_was_routed(
    engine: Engine,
) -> None:
    """assign_in_deferred routes in the caller's transaction and returns what builds the
    outcomes: called after the commit (the teams' locks released, the connection gone), it
    gives what assign_in gives, in input order, a repeat inside the batch as a duplicate."""
    cfg = cfg_of([("005A", 1, True), ("005B", 1, True), ("005C", 1, True)])
    apply_teams(engine, cfg)
    router = Router(engine, cfg)
    leads = [Lead(f"00QD{i}", {"Country": "US"}) for i in range(5)] + [Lead("00QD1", {})]
    with engine.begin() as conn:
        later = router.assign_in_deferred(conn, leads, "import")
        assert counts(engine) == {"leads": 0, "assignments": 0, "outbox": 0}  # not committed

    def no_database() -> None:
        raise AssertionError("the outcomes were built from the database")

    with pytest.MonkeyPatch.context() as mp:  # nothing is read: they come from what was routed
        mp.setattr(engine, "connect", no_database)
        mp.setattr(engine, "raw_connection", no_database)
        got = later()
    owners = ["005A", "005B", "005C", "005A", "005B"]
    assert got == [
        *(Outcome(f"00QD{i}", "assigned", "t", o, f"Rep {o}") for i, o in enumerate(owners)),
        Outcome("00QD1", "duplicate", "t", "005B", "Rep 005B"),
    ]
    assert [why for _, why in got[0].candidates] == [None, None, None]
    with engine.begin() as conn:
        again = router.assign_in(conn, leads[:5], "import")
    assert [(o.status, o.owner_id) for o in again] == [("duplicate", o) for o in owners]
    with engine.connect() as conn:
        assert router.assign_in_deferred(conn, [], "import")() == []
