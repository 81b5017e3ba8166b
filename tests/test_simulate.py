"""`connector simulate`: the stored leads replayed through a proposed config, writing nothing."""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from dataclasses import replace as dc_replace
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from sqlalchemy import Engine, text

import connector.routing.simulate as simulate_module
from connector.core.config import OrgConfig
from connector.core.config_loading import parse_config
from connector.intake.accounts_sync import account_rows, store_accounts
from connector.routing.assign import Lead, Router
from connector.routing.availability import Candidate
from connector.routing.replay_history import History, HistoryLead, Mirror, TeamRotation
from connector.routing.replay_read import load_history
from connector.routing.replay_report import format_report, report
from connector.routing.rotation import max_lag
from connector.routing.simulate import replay_batches, replay_order, simulate
from connector.routing.teams import apply_teams, rotation_fingerprint
from connector.shell.cli import main, parse_since
from connector.shell.reps import end_away, resolve_rep, set_away
from connector.shell.store import make_engine
from crm_adapters.base import CrmAccount
from crm_adapters.salesforce_ids import to_18
from testbed.pg import DatabaseFactory

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


def test_replay_batches_puts_recorded_batches_in_decision_order_and_picks_first() -> None:
    def b(i: int, batch: int | None, decision: int, aid: int | None = None) -> HistoryLead:
        return dc_replace(hl(i, "US"), batch=batch, decision_id=decision, assignment_id=aid)

    leads = [b(1, 5, 20, aid=9), b(2, 5, 21), b(3, 5, 22, aid=8), b(4, 3, 30, aid=7),
             b(5, None, 1), b(6, 3, 31, aid=6)]  # fmt: skip
    # the legacy lead first; batch 5 (decisions 20-22) before batch 3 (30-31); inside a
    # batch, assignment id order with the lead nobody took last
    assert [[x.lead_id for x in u] for u in replay_batches(leads)] == [[5], [3, 1, 2], [6, 4]]


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
    assert rep["unassigned"]["leads"] == [
        {"crm_id": "L1", "reason": "no_active_member", "team": "row"}
    ]
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


# --- caps, working hours, time off, overflow, catch-up and account matching ----------------

W0 = datetime(2026, 12, 7, 5, 0, tzinfo=UTC)  # Monday 00:00 in New York, 06:00 in Berlin
STEP = timedelta(minutes=17)  # the router's clock moves this much at every batch
WORLD_RULES = """  - {name: by-account, team: na, when: {Country: US}, route_to: account_owner}
  - {name: canada, team: na, when: {Country: CA}}
  - {name: europe, team: row, when: {Country: [DE, FR, JP]}}"""
NA_CAP = "caps: {per_day: 8}"
WORLD_COUNTRIES = ("US", "DE", "CA", "FR", "US", "JP", "DE", "BR")  # BR matches no rule
ROW_HOURS = ('hours: {timezone: Europe/Berlin, mon-fri: "07:00-19:00"}',
             'hours: {timezone: Europe/Berlin, mon-fri: "09:00-21:00"}')  # fmt: skip
EMAILS = ("x@a-corp.com", "x@r-corp.com", "x@x-corp.com", "x@nobody.com", "x@gmail.com")


def world_yaml(
    na_cap: str = NA_CAP, row_hours: tuple[str, str] = ROW_HOURS, rules: str = WORLD_RULES
) -> str:
    r1, r2 = (f", {h}" if h else "" for h in row_hours)
    return f"""
org: acme
crm:
  kind: salesforce
  instance_url: https://acme.my.salesforce.com
  auth: {{method: session, access_token: "${{TOKEN}}"}}
  object: Lead
teams:
  - name: na
    timezone: America/New_York
    {na_cap}
    overflow_team: spill
    catch_up: {{max_in_a_row: 2}}
    members:
      - {{crm_user_id: a1, name: Ann}}
      - {{crm_user_id: a2, name: Abe, weight: 2,
         hours: {{timezone: America/New_York, mon-fri: "08:00-14:00"}}}}
      - {{crm_user_id: a3, name: Ari}}
  - name: row
    timezone: Europe/Berlin
    caps: {{per_day: 9}}
    members:
      - {{crm_user_id: r1, name: Rua{r1}}}
      - {{crm_user_id: r2, name: Rex{r2}}}
  - name: spill
    members:
      - {{crm_user_id: s1, name: Sol}}
      - {{crm_user_id: s2, name: Sue,
         time_off: [{{from: "2026-12-07T10:00", until: "2026-12-07T16:00"}}]}}
rules:
{rules}
"""


