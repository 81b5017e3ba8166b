"""Caps, time off, working hours, overflow and catch-up through the Router, on real Postgres."""

from __future__ import annotations

import itertools
import json
from collections import Counter
from datetime import UTC, date, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, text

from connector.core.config import OrgConfig
from connector.core.config_loading import parse_config
from connector.routing.assign import Lead, Outcome, Router
from connector.routing.decisions import DecisionRecorder
from connector.routing.rules import compile_rules
from connector.routing.teams import apply_teams
from connector.shell.reps import end_away, resolve_rep, set_away
from tests.helpers.clocks import WallClock

ENV = {"TOKEN": "unused"}
# Monday 2026-12-07, 10:00 in New York, 16:00 in Berlin
MONDAY = datetime(2026, 12, 7, 15, 0, tzinfo=UTC)


def org(teams: str) -> OrgConfig:
    return parse_config(
        f"""
org: acme
crm:
  kind: salesforce
  instance_url: https://x.my.salesforce.com
  auth: {{method: session, access_token: "${{TOKEN}}"}}
teams:
{teams}
rules:
  - {{name: german, team: de, when: {{Country: DE}}}}
  - {{name: rest, team: a}}
""",
        "t.yaml",
        ENV,
    )


TEAMS = """
  - name: a
    timezone: Europe/Berlin
    caps: {per_day: 2}
    overflow_team: de
    members:
      - {crm_user_id: "005A", name: Ada}
      - {crm_user_id: "005B", name: Bob, caps: {per_day: 3, per_week: 4}}
  - name: de
    members:
      - {crm_user_id: "005D", name: Dora}
      - {crm_user_id: "005E", name: Eve, active: false}
"""


def router(engine: Engine, cfg: OrgConfig, clock: WallClock) -> Router:
    apply_teams(engine, cfg)
    return Router(engine, cfg, clock=clock)


def leads(prefix: str, n: int, country: str = "US") -> list[Lead]:
    return [Lead(f"{prefix}{i:03d}", {"Country": country}) for i in range(n)]


def owners(outcomes: list[Outcome]) -> list[str | None]:
    return [o.owner_id for o in outcomes]


def table(engine: Engine, sql: str) -> list[tuple[object, ...]]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(text(sql))]


def test_caps_count_per_local_day_and_week_then_overflow(engine: Engine) -> None:
    clock = WallClock(MONDAY)
    r = router(engine, org(TEAMS), clock)
    got = r.assign_many(leads("00Qm", 7), "api")
    # Ada 2 a day, Bob 3 a day: five leads in team a, then the overflow team takes the rest
    assert [(o.team, o.owner_id) for o in got] == [
        ("a", "005A"),
        ("a", "005B"),
        ("a", "005A"),
        ("a", "005B"),
        ("a", "005B"),
        ("de", "005D"),
        ("de", "005D"),
    ]
    assert table(
        engine,
        "SELECT m.crm_user_id, l.period, l.starts_on, l.assigned FROM member_load l "
        "JOIN members m ON m.id = l.member_id ORDER BY 1, 2",
    ) == [
        ("005A", "day", date(2026, 12, 7), 2),
        ("005A", "week", date(2026, 12, 7), 2),
        ("005B", "day", date(2026, 12, 7), 3),
        ("005B", "week", date(2026, 12, 7), 3),
        ("005D", "day", date(2026, 12, 7), 2),  # Dora's team counts in UTC
        ("005D", "week", date(2026, 12, 7), 2),
    ]
    # the overflow keeps the rule that matched; the assignment is the overflow team's
    assert table(
        engine,
        "SELECT t.name, a.rule_name, count(*) FROM assignments a JOIN teams t ON t.id = a.team_id "
        "GROUP BY 1, 2 ORDER BY 1",
    ) == [("a", "rest", 5), ("de", "rest", 2)]
    # 23:00 in Berlin is still Monday there; 23:00 UTC is Tuesday in Berlin: a new day
    clock.at = datetime(2026, 12, 7, 22, 0, tzinfo=UTC)
    assert owners(r.assign_many(leads("00Qn", 1), "api")) == ["005D"]
    clock.at = datetime(2026, 12, 7, 23, 0, tzinfo=UTC)
    # Bob has one lead left in his week (4), Ada two in her day
    assert owners(r.assign_many(leads("00Qt", 4), "api")) == ["005A", "005B", "005A", "005D"]


