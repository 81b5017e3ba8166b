"""The server's rotation (``rotation_picks``, db/migrations) picks exactly as the executable
specification ``connector.routing.rotation.pick_available`` does, on real PostgreSQL.

Checked with Hypothesis over random teams, weights, turns, availability, caps and catch-up:
a batch of leads in one call (each lead's pick, its candidates' skip reasons, the counts a
decision records, the credits), and leads one call at a time with the state each leaves
feeding the next, on both sides. Inactive members listed after the rotation's seats change
nothing but the decisions' lists.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Connection, Engine, text

from connector.routing.rotation import Seat, pick_available

PICKS = text(
    "SELECT picks, skips, counts, credit_ids, credit_ns FROM rotation_picks("
    "CAST(:ids AS bigint[]), CAST(:weights AS integer[]), CAST(:turns AS bigint[]), "
    "CAST(:blocked AS text[]), CAST(:room AS integer[]), CAST(:active AS integer), "
    "CAST(:k AS integer), CAST(:recent AS bigint[]), CAST(:count AS integer))"
)

SLOW = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@st.composite
def team_states(draw: st.DrawFn) -> dict[str, Any]:
    n = draw(st.integers(0, 6))
    ids = [100 + i for i in range(n)]
    return {
        "ids": ids,
        "weights": draw(st.lists(st.integers(1, 5), min_size=n, max_size=n)),
        "turns": draw(st.lists(st.integers(0, 12), min_size=n, max_size=n)),
        "positions": draw(st.permutations(list(range(n)))),
        "blocked": draw(
            st.lists(st.sampled_from([None, None, "away", "off_shift"]), min_size=n, max_size=n)
        ),
        "room": draw(st.lists(st.sampled_from([None, None, 0, 1, 2]), min_size=n, max_size=n)),
        "k": draw(st.sampled_from([None, 1, 2, 3])),
        "recent": draw(st.lists(st.sampled_from(ids), max_size=4)) if ids else [],
        "inactive": draw(st.integers(0, 2)),
    }


def python_picks(s: dict[str, Any], count: int) -> dict[str, Any]:
    """What the specification says for ``count`` leads, in the server's shape: per lead the
    pick, every seat's skip reason and its count (turns advanced by the picks), in the
    rotation's order, then the inactive members."""
    seats = [
        Seat(i, w, t, p)
        for i, w, t, p in zip(s["ids"], s["weights"], s["turns"], s["positions"], strict=True)
    ]
    blocked = {i: b for i, b in zip(s["ids"], s["blocked"], strict=True) if b}
    room = dict(zip(s["ids"], s["room"], strict=True))
    got = pick_available(seats, blocked, room, count, max_in_a_row=s["k"], recent=s["recent"])
    order = sorted(seats, key=lambda x: (-x.weight, x.position, x.member_id))
    counts = {x.member_id: x.assigned for x in order}
    inactive = [(900 + i, "inactive", 7) for i in range(s["inactive"])]
    out: list[tuple[int | None, list[tuple[int, str | None]], list[int]]] = []
    for turn in got.turns:
        skips = dict(turn.candidates)
        row = [(x.member_id, skips[x.member_id]) for x in order]
        out.append(
            (
                turn.member_id,
                row + [(i, why) for i, why, _ in inactive],
                [counts[x.member_id] for x in order] + [c for _, _, c in inactive],
            )
        )
        if turn.member_id is not None:
            counts[turn.member_id] += 1
    return {"leads": out, "credited": got.credited}