def world_cfg(**kw: Any) -> OrgConfig:
    return parse_config(world_yaml(**kw), "acme.yaml", ENV)


class StepClock:
    """The router's clock: each batch is judged STEP after the one before (thread-safe)."""

    def __init__(self) -> None:
        self.n = 0
        self.lock = threading.Lock()

    def __call__(self) -> datetime:
        with self.lock:
            self.n += 1
            return W0 + self.n * STEP

    def peek(self) -> datetime:
        return W0 + self.n * STEP


def world_lead(i: int) -> Lead:
    fields = {"Country": WORLD_COUNTRIES[i % 8], "LastName": f"L{i}", "Email": EMAILS[i % 5]}
    return Lead(f"00Q{i:012d}", fields)


def route_world(router: Router, start: int, n: int, threads: int = 6) -> None:
    per = n // threads

    def work(k: int) -> None:
        ids = list(range(start + k * per, start + (k + 1) * per))
        for j in range(0, len(ids), 3):
            router.assign_many([world_lead(i) for i in ids[j : j + 3]], "api")

    ts = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()


@dataclass
class World:
    engine: Engine
    cfg: OrgConfig
    since: datetime
    truth: dict[str, tuple[str | None, str | None]]  # crm_id -> (owner, unassigned reason)
    history: History


@pytest.fixture(scope="module")
def world(databases: DatabaseFactory) -> Iterator[World]:
    """One recorded run of 336 leads by 6 threads in batches of 3, the router's clock moving
    17 minutes a batch from Monday 00:00 in New York to Tuesday: caps hit and reset, reps off
    shift, a rep away by the command for 4 hours from the window's start (its table row gone
    since), overflow, catch-up and account owners. The window is the last 288 leads."""
    engine = make_engine(databases.new())
    c = world_cfg()
    apply_teams(engine, c)
    page = [
        CrmAccount("001000000000001", "a1", ("a-corp.com",), T0),
        CrmAccount("001000000000002", "r1", ("r-corp.com",), T0),
        CrmAccount("001000000000003", "zz", ("x-corp.com",), T0),  # owner is no rep
    ]
    with engine.begin() as conn:
        store_accounts(conn, c.org, account_rows("salesforce", page))
    clock = StepClock()
    router = Router(engine, c, clock=clock)
    route_world(router, 0, 48)  # before the window: caps' counts and the rotation's state
    with engine.connect() as conn:
        since = conn.execute(text("SELECT clock_timestamp()")).scalar_one()
    a3 = resolve_rep(c, "a3")
    set_away(engine, c, a3, clock.peek() + timedelta(hours=4), None, clock.peek())
    route_world(router, 1000, 96)
    end_away(engine, c, a3)  # over by now; and the table forgets it
    route_world(router, 1096, 192)
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT l.crm_id, a.crm_user_id, l.unassigned_reason FROM leads l"
                " LEFT JOIN assignments a ON a.lead_id = l.id WHERE l.received_at >= :since"
            ),
            {"since": since},
        ).all()
    truth = {r.crm_id: (r.crm_user_id, r.unassigned_reason) for r in rows}
    yield World(engine, c, since, truth, load_history(engine, c, since))
    engine.dispose()


def mismatches(w: World, sim: Any) -> list[str]:
    return [o.lead.crm_id for o in sim.outcomes if (o.owner, o.reason) != w.truth[o.lead.crm_id]]


def recorded_facts(engine: Engine) -> dict[str, int]:
    """How often each policy decided something in the recorded run (the test must cover it)."""
    checks = {
        "capped": 'detail::text LIKE \'%"skip": "capped"%\'',
        "off_shift": 'detail::text LIKE \'%"skip": "off_shift"%\'',
        "away": 'detail::text LIKE \'%"skip": "away"%\'',
        "away_by_command": "detail ? 'away_by_command'",
        "overflowed": "detail ? 'overflow_from'",
        "account_owner": "detail -> 'chosen' ->> 'by' = 'account_owner'",
        "all_capped": "detail ->> 'reason' = 'all_capped'",
        "none_available": "detail ->> 'reason' = 'none_available'",
        "at": "detail ? 'at' AND detail ? 'batch'",
    }
    with engine.connect() as conn:
        return {
            k: conn.execute(
                text(f"SELECT count(*) FROM decision_details WHERE kind = 'route' AND {where}")
            ).scalar_one()
            for k, where in checks.items()
        }