def test_a_batch_counts_on_the_day_of_its_instant(engine: Engine) -> None:
    """Caps count per local day of the instant the batch is judged at (read once, before its
    call): Ada and Bob are capped on Monday in Berlin and free again once it is Tuesday
    there, where the next batch's leads count."""
    clock = WallClock(datetime(2026, 12, 7, 22, 59, 59, tzinfo=UTC))  # 23:59:59 in Berlin
    r = router(engine, org(TEAMS), clock)
    assert owners(r.assign_many(leads("00Qy", 5), "api")) == ["005A", "005B"] * 2 + ["005B"]
    clock.at = datetime(2026, 12, 7, 23, 0, 1, tzinfo=UTC)  # Tuesday in Berlin
    got = r.assign_many(leads("00Qz", 2), "api")
    assert [(o.team, o.owner_id) for o in got] == [("a", "005A"), ("a", "005B")]
    assert table(
        engine,
        "SELECT m.crm_user_id, l.starts_on, l.assigned FROM member_load l "
        "JOIN members m ON m.id = l.member_id WHERE l.period = 'day' ORDER BY 1, 2",
    ) == [
        ("005A", date(2026, 12, 7), 2),
        ("005A", date(2026, 12, 8), 1),
        ("005B", date(2026, 12, 7), 3),
        ("005B", date(2026, 12, 8), 1),
    ]


def test_all_capped_without_overflow_stays_unassigned_with_the_reason(engine: Engine) -> None:
    cfg = org(TEAMS.replace("    overflow_team: de\n", ""))
    r = router(engine, cfg, WallClock(MONDAY))
    got = r.assign_many(leads("00Qc", 6), "api")
    assert [o.status for o in got] == ["assigned"] * 5 + ["unassigned"]
    last = got[-1]
    assert (last.team, last.reason, last.owner_id) == ("a", "all_capped", None)
    ids = dict(table(engine, "SELECT crm_user_id, id FROM members"))
    assert last.candidates == ((ids["005A"], "capped"), (ids["005B"], "capped"))
    assert table(
        engine,
        "SELECT l.unassigned_reason, count(o.id) FROM leads l LEFT JOIN outbox o "
        "ON o.lead_id = l.id WHERE l.crm_id = '00Qc005' GROUP BY 1",
    ) == [("all_capped", 0)]
    # a repeat reports the stored reason, and still takes nobody's turn
    assert r.assign(Lead("00Qc005", {"Country": "US"}), "api").reason == "all_capped"


def test_a_lower_named_overflow_team_does_not_deadlock_or_lose_leads(engine: Engine) -> None:
    cfg = org(
        """
  - name: a
    members: [{crm_user_id: "005A", name: Ada}]
  - name: de
    caps: {per_day: 1}
    overflow_team: a
    members: [{crm_user_id: "005D", name: Dora}]
"""
    )
    r = router(engine, cfg, WallClock(MONDAY))
    got = r.assign_many(leads("00Qd", 3, "DE") + leads("00Qu", 2), "api")
    assert [(o.team, o.owner_id) for o in got] == [
        ("de", "005D"),
        ("a", "005A"),
        ("a", "005A"),
        ("a", "005A"),
        ("a", "005A"),
    ]