def sql_picks(conn: Connection, s: dict[str, Any], count: int) -> dict[str, Any]:
    """The server's picks for the same state: the seats sent in the rotation's order."""
    order = sorted(
        range(len(s["ids"])), key=lambda i: (-s["weights"][i], s["positions"][i], s["ids"][i])
    )
    extra = range(s["inactive"])
    params = {
        "ids": [s["ids"][i] for i in order] + [900 + i for i in extra],
        "weights": [s["weights"][i] for i in order] + [1 for _ in extra],
        "turns": [s["turns"][i] for i in order] + [7 for _ in extra],
        "blocked": [s["blocked"][i] for i in order] + ["inactive" for _ in extra],
        "room": [s["room"][i] for i in order] + [None for _ in extra],
        "active": len(order),
        "k": s["k"],
        "recent": s["recent"],
        "count": count,
    }
    r = conn.execute(PICKS, params).one()
    n = len(params["ids"])
    leads = [
        (
            r.picks[j],
            list(zip(params["ids"], r.skips[j * n : (j + 1) * n], strict=True)),
            list(r.counts[j * n : (j + 1) * n]),
        )
        for j in range(count)
    ]
    return {"leads": leads, "credited": dict(zip(r.credit_ids, r.credit_ns, strict=True))}


@pytest.fixture
def conn(engine: Engine) -> Iterator[Connection]:
    with engine.connect() as c:
        yield c


@SLOW
@given(team_states(), st.integers(1, 12))
def test_a_batch_of_picks_matches_pick_available(
    conn: Connection, s: dict[str, Any], count: int
) -> None:
    assert sql_picks(conn, s, count) == python_picks(s, count)


@settings(
    max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(team_states(), st.data())
def test_one_lead_at_a_time_matches_pick_available(
    conn: Connection, s: dict[str, Any], data: st.DataObject
) -> None:
    """Twenty leads in a row, availability and caps changing between them: the state each
    pick leaves (turns, credits, room, the latest owners) feeds the next, on both sides."""
    for _ in range(20):
        got = sql_picks(conn, s, 1)
        assert got == python_picks(s, 1)
        ((member, _, _),) = got["leads"]
        turns = dict(zip(s["ids"], s["turns"], strict=True))
        for m, n in got["credited"].items():
            turns[m] += n
        if member is not None:
            turns[member] += 1
            i = s["ids"].index(member)
            if s["room"][i] is not None:
                s["room"][i] -= 1
            s["recent"] = [member, *s["recent"]][:4]
        s["turns"] = [turns[m] for m in s["ids"]]
        n = len(s["ids"])
        s["blocked"] = data.draw(
            st.lists(
                st.sampled_from([None, None, None, "away", "off_shift"]), min_size=n, max_size=n
            )
        )


def test_a_heavy_rep_runs_as_pick_available_lets_it(conn: Connection) -> None:
    """Weights 1, 1, 5 with K = 1: the heavy rep's share is more than one of every two leads,
    so K does not apply to it (``rotation.limits_runs``); on both sides it gets its runs."""
    s = {
        "ids": [100, 101, 102],
        "weights": [1, 1, 5],
        "turns": [0, 0, 0],
        "positions": [0, 1, 2],
        "blocked": [None, None, None],
        "room": [None, None, None],
        "k": 1,
        "recent": [],
        "inactive": 0,
    }
    got = sql_picks(conn, s, 14)
    assert got == python_picks(s, 14)
    picks = [m for m, _, _ in got["leads"]]
    assert picks.count(102) == 10 and not got["credited"]
    assert any(a == b == 102 for a, b in itertools.pairwise(picks))


def test_nobody_to_pick_and_no_lead(conn: Connection) -> None:
    """Shapes at the edges: no seat, and no lead asked for."""
    s = {
        "ids": [],
        "weights": [],
        "turns": [],
        "positions": [],
        "blocked": [],
        "room": [],
        "k": None,
        "recent": [],
        "inactive": 1,
    }
    assert sql_picks(conn, s, 2) == python_picks(s, 2)
    assert python_picks(s, 2)["leads"] == [(None, [(900, "inactive")], [7])] * 2
    assert sql_picks(conn, s, 0) == python_picks(s, 0) == {"leads": [], "credited": {}}
