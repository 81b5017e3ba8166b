"""`connector simulate`: the stored leads replayed through a proposed config, writing nothing."""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from connector.core.config import OrgConfig, parse_config
from connector.routing.assign import Lead, Router
from connector.routing.rotation import max_lag
from connector.routing.simulate import (
    History,
    HistoryLead,
    TeamRotation,
    format_report,
    load_history,
    replay_order,
    report,
    simulate,
)
from connector.routing.teams import apply_teams, rotation_fingerprint
from connector.shell.cli import main, parse_since
from crm_adapters.salesforce_ids import to_18

ENV = {"TOKEN": "unused"}
T0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)


DEFAULT_RULES = """  - {team: na, when: {Country: [US, CA]}}
  - {team: row, when: {Country: [DE, FR, JP]}}"""


def org_yaml(na: str, row: str, rules: str | None = None) -> str:
    return f"""
org: acme
crm:
  kind: salesforce
  instance_url: https://acme.my.salesforce.com
  auth: {{method: session, access_token: "${{TOKEN}}"}}
  object: Lead
teams:
  - name: na
    members:
{na}
  - name: row
    members:
{row}
rules:
{rules or DEFAULT_RULES}
"""


def members(*spec: tuple[str, int, bool]) -> str:
    return "\n".join(
        f'      - {{crm_user_id: "{uid}", name: "Rep {uid}", weight: {w}, '
        f"active: {str(a).lower()}}}"
        for uid, w, a in spec
    )


NA = members(("a1", 1, True), ("a2", 2, True), ("a3", 1, True))
ROW = members(("r1", 1, True), ("r2", 1, True))


def cfg(na: str = NA, row: str = ROW, rules: str | None = None) -> OrgConfig:
    return parse_config(org_yaml(na, row, rules), "acme.yaml", ENV)


COUNTRIES = ["US", "DE", "CA", "FR", "US", "JP", "US", "BR"]  # BR matches no rule


def lead(i: int) -> Lead:
    return Lead(f"00Q{i:012d}", {"Country": COUNTRIES[i % len(COUNTRIES)], "LastName": f"L{i}"})


def route_concurrently(engine: Engine, c: OrgConfig, start: int, n: int, threads: int = 6) -> None:
    """Several threads assign small batches at once, so lock order differs from arrival order."""
    router = Router(engine, c)
    per = n // threads

    def work(k: int) -> None:
        ids = range(start + k * per, start + (k + 1) * per)
        batch: list[Lead] = []
        for i in ids:
            batch.append(lead(i))
            if len(batch) == 3:
                router.assign_many(batch, "api")
                batch = []
        if batch:
            router.assign_many(batch, "api")

    ts = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()


def snapshot(engine: Engine) -> dict[str, object]:
    with engine.connect() as conn:
        return {
            t: conn.execute(text(f"SELECT count(*) FROM {t}")).scalar_one()
            for t in ("leads", "assignments", "outbox", "teams", "members")
        } | {
            "counts": conn.execute(
                text("SELECT array_agg(assigned_in_epoch ORDER BY id) FROM members")
            ).scalar_one(),
            "epochs": conn.execute(
                text("SELECT array_agg(epoch ORDER BY id) FROM teams")
            ).scalar_one(),
        }


def recorded(engine: Engine) -> dict[str, str | None]:
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT l.crm_id, a.crm_user_id FROM leads l"
                " LEFT JOIN assignments a ON a.lead_id = l.id"
            )
        ).all()
    return {r.crm_id: r.crm_user_id for r in rows}


# --- on a real PostgreSQL ------------------------------------------------------------------