def test_away_from_the_command_line_is_seen_at_the_next_pick(engine: Engine) -> None:
    cfg = org(
        TEAMS.replace("caps: {per_day: 2}", "caps: {}").replace(
            ", caps: {per_day: 3, per_week: 4}", ""
        )
    )
    clock = WallClock(MONDAY)
    r = router(engine, cfg, clock)
    other = Router(engine, cfg, clock=clock)  # another process
    ada = resolve_rep(cfg, "Ada")
    set_away(engine, cfg, ada, MONDAY + timedelta(hours=2), "dentist", MONDAY)
    got = other.assign_many(leads("00Qa", 4), "api")
    assert owners(got) == ["005B"] * 4
    ids = dict(table(engine, "SELECT crm_user_id, id FROM members"))
    assert got[0].candidates == ((ids["005A"], "away"), (ids["005B"], None))
    # catch_up none: Ada was credited the turns she was away for, so she is not owed them
    assert table(
        engine,
        "SELECT crm_user_id, assigned_in_epoch, credited_in_epoch FROM members "
        "WHERE crm_user_id IN ('005A', '005B') ORDER BY 1",
    ) == [("005A", 0, 4), ("005B", 4, 0)]
    assert end_away(engine, cfg, ada) is True
    assert end_away(engine, cfg, ada) is False
    assert owners(r.assign_many(leads("00Qb", 4), "api")) == ["005A", "005B", "005A", "005B"]
    # the time off also simply ends at `until`
    set_away(engine, cfg, ada, MONDAY + timedelta(hours=2), None, MONDAY)
    clock.at = MONDAY + timedelta(hours=2)
    assert owners(r.assign_many(leads("00Qe", 2), "api")) == ["005A", "005B"]


def test_off_shift_and_config_time_off(engine: Engine) -> None:
    cfg = org(
        """
  - name: a
    members:
      - {crm_user_id: "005A", name: Ada,
         hours: {timezone: America/New_York, mon-fri: "09:00-17:30"}}
      - {crm_user_id: "005B", name: Bob, time_off: [{from: 2026-12-07, until: "2026-12-08T09:00"}]}
      - {crm_user_id: "005C", name: Cy}
  - name: de
    members: [{crm_user_id: "005D", name: Dora}]
"""
    )
    clock = WallClock(MONDAY)  # 10:00 in New York; Bob is off all Monday (UTC, his team's zone)
    r = router(engine, cfg, clock)
    assert owners(r.assign_many(leads("00Qo", 4), "api")) == ["005A", "005C", "005A", "005C"]
    clock.at = datetime(2026, 12, 8, 8, 0, tzinfo=UTC)  # Tue 03:00 New York; Bob still off
    got = r.assign_many(leads("00Qp", 2), "api")
    assert owners(got) == ["005C", "005C"]
    assert [x[1] for x in got[0].candidates] == ["off_shift", "away", None]
    clock.at = datetime(2026, 12, 8, 9, 0, tzinfo=UTC)  # Bob is back
    assert owners(r.assign_many(leads("00Qq", 2), "api")) == ["005B", "005C"]
    clock.at = datetime(2026, 12, 8, 8, 0, tzinfo=UTC)
    cfg_all_off = org(
        """
  - name: a
    members:
      - {crm_user_id: "005A", name: Ada,
         hours: {timezone: America/New_York, mon-fri: "09:00-17:30"}}
  - name: de
    members: [{crm_user_id: "005D", name: Dora}]
"""
    )
    o = router(engine, cfg_all_off, clock).assign(Lead("00Qz", {"Country": "US"}), "api")
    assert (o.status, o.reason) == ("unassigned", "none_available")


def test_catch_up_gives_the_returning_rep_at_most_k_in_a_row(engine: Engine) -> None:
    cfg = org(
        TEAMS.replace("    caps: {per_day: 2}\n", "    catch_up: {max_in_a_row: 2}\n")
        .replace(", caps: {per_day: 3, per_week: 4}", "")
        .replace(
            '      - {crm_user_id: "005B", name: Bob}',
            '      - {crm_user_id: "005B", name: Bob}\n      - {crm_user_id: "005C", name: Cy}',
        )
    )
    clock = WallClock(MONDAY)
    r = router(engine, cfg, clock)
    ada = resolve_rep(cfg, "005A")
    set_away(engine, cfg, ada, MONDAY + timedelta(days=1), None, MONDAY)
    assert owners(r.assign_many(leads("00Qw", 6), "api")) == ["005B", "005C"] * 3
    end_away(engine, cfg, ada)
    # Ada is owed 2 leads (a third of six): two in a row, then another rep; one lead at a
    # time, so the streak is read back from the assignments
    got = [r.assign(lead, "api").owner_id for lead in leads("00Qr", 9)]
    assert got == ["005A", "005A", "005B", "005A", "005A", "005C", "005A", "005B", "005C"]
    counts = Counter(
        dict(table(engine, "SELECT crm_user_id, count(*) FROM assignments GROUP BY 1"))
    )
    assert counts == {"005A": 5, "005B": 5, "005C": 5}


