"""connector.routing.rotation.pick_available: caps, absences and the catch-up policies (pure).

Each guarantee written in rotation.py's docstring is checked here with Hypothesis over random
teams, random availability that changes between picks, and random caps; and the fast picker
is compared with a slow reference model of the documented rule.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from dataclasses import dataclass, field
from fractions import Fraction

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from connector.routing.rotation import (
    Seat,
    Turn,
    _picks,
    limits_runs,
    next_owners,
    pick_available,
)

AWAY_OR_OFF = st.sampled_from(["away", "off_shift"])


def seats(weights: list[int], turns: list[int] | None = None) -> list[Seat]:
    turns = turns or [0] * len(weights)
    return [Seat(100 + i, w, t, i) for i, (w, t) in enumerate(zip(weights, turns, strict=True))]


@dataclass
class Team:
    """A team's rotation state between picks, advanced the way Postgres advances it."""

    weights: list[int]
    turns: dict[int, int] = field(default_factory=dict)
    leads: list[int | None] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.turns = self.turns or {100 + i: 0 for i in range(len(self.weights))}

    def seats(self) -> list[Seat]:
        return [Seat(100 + i, w, self.turns[100 + i], i) for i, w in enumerate(self.weights)]

    def pick(
        self,
        blocked: dict[int, str],
        room: dict[int, int | None],
        count: int,
        k: int | None = None,
    ) -> list[Turn]:
        recent = [m for m in reversed(self.leads) if m is not None]
        picks = pick_available(self.seats(), blocked, room, count, max_in_a_row=k, recent=recent)
        for m, n in picks.credited.items():
            self.turns[m] += n
        for t in picks.turns:
            if t.member_id is not None:
                self.turns[t.member_id] += 1
            self.leads.append(t.member_id)
        return picks.turns

    def lags(self) -> dict[int, Fraction]:
        total, slot = sum(self.weights), sum(self.turns.values())
        return {
            100 + i: Fraction(slot * w, total) - self.turns[100 + i]
            for i, w in enumerate(self.weights)
        }


# One step: which reps are away or off shift, each rep's room under its caps, how many leads.
@st.composite
def steps(draw: st.DrawFn, n: int, allow_away: bool = True) -> list[tuple[dict, dict, int]]:
    out = []
    for _ in range(draw(st.integers(1, 12))):
        blocked = {}
        room: dict[int, int | None] = {}
        for i in range(n):
            if allow_away and draw(st.integers(0, 4)) == 0:
                blocked[100 + i] = draw(AWAY_OR_OFF)
            room[100 + i] = draw(st.one_of(st.none(), st.integers(0, 6)))
        out.append((blocked, room, draw(st.integers(1, 15))))
    return out


team_st = st.lists(st.integers(1, 8), min_size=1, max_size=8)


def test_the_docstring_example_none() -> None:
    t = Team([1, 1, 1, 1])
    turns = t.pick({102: "away"}, {}, 8)
    assert [x.member_id for x in turns] == [100, 101, 103, 100, 101, 103, 100, 101]
    assert t.turns == {100: 3, 101: 3, 102: 2, 103: 2}  # the away rep was credited its turns
    assert turns[0].candidates == ((100, None), (101, None), (102, "away"), (103, None))


def test_a_cap_is_reached_inside_a_batch() -> None:
    t = Team([1, 1, 1])
    turns = t.pick({}, {100: 1, 101: None, 102: 2}, 6)
    assert [x.member_id for x in turns] == [100, 101, 102, 101, 102, 101]
    assert turns[3].candidates == ((100, "capped"), (101, None), (102, None))
    assert turns[5].candidates == ((100, "capped"), (101, None), (102, "capped"))


def test_nobody_can_take_it() -> None:
    t = Team([1, 2])
    turns = t.pick({100: "away"}, {101: 0}, 2)
    assert [x.member_id for x in turns] == [None, None]
    assert turns[0].candidates == ((101, "capped"), (100, "away"))
    assert t.turns == {100: 0, 101: 0}  # nothing credited when nothing is handed out
    assert pick_available([], {}, {}, 3).turns == [Turn(None, ())] * 3