def test_replaying_caps_hours_time_off_overflow_and_accounts_gives_back_the_record(
    world: World,
) -> None:
    facts = recorded_facts(world.engine)
    assert all(facts.values()), facts  # every policy decided some leads
    assert facts["at"] == 336
    before = snapshot(world.engine)
    history = load_history(world.engine, world.cfg, world.since)
    sim = simulate(world.cfg, history)
    assert len(sim.outcomes) == 288
    assert mismatches(world, sim) == []
    rep = report(world.cfg, history, sim, world.since)
    assert (rep["changed_rep"], rep["changed_team"], rep["judged_at_arrival"]) == (0, 0, 0)
    assert rep["rotations"] == {"na": "continued", "row": "continued", "spill": "continued"}
    assert rep["unassigned"]["before"] == rep["unassigned"]["after"]
    assert {"all_capped", "none_available", "no_rule_matched"} <= set(rep["unassigned"]["after"])
    assert rep["overflowed"]["before"] == rep["overflowed"]["after"] > 0
    assert rep["account_matched"]["before"] == rep["account_matched"]["after"] > 0
    assert snapshot(world.engine) == before  # it wrote nothing


def _no_caps(c: Candidate) -> int | None:
    return None


@pytest.mark.parametrize(
    "wrong",
    ["ignores caps", "judges at arrival", "forgets rep away", "no loads before", "no accounts"],
)
def test_the_identity_test_catches_a_replay_that_skips_a_policy(
    world: World, wrong: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each of these deliberately wrong replays gives back owners that were not recorded."""
    h = world.history
    if wrong == "ignores caps":
        monkeypatch.setattr(simulate_module, "room", _no_caps)
    elif wrong == "judges at arrival":
        h = dc_replace(h, leads=[dc_replace(x, at=None, batch=None) for x in h.leads])
    elif wrong == "forgets rep away":
        h = dc_replace(h, leads=[dc_replace(x, away=frozenset()) for x in h.leads])
    elif wrong == "no loads before":
        h = dc_replace(h, loads_before={})
    else:
        h = dc_replace(h, accounts=Mirror())
    assert mismatches(world, simulate(world.cfg, h))


def per_rep_day(sim: Any, team: str, tz: str) -> Counter[tuple[str, date]]:
    zone_ = ZoneInfo(tz)
    return Counter(
        (o.owner, o.lead.judged_at.astimezone(zone_).date())
        for o in sim.outcomes
        if o.team == team and o.owner is not None and not o.by_account
    )


def test_a_lower_cap_sends_more_leads_to_the_overflow_team(world: World) -> None:
    proposed = world_cfg(na_cap="caps: {per_day: 2}")
    history = load_history(world.engine, proposed, world.since)
    sim = simulate(proposed, history)
    rep = report(proposed, history, sim, world.since)
    teams = {t["name"]: (t["before"], t["after"]) for t in rep["teams"]}
    assert teams["na"][1] < teams["na"][0] and teams["spill"][1] > teams["spill"][0]
    assert rep["overflowed"]["after"] > rep["overflowed"]["before"]
    # no rep of na gets a third lead by the rotation on a New York day (counting the leads
    # it had that day before the window)
    loads = history.loads_before
    for (owner, day), n in per_rep_day(sim, "na", "America/New_York").items():
        assert n + loads.get(("na", str(owner), "day", day), 0) <= 2


def test_round_the_clock_hours_leave_no_lead_for_want_of_a_rep_on_shift(world: World) -> None:
    proposed = world_cfg(row_hours=("", ""))
    history = load_history(world.engine, proposed, world.since)
    sim = simulate(proposed, history)
    rep = report(proposed, history, sim, world.since)
    assert rep["unassigned"]["before"]["none_available"] > 0
    assert "none_available" not in rep["unassigned"]["after"]
    # the night's leads now get a rep, until the day's caps (which did not change) are hit
    night = [o for o in sim.outcomes if o.lead.reason == "none_available"]
    assert all(o.owner is not None or o.reason == "all_capped" for o in night)
    assert any(o.owner is not None for o in night)
    row = next(t for t in rep["teams"] if t["name"] == "row")
    assert row["after"] >= row["before"]


def test_without_the_account_rule_the_account_owners_leads_go_to_the_rotation(
    world: World,
) -> None:
    proposed = world_cfg(rules=WORLD_RULES.replace(", route_to: account_owner", ""))
    history = load_history(world.engine, proposed, world.since)
    sim = simulate(proposed, history)
    rep = report(proposed, history, sim, world.since)
    assert rep["account_matched"]["before"] > 0 and rep["account_matched"]["after"] == 0
    # the leads of r-corp.com went to r1 of team row as their account's owner; now to na
    r_corp = [o for o in sim.outcomes if o.lead.fields["Email"] == "x@r-corp.com"
              and o.lead.fields["Country"] == "US"]  # fmt: skip
    assert r_corp and all(o.lead.owner == "r1" and o.team in ("na", "spill") for o in r_corp)
    assert rep["changed_team"] >= len(r_corp)


# --- rules with operators, groups, a relative date and a territory table -------------------

OPERATOR_RULES = """  - {name: fresh big, team: na,
     when: {Employees: {gte: 500}, Created: {gte: 2 hours ago}}}
  - {name: by territory, territory: geo}
  - {name: vp or europe, team: row,
     when: {any: [{Country: [DE, FR]}, {Title: {contains: vp}}], not: {Tags: {includes_any: x}}}}
territories:
  geo:
    fields: {country: Country, state: State, postal_code: PostalCode}
    rows:
      - {country: US, state: CA, team: row}
      - {country: US, postal_code: "100-199", team: na}
      - {country: CA, team: na}"""


def operator_lead(i: int) -> Lead:
    fields: dict[str, object] = {
        "Country": ["US", "CA", "DE", "JP", "US", "FR"][i % 6],
        "State": ["CA", "NY", "", "TX"][i % 4],
        "PostalCode": ["10001", "94103", "150-22", "K1A 0B1", "199"][i % 5],
        "Employees": [900, "1200", "12", "lots", None][i % 5],
        "Created": (W0 + timedelta(minutes=20 * (i % 9))).isoformat(),
        "Title": ["VP Sales", "Engineer", "svp"][i % 3],
        "Tags": ["a;x", "b", ""][i % 3],
    }
    return Lead(f"00Q{i:012d}", fields)


def test_replaying_rules_with_operators_and_territories_gives_back_the_record(
    engine: Engine,
) -> None:
    c = cfg(rules=OPERATOR_RULES)
    apply_teams(engine, c)
    clock = StepClock()
    router = Router(engine, c, clock=clock)
    with engine.connect() as conn:
        since = conn.execute(text("SELECT clock_timestamp()")).scalar_one()

    def work(k: int) -> None:
        ids = list(range(k * 30, (k + 1) * 30))
        for j in range(0, len(ids), 3):
            router.assign_many([operator_lead(i) for i in ids[j : j + 3]], "api")

    ts = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT l.crm_id, a.crm_user_id, l.unassigned_reason, a.rule_name FROM leads l"
                " LEFT JOIN assignments a ON a.lead_id = l.id"
            )
        ).all()
    truth = {r.crm_id: (r.crm_user_id, r.unassigned_reason) for r in rows}
    by_rule = Counter(r.rule_name for r in rows)
    # every rule decided some leads, the relative date both ways, and some matched none
    assert set(by_rule) == {"fresh big", "by territory", "vp or europe", None}, by_rule
    history = load_history(engine, c, since)
    sim = simulate(c, history)
    assert len(sim.outcomes) == 120
    assert [
        o.lead.crm_id for o in sim.outcomes if (o.owner, o.reason) != truth[o.lead.crm_id]
    ] == []
    # matched at arrival instead of the recorded instant, the relative date decides otherwise
    at_arrival = dc_replace(
        history, leads=[dc_replace(x, at=None, batch=None) for x in history.leads]
    )
    wrong = simulate(c, at_arrival)
    assert [o for o in wrong.outcomes if (o.owner, o.reason) != truth[o.lead.crm_id]]