def test_a_team_edit_restarts_the_credits_with_the_counts(engine: Engine) -> None:
    cfg = org(
        TEAMS.replace("caps: {per_day: 2}", "caps: {}").replace(
            ", caps: {per_day: 3, per_week: 4}", ""
        )
    )
    r = router(engine, cfg, WallClock(MONDAY))
    set_away(engine, cfg, resolve_rep(cfg, "Ada"), MONDAY + timedelta(hours=1), None, MONDAY)
    r.assign_many(leads("00Qx", 3), "api")
    edited = org(TEAMS.replace("name: Bob,", "name: Bob, weight: 2,"))
    apply_teams(engine, edited)
    assert table(engine, "SELECT sum(assigned_in_epoch), sum(credited_in_epoch) FROM members") == [
        (0, 0)
    ]


def test_a_batchs_decisions_keep_each_picks_seats_in_columns(engine: Engine) -> None:
    """A batch's picks record their seats in columns of the decision, one
    candidate set per distinct set of candidates: read through decision_details, each pick
    shows the counts before it (the previous pick's plus one for its rep), Ada's cap from the
    pick after her second lead, Eve inactive in the overflow team, and its batch, epoch and
    rep."""
    clock = WallClock(MONDAY)
    r = router(engine, org(TEAMS), clock)
    got = r.assign_many(leads("00Qc", 7), "api")
    assert [o.owner_id for o in got] == ["005A", "005B", "005A", "005B", "005B", "005D", "005D"]
    with engine.connect() as conn:
        raw = conn.execute(
            text("SELECT detail ? 'seats', seat_ids IS NOT NULL FROM routing_decisions")
        ).all()
        rows = conn.execute(
            text(
                "SELECT t.name, a.member_id, t.epoch, d.detail, "
                "(SELECT min(id) FROM leads) AS first FROM assignments a "
                "JOIN teams t ON t.id = a.team_id "
                "JOIN decision_details d ON d.lead_id = a.lead_id ORDER BY a.id"
            )
        ).all()
        who = dict(conn.execute(text("SELECT id, crm_user_id FROM members")).all())
    assert raw == [(False, True)] * 7  # the seats are in the columns only
    by_team: dict[str, list[dict[str, Any]]] = {"a": [], "de": []}
    for team, member_id, epoch, detail, first in rows:
        assert (detail["chosen_id"], detail["epoch"], detail["batch"]) == (member_id, epoch, first)
        assert (detail["team"], detail["outcome"]) == (team, "assigned")
        by_team[team].append(detail)
    for picks in by_team.values():
        for before, after in itertools.pairwise(picks):
            seats = before["seats"]
            ids_counts = zip(seats["ids"], seats["counts"], strict=True)
            assert after["seats"]["counts"] == [
                c + (i == before["chosen_id"]) for i, c in ids_counts
            ]
    skips = [
        dict(zip([who[i] for i in d["seats"]["ids"]], d["seats"]["skips"], strict=True))
        for d in by_team["a"] + by_team["de"]
    ]
    assert [s["005A"] for s in skips[:5]] == [None, None, None, "capped", "capped"]
    assert [s["005E"] for s in skips[5:]] == ["inactive", "inactive"]
    assert all(d["seats"]["weights"] == [1] * len(d["seats"]["ids"]) for d in by_team["a"])


RECORD = text(
    "SELECT record_assignments(CAST(:org AS text), 'Lead', 'api', CAST(:team_id AS bigint), "
    "CAST(:epoch AS integer), true, CAST(:day AS date), CAST(:day AS date), "
    "CAST(:lead_ids AS bigint[]), CAST(:member_ids AS bigint[]), CAST(:owner_ids AS text[]), "
    "CAST(:crm_ids AS text[]), "
    "CAST(:parent_ids AS text[]), CAST(:rule_indexes AS integer[]), "
    "CAST(:rule_names AS text[]), CAST(:slas AS integer[]), NULL, "
    "CAST(:credit_ids AS bigint[]), CAST(:credit_ns AS bigint[]), CAST(:batch AS bigint), "
    "CAST(:details AS jsonb), CAST(:detail_of AS integer[]), CAST(:seat_ids AS bigint[]), "
    "CAST(:seat_weights AS integer[]), CAST(:seat_skips AS text[]), "
    "CAST(:seat_counts AS bigint[]), CAST(:reason AS text))"
)