def test_catch_up_example() -> None:
    # 102 was away for ten leads under catch_up {max_in_a_row: 2}: it comes back 3.3 behind
    t = Team([1, 1, 1], turns={100: 5, 101: 5, 102: 0})
    turns = t.pick({}, {}, 10, k=2)
    assert [x.member_id for x in turns] == [102, 102, 100, 102, 102, 101, 102, 102, 100, 101]
    assert max(abs(v) for v in t.lags().values()) < 1


@pytest.mark.parametrize("weight", [0, -2])
def test_non_positive_weight_is_an_error(weight: int) -> None:
    with pytest.raises(ValueError, match=r"^weights must be positive$"):
        pick_available(seats([1, weight]), {}, {}, 1)


@settings(max_examples=200, deadline=None)
@given(weights=team_st, warmup=st.integers(0, 100), count=st.integers(1, 80))
def test_with_everyone_available_it_is_the_plain_rotation(
    weights: list[int], warmup: int, count: int
) -> None:
    base = seats(weights)
    got = Counter(next_owners(base, 0, warmup))
    start = [Seat(s.member_id, s.weight, got[s.member_id], s.position) for s in base]
    for k in (None, 1, 3):
        picks = pick_available(start, {}, {}, count, max_in_a_row=k)
        assert [t.member_id for t in picks.turns] == next_owners(start, warmup, count)
        assert picks.credited == {}


@settings(max_examples=200, deadline=None)
@given(data=st.data(), weights=team_st)
def test_none_keeps_every_rep_within_one_turn_and_respects_availability(
    data: st.DataObject, weights: list[int]
) -> None:
    t = Team(weights)
    for blocked, room, count in data.draw(steps(len(weights))):
        before = dict(t.turns)
        turns = t.pick(blocked, room, count)
        got = Counter(x.member_id for x in turns)
        for m, n in got.items():
            if m is None:
                continue
            assert m not in blocked
            assert room[m] is None or n <= room[m]  # never past a cap, even inside a batch
        for x in turns:
            if x.member_id is None:  # nobody could take it
                assert all(r is not None for _, r in x.candidates)
        assert all(abs(v) < 1 for v in t.lags().values()), (weights, before, t.turns)


@settings(max_examples=200, deadline=None)
@given(data=st.data(), n=st.integers(1, 7))
def test_none_equal_weights_reps_available_throughout_a_run_differ_by_at_most_one(
    data: st.DataObject, n: int
) -> None:
    t = Team([1] * n)
    available: list[set[int]] = []  # per lead: who could take it
    for blocked, room, count in data.draw(steps(n)):
        for x in t.pick(blocked, room, count):
            available.append({m for m, r in x.candidates if r is None})
    leads = t.leads
    for a in range(len(leads)):
        both = set(available[a])
        counts: Counter[int] = Counter()
        for b in range(a, len(leads)):
            both &= available[b]
            if len(both) < 2:
                break
            counts[leads[b]] += 1  # type: ignore[index]
            got = [counts[m] for m in both]
            assert max(got) - min(got) <= 1, (a, b, leads[a : b + 1])


@settings(max_examples=200, deadline=None)
@given(data=st.data(), weights=team_st, k=st.integers(1, 4))
def test_catch_up_never_gives_more_than_k_in_a_row_and_serves_behind_reps_first(
    data: st.DataObject, weights: list[int], k: int
) -> None:
    t = Team(weights)
    for blocked, room, count in data.draw(steps(len(weights))):
        for _ in range(count):
            lags = t.lags()
            last = [m for m in reversed(t.leads) if m is not None][:k]
            (x,) = t.pick(blocked, room, 1, k=k)
            if x.member_id is None:
                continue
            assert x.member_id not in blocked
            assert room[x.member_id] is None or room[x.member_id] > 0
            if room[x.member_id] is not None:
                room[x.member_id] -= 1  # type: ignore[operator]
            free = [m for m, r in x.candidates if r is None]
            behind = [m for m in free if lags[m] >= 1]
            streak = len(last) == k and set(last) == {x.member_id}
            limited = limits_runs(k, weights[x.member_id - 100], sum(weights))
            if streak and lags[x.member_id] >= 0 and limited:
                assert free == [x.member_id], "a (K+1)-th lead in a row, not ahead of share"
            if behind and lags[x.member_id] < 1:  # a behind rep was passed over: only
                assert all(len(last) == k and set(last) == {b} for b in behind)  # K in a row