def test_replaying_the_config_that_ran_gives_back_every_recorded_assignment(engine: Engine) -> None:
    c = cfg()
    apply_teams(engine, c)
    route_concurrently(engine, c, 0, 120)  # before the window: the rotation's starting state
    with engine.connect() as conn:
        since = conn.execute(text("SELECT clock_timestamp()")).scalar_one()
    route_concurrently(engine, c, 1000, 240)
    before = snapshot(engine)

    history = load_history(engine, c, since)
    result = simulate(c, history)
    rep = report(c, history, result, since)

    truth = recorded(engine)
    assert len(result.outcomes) == 240
    assert {o.lead.crm_id for o in result.outcomes} == {
        to_18(lead(i).crm_id) for i in range(1000, 1240)
    }
    for o in result.outcomes:
        assert o.owner == truth[o.lead.crm_id], o.lead.crm_id
    assert (rep["changed_rep"], rep["changed_team"]) == (0, 0)
    assert rep["rotations"] == {"na": "continued", "row": "continued"}
    assert all(r["before"] == r["after"] for r in rep["reps"])
    assert rep["unassigned"]["before"] == rep["unassigned"]["after"] == {"no_rule_matched": 30}
    assert snapshot(engine) == before  # it wrote nothing


def test_lead_id_order_would_not_reproduce_a_concurrent_history(engine: Engine) -> None:
    """The replay must follow the lock's order: arrival (lead id) order gets it wrong here."""
    c = cfg()
    apply_teams(engine, c)
    route_concurrently(engine, c, 0, 300, threads=8)
    history = load_history(engine, c, T0 - timedelta(days=3650))
    truth = recorded(engine)
    naive = _by_lead_id(history)
    # The naive replay (no lock order) differs somewhere, or the run happened to be serial.
    lock_order = [x.assignment_id for x in replay_order(history.leads) if x.team == "na"]
    id_order = [x.assignment_id for x in replay_order(history.leads) if x.team == "na"]
    id_order = [x.assignment_id for x in sorted(history.leads, key=lambda x: x.lead_id)
                if x.team == "na"]  # fmt: skip
    if lock_order == id_order:
        pytest.skip("the threads happened to take the lock in arrival order")
    wrong = [o for o in simulate(c, naive).outcomes if o.owner != truth[o.lead.crm_id]]
    assert wrong
    right = simulate(c, history).outcomes
    assert all(o.owner == truth[o.lead.crm_id] for o in right)


def _by_lead_id(h: History) -> History:
    """A History whose leads have no assignment ids, so replay_order keeps lead id order."""
    bare = [
        HistoryLead(x.lead_id, x.crm_id, x.fields, T0, x.team, x.owner, x.reason, None, x.epoch)
        for x in h.leads
    ]
    return History(bare, h.rotations, h.counts_before, h.names)


def test_a_proposed_config_moves_leads_and_lists_the_unassigned(
    engine: Engine, tmp_path: Path
) -> None:
    c = cfg()
    apply_teams(engine, c)
    route_concurrently(engine, c, 0, 240)
    since = T0 - timedelta(days=3650)
    before = snapshot(engine)
    # a3 leaves, a2 goes to weight 1, Brazil gets a rule, Japan's rule goes away
    proposed = cfg(
        na=members(("a1", 1, True), ("a2", 1, True), ("a3", 1, False)),
        rules="  - {team: na, when: {Country: [US, CA, BR]}}\n"
        "  - {team: row, when: {Country: [DE, FR]}}",
    )
    history = load_history(engine, proposed, since)
    result = simulate(proposed, history)
    rep = report(proposed, history, result, since)
    assert rep["rotations"] == {"na": "restarted", "row": "continued"}
    teams = {t["name"]: (t["before"], t["after"]) for t in rep["teams"]}
    # per 8 leads: US x3, CA -> na (4); DE, FR, JP -> row (3); BR -> none. 240 leads = 30 rounds
    assert teams == {"na": (120, 150), "row": (90, 60)}
    reps = {r["crm_user_id"]: (r["before"], r["after"]) for r in rep["reps"]}
    assert reps["a3"][1] == 0 and reps["a1"][1] == reps["a2"][1] == 75
    assert reps["r1"][1] + reps["r2"][1] == 60 and abs(reps["r1"][1] - reps["r2"][1]) <= 1
    assert rep["unassigned"]["before"] == {"no_rule_matched": 30}
    assert rep["unassigned"]["after"] == {"no_rule_matched": 30}  # JP now; BR is routed
    jp = {x["crm_id"] for x in rep["unassigned"]["leads"]}
    assert jp == {to_18(lead(i).crm_id) for i in range(240) if COUNTRIES[i % 8] == "JP"}
    assert rep["changed_team"] == 60  # 30 BR in, 30 JP out
    assert 0 < rep["changed_rep_share"] <= 1
    text_out = format_report(rep)
    assert "changed team: 60 (25.0%)" in text_out and "JP" not in text_out
    assert snapshot(engine) == before