def test_record_assignments_records_each_pick_with_its_seats(engine: Engine) -> None:
    """The recorder (record_assignments), called directly: each lead's seats sliced from the
    flat skips and counts (one run of the seats' length a lead), a lead without a decision
    position (NULL) written without one, a lead nobody took recorded unassigned with the
    reason, the picks' counts, credits, caps counters and outbox rows."""
    cfg = org(TEAMS)
    apply_teams(engine, cfg)
    with engine.begin() as conn:
        ids = dict(conn.execute(text("SELECT crm_user_id, id FROM members")).all())
        team = conn.execute(text("SELECT id, epoch FROM teams WHERE name = 'a'")).one()
        leads = conn.execute(
            text(
                "INSERT INTO leads (org, crm_object, crm_id, fields, source) "
                "SELECT 'acme', 'Lead', x, '{}', 'api' "
                "FROM unnest(ARRAY['L1', 'L2', 'L3', 'L4']) x ORDER BY x RETURNING id"
            )
        ).all()
        a, b = ids["005A"], ids["005B"]
        conn.execute(
            RECORD,
            {
                "org": "acme",
                "team_id": team.id,
                "epoch": team.epoch,
                "day": date(2026, 12, 7),
                "lead_ids": [r.id for r in leads],
                "member_ids": [b, a, a, None],
                "owner_ids": ["005B", "005A", "005A", None],
                "crm_ids": ["L1", "L2", "L3", "L4"],
                "parent_ids": [None] * 4,
                "rule_indexes": [1] * 4,
                "rule_names": ["rest"] * 4,
                "slas": [None] * 4,
                "credit_ids": [b],
                "credit_ns": [2],
                "batch": leads[0].id,
                "details": json.dumps([{"team": "a"}, {"team": "a", "x": 1, "sla_minutes": 5}]),
                "detail_of": [0, 0, None, 1],  # L1 and L2 share one, L3 has none
                "seat_ids": [a, b],
                "seat_weights": [5, 6],
                "seat_skips": [None, None, None, "away", None, "away", "capped", "away"],
                "seat_counts": [10, 11, 10, 12, 11, 12, 12, 12],
                "reason": "all_capped",
            },
        )
        got = {
            r[0]: r[1]
            for r in conn.execute(
                text(
                    "SELECT l.crm_id, d.detail FROM decision_details d "
                    "JOIN leads l ON l.id = d.lead_id"
                )
            )
        }
        counts = conn.execute(
            text("SELECT crm_user_id, assigned_in_epoch, credited_in_epoch FROM members")
        ).all()
        outbox = conn.execute(text("SELECT crm_id, owner_id FROM outbox ORDER BY id")).all()
        reason = conn.execute(
            text("SELECT unassigned_reason FROM leads WHERE crm_id = 'L4'")
        ).scalar_one()
    common = {"team": "a", "batch": leads[0].id, "epoch": team.epoch}
    weights = {"ids": [a, b], "weights": [5, 6]}
    assert got["L1"] == {
        **common,
        "chosen_id": b,
        "seats": {**weights, "counts": [10, 11], "skips": [None, None]},
    }
    assert got["L2"] == {
        **common,
        "chosen_id": a,
        "seats": {**weights, "counts": [10, 12], "skips": [None, "away"]},
    }
    assert "L3" not in got
    assert got["L4"] == {
        "team": "a",
        "x": 1,
        "outcome": "unassigned",
        "reason": "all_capped",
        "batch": leads[0].id,
        "epoch": None,
        "chosen_id": None,
        "seats": {**weights, "counts": [12, 12], "skips": ["capped", "away"]},
    }
    assert sorted(tuple(r) for r in counts if r[0] in ("005A", "005B")) == [
        ("005A", 2, 0),
        ("005B", 1, 2),
    ]
    assert [tuple(r) for r in outbox] == [("L1", "005B"), ("L2", "005A"), ("L3", "005A")]
    assert reason == "all_capped"