@settings(max_examples=150, deadline=None)
@given(
    weights=team_st,
    away=st.integers(0, 7),
    gone=st.integers(1, 60),
    k=st.integers(1, 4),
)
def test_catch_up_brings_a_returning_rep_back_within_one(
    weights: list[int], away: int, gone: int, k: int
) -> None:
    rep = 100 + away % len(weights)
    share = Fraction(weights[rep - 100], sum(weights))
    # Each K+1 leads pay K - (K+1) * share of the debt; that must be positive (docs/routing.md
    # says so, and check-config warns when it is not, e.g. K = 1 with two equal reps).
    gain = k - (k + 1) * share
    assume(gain > 0)
    t = Team(weights)
    t.pick({rep: "away"} if len(weights) > 1 else {}, {}, gone, k=k)
    lags = t.lags()
    debt = max(lags.values())
    t.pick({}, {}, math.ceil(debt / gain + 2) * (k + 1) + 2 * sum(weights), k=k)
    assert all(abs(v) < 1 for v in t.lags().values()), (lags, t.turns)


def test_catch_up_does_not_hold_a_heavy_rep_below_its_share() -> None:
    """Weights 1, 1, 5 with K = 1 (found by Hypothesis): 5 of every 7 leads cannot come one
    at a time, so K does not apply to the heavy rep. Refusing it a second lead in a row kept it
    below its share for ever (4.4 leads behind after 37, and growing) while the light reps were
    over-served; now everyone ends within one, after a light rep's time away too."""
    assert not limits_runs(1, 5, 7) and limits_runs(1, 1, 7) and limits_runs(2, 2, 3)
    t = Team([1, 1, 5])
    t.pick({100: "away"}, {}, 13, k=1)
    assert t.lags()[100] == Fraction(13, 7)  # owed its share of the 13 leads
    t.pick({}, {}, 24, k=1)
    assert all(abs(v) < 1 for v in t.lags().values()), t.lags()
    runs = [len(list(g)) for m, g in itertools.groupby(t.leads[13:]) if m == 100]
    assert max(runs) == 1  # the returning light rep still gets at most K in a row
    # nobody away: exactly the `none` rotation, runs of the heavy rep included
    a, b = Team([1, 1, 5]), Team([1, 1, 5])
    assert [x.member_id for x in a.pick({}, {}, 70, k=1)] == [
        x.member_id for x in b.pick({}, {}, 70)
    ]


def test_catch_up_cannot_pay_a_debt_when_k_leads_in_a_row_are_no_more_than_the_share() -> None:
    # K = 1, two equal reps: they alternate, and the debt stays where it was (never grows)
    t = Team([1, 1], turns={100: 0, 101: 3})
    t.pick({}, {}, 10, k=1)
    assert t.lags() == {100: Fraction(3, 2), 101: Fraction(-3, 2)}


@settings(max_examples=150, deadline=None)
@given(data=st.data(), weights=team_st, k=st.integers(1, 4))
def test_catch_up_credits_capped_and_off_shift_reps_like_none(
    data: st.DataObject, weights: list[int], k: int
) -> None:
    """Without anyone away, the catch-up policy is the `none` rotation, pick for pick."""
    a, b = Team(weights), Team(weights)
    for blocked, room, count in data.draw(steps(len(weights))):
        off = {m: "off_shift" for m in blocked}
        assert [x.member_id for x in a.pick(off, room, count, k=k)] == [
            x.member_id for x in b.pick(off, room, count)
        ]
    assert a.turns == b.turns


