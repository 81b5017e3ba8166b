"""connector.routing.rotation: weighted round robin with a hard fairness bound (pure, no I/O)."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from connector.routing.rotation import Seat, _pfair, max_lag, next_owners


def seats(weights: list[int], assigned: list[int] | None = None) -> list[Seat]:
    assigned = assigned or [0] * len(weights)
    return [Seat(100 + i, w, a, i) for i, (w, a) in enumerate(zip(weights, assigned, strict=True))]


def advance(current: list[Seat], picks: list[int]) -> list[Seat]:
    got = Counter(picks)
    return [Seat(s.member_id, s.weight, s.assigned + got[s.member_id], s.position) for s in current]


def test_equal_weights_are_plain_round_robin_in_position_order() -> None:
    # listed out of position order: position decides, not the list order or the id
    team = [Seat(7, 1, 0, 2), Seat(9, 1, 0, 0), Seat(8, 1, 0, 1)]
    assert next_owners(team, 0, 7) == [9, 8, 7, 9, 8, 7, 9]


def test_equal_weights_continue_from_the_counts() -> None:
    team = seats([1, 1, 1], [1, 1, 0])
    assert next_owners(team, 2, 4) == [102, 100, 101, 102]


def test_weighted_order() -> None:
    # earliest deadline first; equal deadlines go to the heavier seat
    assert next_owners(seats([1, 2]), 0, 6) == [101, 101, 100, 101, 101, 100]
    assert next_owners(seats([3, 1]), 0, 8) == [100, 100, 100, 101, 100, 100, 100, 101]


def test_weighted_counts_match_shares_over_a_full_cycle() -> None:
    weights = [5, 3, 1, 1]
    picks = next_owners(seats(weights), 0, 10 * sum(weights))
    assert [picks.count(100 + i) for i in range(4)] == [50, 30, 10, 10]


def test_zero_count_returns_nothing_even_without_seats() -> None:
    assert next_owners([], 0, 0) == []
    assert next_owners(seats([1]), 0, -3) == []


def test_no_seats_is_an_error() -> None:
    with pytest.raises(ValueError, match=r"^team has no active member$"):
        next_owners([], 0, 1)


@pytest.mark.parametrize("weight", [0, -1])
def test_non_positive_weight_is_an_error(weight: int) -> None:
    with pytest.raises(ValueError, match=r"^weights must be positive$"):
        next_owners(seats([1, weight]), 0, 1)


def test_count_mismatch_is_an_error() -> None:
    with pytest.raises(ValueError, match=r"^team_assigned does not match the members' counts$"):
        next_owners(seats([1, 1], [2, 1]), 4, 1)


def test_max_lag() -> None:
    assert max_lag([1, 1], [0, 0]) == 0
    assert max_lag([1, 1], [2, 0]) == 1
    assert max_lag([1, 3], [1, 3]) == 0
    assert max_lag([], []) == 0


weights_st = st.lists(st.integers(1, 50), min_size=1, max_size=30)


@settings(max_examples=150, deadline=None)
@given(weights=weights_st, warmup=st.integers(0, 300), n=st.integers(1, 200))
def test_every_pick_keeps_every_seat_strictly_within_one_lead(
    weights: list[int], warmup: int, n: int
) -> None:
    # the starting point is one the algorithm itself reaches
    start = advance(seats(weights), next_owners(seats(weights), 0, warmup))
    counts = {s.member_id: s.assigned for s in start}
    ids = [s.member_id for s in start]
    for pick in next_owners(start, warmup, n):
        counts[pick] += 1
        lag = max_lag(weights, [counts[i] for i in ids])
        assert lag < 1, (weights, warmup, counts)


@settings(max_examples=150, deadline=None)
@given(
    weights=weights_st,
    start_n=st.integers(0, 200),
    a=st.integers(0, 100),
    b=st.integers(0, 100),
)
def test_batching_does_not_change_the_order(
    weights: list[int], start_n: int, a: int, b: int
) -> None:
    s = advance(seats(weights), next_owners(seats(weights), 0, start_n))
    first = next_owners(s, start_n, a)
    rest = next_owners(advance(s, first), start_n + a, b)
    assert next_owners(s, start_n, a + b) == first + rest


def _reference(seats_: list[Seat], team_assigned: int, count: int) -> list[int]:
    """The rule written the slow, obvious way: scan every seat at every slot."""
    total = sum(s.weight for s in seats_)
    counts = {s.member_id: s.assigned for s in seats_}
    order = sorted(seats_, key=lambda s: (-s.weight, s.position, s.member_id))
    picks = []
    for slot in range(team_assigned, team_assigned + count):
        eligible = [s for s in order if counts[s.member_id] * total // s.weight <= slot]
        best = min(eligible, key=lambda s: -(-(counts[s.member_id] + 1) * total // s.weight))
        counts[best.member_id] += 1
        picks.append(best.member_id)
    return picks


@given(
    weights=st.lists(st.integers(1, 20), min_size=1, max_size=15),
    start=st.integers(0, 200),
    count=st.integers(1, 120),
)
@settings(max_examples=200, deadline=None)
def test_the_heap_rotation_equals_the_reference_rule(
    weights: list[int], start: int, count: int
) -> None:
    base = seats(weights)
    s = advance(base, next_owners(base, 0, start)) if start else base
    assert next_owners(s, start, count) == _reference(s, start, count)


@given(
    n=st.integers(1, 12),
    weight=st.integers(1, 9),
    counts=st.data(),
    count=st.integers(1, 150),
)
@settings(max_examples=300, deadline=None)
def test_equal_weights_take_the_round_robin_without_heaps_from_any_state(
    n: int, weight: int, counts: st.DataObject, count: int
) -> None:
    """Equal weights go through ``_round_robin``: pick for pick what the heaps and the slow
    reference rule give, from any counts (unbalanced ones included, as a rep that joins a
    team mid-epoch starts), with positions out of id order."""
    done = counts.draw(st.lists(st.integers(0, 40), min_size=n, max_size=n))
    positions = counts.draw(st.permutations(list(range(n))))
    team = [
        Seat(100 + i, weight, d, p) for i, (d, p) in enumerate(zip(done, positions, strict=True))
    ]
    got = next_owners(team, sum(done), count)
    order = sorted(team, key=lambda s: (s.position, s.member_id))
    assert got == _pfair(order, [s.assigned for s in order], n * weight, sum(done), count)
    assert got == _reference(team, sum(done), count)