def test_a_batchs_decisions_are_sent_once_per_distinct_content(engine: Engine) -> None:
    """route_team receives each distinct decision once (DecisionRecorder.shared): the
    US leads of team a share one, the German leads another (their own rule's trace), and the
    leads that overflowed from a keep their own (overflow_from). Read back, every decision
    holds what its lead's decision says."""
    r = router(engine, org(TEAMS), WallClock(MONDAY))
    sent: list[tuple[int, list[int]]] = []
    execute = Connection.execute

    def spy(self: Connection, statement: Any, params: Any = None, **kw: Any) -> Any:
        if params and "detail_of" in params:
            sent.append((len(json.loads(params["details"])), list(params["detail_of"])))
        return execute(self, statement, params, **kw)

    Connection.execute = spy  # type: ignore[method-assign]
    try:
        got = r.assign_many(leads("00Qd", 2, "DE") + leads("00Qu", 7), "api")
    finally:
        Connection.execute = execute  # type: ignore[method-assign]
    assert owners(got) == ["005D", "005D", "005A", "005B", "005A", "005B", "005B", "005D", "005D"]
    # team a: seven leads (five placed, two go on), one decision; team de: two German leads
    # (one decision) and the two that overflowed (their own)
    assert sorted(sent) == [(1, [0] * 7), (3, [0, 0, 1, 2])]
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT l.crm_id, d.detail FROM decision_details d "
                "JOIN leads l ON l.id = d.lead_id ORDER BY l.crm_id"
            )
        ).all()
    detail = dict(rows)
    assert len(detail) == 9
    for cid, d in detail.items():
        rule = "german" if cid.startswith("00Qd") else "rest"
        assert [t["name"] for t in d["rules"] if t["matched"]] == [rule]
        assert d["values"] == {"Country": "DE" if rule == "german" else "US"}
        assert (d["source"], d["outcome"], d["at"]) == ("api", "assigned", MONDAY.isoformat())
        overflowed = cid in ("00Qu005", "00Qu006")
        assert d["team"] == ("de" if rule == "german" or overflowed else "a")
        assert ("overflow_from" in d) == overflowed


def _six_leads(cfg: OrgConfig, grouped_first: bool) -> tuple[str, list[int], list[int | None]]:
    """Six leads picked from team a; grouped before the batch's instant is stamped (as the
    router does before the team's lock) or after it (as it does under the lock)."""
    rec = DecisionRecorder(cfg, compile_rules(cfg.rules))
    for lead_id, country in ((1, "US"), (2, "US"), (3, "DE"), (4, "US"), (5, "US"), (6, "US")):
        rec.started(lead_id, "api", {"Country": country})
    rec.detail(4)["sla_minutes"] = 5  # another SLA
    rec.away_by_command(5, ["005A"])  # its own part
    rec.detail(6)["note"] = "x"  # a key the grouping does not know
    picks = [(i, 1) for i in (1, 2, 3, 4, 5, 6)]
    grouped = rec.group_picked("a", picks) if grouped_first else None
    rec.judged_at([1, 2, 3, 4, 5, 6], MONDAY, 1)
    grouped = grouped or rec.group_picked("a", picks)
    return rec.shared(grouped), grouped.positions, grouped.slas


@pytest.mark.parametrize("grouped_first", [False, True], ids=["under the lock", "before it"])
def test_shared_holds_once_the_decisions_with_nothing_of_their_own(grouped_first: bool) -> None:
    cfg = org(TEAMS)
    details, positions, slas = _six_leads(cfg, grouped_first)
    parts = json.loads(details)
    assert positions == [0, 0, 1, 2, 3, 4]
    assert parts[2]["sla_minutes"] == 5 and parts[3]["away_by_command"] == ["005A"]
    assert parts[4]["note"] == "x" and "note" not in parts[0]
    assert slas == [None] * 6
    # the pick's part goes in columns: no batch in the JSON, the team and outcome are there
    assert all("batch" not in d and (d["team"], d["outcome"]) == ("a", "assigned") for d in parts)
    assert parts[0]["at"] == MONDAY.isoformat()
    # the same text whichever side of the lock the grouping was made
    assert (details, positions, slas) == _six_leads(cfg, not grouped_first)
    rec = DecisionRecorder(cfg, compile_rules(cfg.rules))
    assert rec.shared(rec.group_picked("a", [])) == "[]"