def _reference(
    team: list[Seat],
    blocked: dict[int, str],
    room: dict[int, int | None],
    count: int,
    k: int | None,
    recent: list[int],
) -> tuple[list[int | None], dict[int, int]]:
    """The documented rule written the slow, obvious way, with exact fractions: every slot,
    compute every rep's share; a rep is due when its next turn's share has started; the due
    rep whose next turn is owed soonest wins; a credited winner's turn is skipped."""
    total = sum(s.weight for s in team)
    order = sorted(team, key=lambda s: (-s.weight, s.position, s.member_id))
    turns = {s.member_id: s.assigned for s in team}
    left = dict(room)
    history = list(recent)
    credited: Counter[int] = Counter()
    out: list[int | None] = []

    def share(s: Seat, slot: int) -> Fraction:
        return Fraction(slot * s.weight, total)

    def owed_by(s: Seat) -> int:  # the first slot count at which its next turn is fully owed
        return math.ceil(Fraction((turns[s.member_id] + 1) * total, s.weight))

    for _ in range(count):
        free = [s for s in order if s.member_id not in blocked and left.get(s.member_id) != 0]
        if not free:
            out.append(None)
            continue
        passed = [
            s for s in order if s not in free and (blocked.get(s.member_id) != "away" or k is None)
        ]
        slot = sum(turns.values())
        skip = None
        if k and len(free) > 1 and len(history) >= k and len(set(history[:k])) == 1:
            r = next((s for s in free if s.member_id == history[0]), None)
            # K+1 in a row is refused to a rep at or below its share, if its share is at
            # most K of every K+1 leads (a heavier one needs longer runs for its share)
            light = Fraction(r.weight, total) <= Fraction(k, k + 1) if r else False
            if r is not None and share(r, slot) - turns[r.member_id] >= 0 and light:
                skip = r.member_id
        while True:
            slot = sum(turns.values())
            due = [
                s
                for s in free + passed
                if s.member_id != skip and share(s, slot + 1) > turns[s.member_id]
            ]
            if due:
                best = min(due, key=lambda s: (owed_by(s), order.index(s)))
                if best in passed:
                    turns[best.member_id] += 1
                    credited[best.member_id] += 1
                    continue
            else:
                best = min(
                    (s for s in free if s.member_id != skip),
                    key=lambda s: (owed_by(s), order.index(s)),
                )
            break
        turns[best.member_id] += 1
        if left.get(best.member_id) is not None:
            left[best.member_id] -= 1  # type: ignore[operator]
        history.insert(0, best.member_id)
        out.append(best.member_id)
    return out, dict(credited)


@settings(max_examples=300, deadline=None)
@given(
    data=st.data(),
    weights=st.lists(st.integers(1, 10), min_size=1, max_size=8),
    k=st.one_of(st.none(), st.integers(1, 4)),
)
def test_the_picker_equals_the_reference_rule(
    data: st.DataObject, weights: list[int], k: int | None
) -> None:
    turns = data.draw(st.lists(st.integers(0, 30), min_size=len(weights), max_size=len(weights)))
    team = seats(weights, turns)
    blocked = data.draw(st.dictionaries(st.sampled_from([s.member_id for s in team]), AWAY_OR_OFF))
    room = {s.member_id: data.draw(st.one_of(st.none(), st.integers(0, 5))) for s in team}
    recent = data.draw(st.lists(st.sampled_from([s.member_id for s in team]), max_size=5))
    count = data.draw(st.integers(1, 30))
    picks = pick_available(team, blocked, room, count, max_in_a_row=k, recent=recent)
    expected, credited = _reference(team, blocked, room, count, k, recent)
    assert [t.member_id for t in picks.turns] == expected
    assert picks.credited == credited


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(1, 6), min_size=1, max_size=8),
    st.data(),
    st.integers(1, 60),
)
def test_unconstrained_fast_path_equals_the_lead_by_lead_loop(
    weights: list[int], data: st.DataObject, count: int
) -> None:
    """With nobody blocked, no cap that can bind and no catch-up, pick_available takes the
    plain rotation (next_owners); the lead-by-lead loop must pick exactly the same."""
    n = len(weights)
    turns = data.draw(st.lists(st.integers(0, 40), min_size=n, max_size=n))
    positions = data.draw(st.permutations(list(range(n))))
    rows = zip(weights, turns, positions, strict=True)
    team = [Seat(100 + i, w, t, p) for i, (w, t, p) in enumerate(rows)]
    room = {
        s.member_id: data.draw(st.one_of(st.none(), st.integers(count, count + 3))) for s in team
    }
    fast = pick_available(team, {}, room, count)
    loop = _picks(team, {}, room, count, None, ())
    assert fast == loop