# --- the command ---------------------------------------------------------------------------


def test_cli_simulate_json_and_plot(
    engine: Engine,
    db_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    c = cfg()
    apply_teams(engine, c)
    route_concurrently(engine, c, 0, 48, threads=2)
    proposed = tmp_path / "proposed.yaml"
    proposed.write_text(
        org_yaml(members(("a1", 1, True), ("a2", 1, False), ("a3", 1, True)), ROW), "utf-8"
    )
    monkeypatch.setenv("DATABASE_URL", db_url)
    monkeypatch.setenv("TOKEN", "unused")
    before = snapshot(engine)
    plot = tmp_path / "whatif.svg"
    code = main(
        ["simulate", "--org", "acme", "--config", str(proposed), "--since", "1d", "--json",
         "--plot", str(plot)]
    )  # fmt: skip
    out, err = capsys.readouterr()
    assert (code, err) == (0, "")
    rep = json.loads(out)
    assert rep["leads"] == 48 and rep["rotations"]["na"] == "restarted"
    assert {r["crm_user_id"]: r["after"] for r in rep["reps"] if r["team"] == "na"}["a2"] == 0
    svg = plot.read_text("utf-8")
    assert (
        svg.startswith("<svg")
        and "Rep a2" in svg
        and "http" not in svg.replace('xmlns="http://www.w3.org/2000/svg"', "")
    )
    assert snapshot(engine) == before
    # the proposed config was not applied: the database still has a2 active
    with engine.connect() as conn:
        assert conn.execute(text("SELECT active FROM members WHERE crm_user_id = 'a2'")).scalar()


def test_cli_simulate_refusals(
    engine: Engine,
    db_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    c = cfg()
    apply_teams(engine, c)
    conf = tmp_path / "acme.yaml"
    conf.write_text(org_yaml(NA, ROW), "utf-8")
    monkeypatch.setenv("DATABASE_URL", db_url)
    monkeypatch.setenv("TOKEN", "unused")
    with pytest.raises(SystemExit) as exit_info:
        main(["simulate", "--config", str(conf), "--since", "last week"])
    assert exit_info.value.code == 2
    assert (
        "--since 'last week': give a span like 30d, 12h or 90m, or a date like 2026-11-01"
        in capsys.readouterr().err
    )
    png = tmp_path / "out.png"
    with pytest.raises(SystemExit) as exit_info:
        main(["simulate", "--config", str(conf), "--plot", str(png)])
    assert exit_info.value.code == 2
    assert f"argument --plot: {png}: only SVG is drawn; name the file *.svg" in (
        capsys.readouterr().err
    )
    assert not png.exists()


def test_parse_since() -> None:
    now = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
    assert parse_since("30d", now) == now - timedelta(days=30)
    assert parse_since("12h", now) == now - timedelta(hours=12)
    assert parse_since("90m", now) == now - timedelta(minutes=90)
    assert parse_since("2026-11-01", now) == datetime(2026, 11, 1, tzinfo=UTC)
    assert parse_since("2026-11-01T08:00+01:00", now) == datetime(2026, 11, 1, 7, tzinfo=UTC)


# --- pure ----------------------------------------------------------------------------------


def hl(
    i: int,
    country: str,
    team: str | None = None,
    owner: str | None = None,
    aid: int | None = None,
    epoch: int | None = 1,
) -> HistoryLead:
    reason = None if owner else "no_rule_matched"
    when = T0 + timedelta(seconds=i)
    return HistoryLead(
        i, f"L{i}", {"Country": country}, when, team, owner, reason, aid, epoch if owner else None
    )


def test_replay_order_keeps_each_teams_lock_order_in_arrival_slots() -> None:
    leads = [hl(1, "US", "na", "a1", 12), hl(2, "DE", "row", "r1", 11), hl(3, "US", "na", "a2", 10),
             hl(4, "BR"), hl(5, "US", "na", "a3", 13)]  # fmt: skip
    order = [x.lead_id for x in replay_order(leads)]
    # na's slots (1, 3, 5) are refilled in assignment order 10, 12, 13 -> leads 3, 1, 5
    assert order == [3, 2, 1, 4, 5]


def test_unchanged_rotation_continues_from_the_counts_before_the_window() -> None:
    c = cfg(row=members(("r1", 1, True), ("r2", 1, True)))
    rots = {t.name: TeamRotation(4, rotation_fingerprint(t)) for t in c.teams}
    # before the window r1 had one more lead than r2 in epoch 4: the next one goes to r2
    hist = History([hl(1, "DE", "row", "r2", 1, epoch=4)], rots, {"row": {4: {"r1": 5, "r2": 4}}})
    sim = simulate(c, hist)
    assert [o.owner for o in sim.outcomes] == ["r2"]
    assert sim.rotations["row"] == "continued" and not sim.restarted_in_window
    # the same window with a changed rotation restarts from zero: r1 (first listed) first
    changed = cfg(row=members(("r1", 1, True), ("r2", 1, True), ("r3", 1, False)))
    sim2 = simulate(changed, hist)
    assert [o.owner for o in sim2.outcomes] == ["r1"] and sim2.rotations["row"] == "restarted"


def test_an_epoch_change_inside_the_window_is_reported() -> None:
    c = cfg()
    rots = {t.name: TeamRotation(5, rotation_fingerprint(t)) for t in c.teams}
    hist = History([hl(1, "DE", "row", "r1", 1, epoch=4), hl(2, "DE", "row", "r1", 2, epoch=5)],
                   rots, {})  # fmt: skip
    sim = simulate(c, hist)
    assert sim.restarted_in_window == ["row"]
    rep = report(c, hist, sim, T0)
    assert "note: team row's rotation changed inside the window" in format_report(rep)


def test_team_without_active_members_leaves_leads_unassigned_with_the_reason() -> None:
    c = cfg(row=members(("r1", 1, False)))
    rots = {t.name: TeamRotation(1, "old") for t in c.teams}
    hist = History([hl(1, "DE", "row", "r1", 1), hl(2, "US", "na", "a1", 2)], rots, {})
    rep = report(c, hist, simulate(c, hist), T0)
    assert rep["unassigned"]["after"] == {"no_active_member": 1}
    assert rep["unassigned"]["leads"] == [{"crm_id": "L1", "reason": "no_active_member"}]
    # L1 loses its rep; L2 goes to a2, the heaviest rep of na's restarted rotation
    assert rep["changed_team"] == 1 and rep["changed_rep"] == 2


def test_replayed_rotation_keeps_the_weighted_fairness_bound() -> None:
    c = cfg(na=members(("a1", 3, True), ("a2", 2, True), ("a3", 1, True)))
    rots = {t.name: TeamRotation(1, "old") for t in c.teams}
    hist = History([hl(i, "US") for i in range(600)], rots, {})
    sim = simulate(c, hist)
    tally = {"a1": 0, "a2": 0, "a3": 0}
    for o in sim.outcomes:
        assert o.owner is not None
        tally[o.owner] += 1
        assert max_lag([3, 2, 1], list(tally.values())) < 1


def test_reassigned_leads_count_as_routing_picked_them(engine: Engine) -> None:
    """`before` is routing's pick: a later `reassign` changes the owner, not the history."""
    from connector.routing.reassign import reassign_lead

    c = cfg()
    apply_teams(engine, c)
    route_concurrently(engine, c, 0, 48, threads=3)
    truth = recorded(engine)
    moved = next(cid for cid, owner in sorted(truth.items()) if owner == "a1")
    reassign_lead(engine, c, moved, to="a3", reason="reassigned")
    assert recorded(engine)[moved] == "a3"

    since = T0 - timedelta(days=3650)
    history = load_history(engine, c, since)
    result = simulate(c, history)
    rep = report(c, history, result, since)
    assert {o.lead.crm_id: o.owner for o in result.outcomes} == truth  # routing's picks
    assert rep["changed_rep"] == 0
    assert rep["reassigned_in_window"] == ["na"]
    assert "team na had leads of the window reassigned" in format_report(rep)
