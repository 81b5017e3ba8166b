"""plan_batches, backoff_delay and the rolling-window limiter: examples and properties."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crm_adapters.base import OwnerWrite
from crm_adapters.batching import backoff_delay, plan_batches
from crm_adapters.ratelimit import MAX_HOLD_S, RollingWindowLimiter
from tests.helpers.clocks import Ticks


def _writes(parents: Sequence[str | None]) -> list[OwnerWrite]:
    return [OwnerWrite(f"k{i}", f"r{i}", "o", p) for i, p in enumerate(parents)]


def test_sorted_by_parent_and_cut_into_full_batches() -> None:
    ws = _writes(["b", "a", "b", None, "a", "c"])
    batches = plan_batches(ws, 3)
    assert [[w.parent_id for w in b] for b in batches] == [["a", "a", "b"], ["b", "c", None]]


def test_a_large_parent_fills_consecutive_batches() -> None:
    ws = _writes(["a"] + ["big"] * 5 + ["c"])
    batches = plan_batches(ws, 2)
    assert [[w.parent_id for w in b] for b in batches] == [
        ["a", "big"],
        ["big", "big"],
        ["big", "big"],
        ["c"],
    ]


def test_parentless_writes_fill_batches_last() -> None:
    batches = plan_batches(_writes([None, None, None, "p"]), 2)
    assert [[w.parent_id for w in b] for b in batches] == [["p", None], [None, None]]


def test_empty_and_invalid() -> None:
    assert plan_batches([], 10) == []
    with pytest.raises(ValueError):
        plan_batches(_writes(["a"]), 0)


parents = st.lists(st.one_of(st.none(), st.sampled_from("abcdefgh")), max_size=120)


@settings(max_examples=200, deadline=None)
@given(parents=parents, max_batch=st.integers(min_value=1, max_value=25))
def test_plan_batches_properties(parents: list[str | None], max_batch: int) -> None:
    ws = _writes(parents)
    batches = plan_batches(ws, max_batch)
    flat = [w for b in batches for w in b]
    # every write exactly once, no empty batch, sizes bounded
    assert sorted(w.key for w in flat) == sorted(w.key for w in ws)
    assert all(0 < len(b) <= max_batch for b in batches)
    # every request but the last is full: the fewest requests possible
    assert all(len(b) == max_batch for b in batches[:-1])
    assert len(batches) == -(-len(ws) // max_batch)
    # a parent's writes are contiguous across the plan (sent one request after another)
    seq = [w.parent_id for w in flat if w.parent_id is not None]
    assert all(
        seq.index(p) + seq.count(p) - 1 == len(seq) - 1 - seq[::-1].index(p) for p in set(seq)
    )
    # inside every request: parents ascending, parentless last; deterministic
    for b in batches:
        order = [w.parent_id for w in b]
        named = [p for p in order if p is not None]
        assert named == sorted(named)
        assert order == named + [None] * (len(order) - len(named))
    assert plan_batches(ws, max_batch) == batches


@given(
    attempt=st.integers(min_value=0, max_value=10_000),
    base=st.floats(min_value=0.01, max_value=5),
    cap=st.floats(min_value=0.1, max_value=120),
    r=st.floats(min_value=0, max_value=0.999999),
)
def test_backoff_is_bounded_full_jitter(attempt: int, base: float, cap: float, r: float) -> None:
    d = backoff_delay(attempt, base=base, cap=cap, rng=lambda: r)
    assert 0 <= d <= min(cap, base * 2.0 ** min(attempt, 62))


def test_backoff_examples_and_retry_after() -> None:
    assert backoff_delay(0, rng=lambda: 0.999) == pytest.approx(0.4995)
    assert backoff_delay(3, rng=lambda: 0.5) == pytest.approx(2.0)
    assert backoff_delay(50, rng=lambda: 1.0) == 60.0
    assert backoff_delay(0, rng=lambda: 0.0, retry_after=7.0) == 7.0
    assert 30.0 <= backoff_delay(1, rng=lambda: 0.9, retry_after=30.0) <= 30.5


def test_limiter_rolling_window() -> None:
    clock = Ticks()
    lim = RollingWindowLimiter(3, 10.0, clock=clock, sleep=clock.sleep)
    assert [lim.try_acquire() for _ in range(3)] == [0.0, 0.0, 0.0]
    assert lim.try_acquire() == pytest.approx(10.0)
    clock.now += 4
    assert lim.try_acquire() == pytest.approx(6.0)
    waited = lim.acquire()  # sleeps on the fake clock until the oldest slot expires
    assert waited == pytest.approx(6.0) and lim.in_window() == 1
    assert lim.waited_s == pytest.approx(6.0)


def test_limiter_learns_a_lower_limit_and_calls_it_did_not_make() -> None:
    clock = Ticks()
    lim = RollingWindowLimiter(100, 10.0, clock=clock, sleep=clock.sleep)
    assert lim.try_acquire() == 0.0
    lim.observe(4, 1)  # the server counts 3 in its window: two came from elsewhere
    assert lim.limit == 4 and lim.in_window() == 3
    lim.observe(4, 2)  # an older answer: counts are compared, never added
    assert lim.in_window() == 3
    assert lim.try_acquire() == 0.0
    assert lim.try_acquire() == pytest.approx(10.0)  # full: wait for the window
    lim.observe(200, 199)  # the limit never rises above the configured one
    assert lim.limit == 100
    lim.observe(0, 5)  # nonsense is ignored
    lim.observe(5, -1)
    assert lim.limit == 100 and lim.in_window() == 4


def test_limiter_counts_others_calls_from_when_the_call_was_sent() -> None:
    clock = Ticks()
    lim = RollingWindowLimiter(100, 10.0, clock=clock, sleep=clock.sleep)
    for _ in range(4):
        assert lim.try_acquire() == 0.0
    sent = clock.now
    clock.now += 3.0  # a slow answer: the server counted 10 when the call arrived
    lim.observe(100, 90, sent_at=sent)
    assert lim.in_window() == 10
    clock.now = sent + 10.0  # they leave the window with the call's own, not 3 s later
    assert lim.in_window() == 0
    lim.observe(100, 0, sent_at=clock.now - 12.0)  # an answer older than a window: no count
    assert lim.in_window() == 0


def test_limiter_waits_exactly_for_enough_stamps_to_leave() -> None:
    clock = Ticks()
    lim = RollingWindowLimiter(10, 10.0, clock=clock, sleep=clock.sleep)
    for _ in range(4):
        assert lim.try_acquire() == 0.0
        clock.now += 1.0
    lim.observe(3, 0)  # the real limit is 3, and the server counts 3: we hold 4 stamps
    # the oldest two must leave (at +10 and +11 from the first): one wake-up, not two
    assert lim.try_acquire() == pytest.approx(11.0 - 4.0)


def test_limiter_hold_is_capped_and_refuses_nonsense() -> None:
    clock = Ticks()
    lim = RollingWindowLimiter(3, 10.0, clock=clock, sleep=clock.sleep)
    lim.hold(float("inf"))
    assert lim.held_for() == pytest.approx(MAX_HOLD_S)
    clock.now += MAX_HOLD_S
    assert lim.try_acquire() == 0.0
    lim.hold(float("nan"))
    assert lim.held_for() == pytest.approx(MAX_HOLD_S)
    clock.now += MAX_HOLD_S
    lim.hold(3600.0)
    assert lim.held_for() == pytest.approx(MAX_HOLD_S)


def test_limiter_hold_blocks_every_slot_until_it_ends() -> None:
    clock = Ticks()
    lim = RollingWindowLimiter(3, 10.0, clock=clock, sleep=clock.sleep)
    lim.hold(2.5)
    assert lim.held_for() == pytest.approx(2.5)
    assert lim.try_acquire() == pytest.approx(2.5) and lim.in_window() == 0
    lim.hold(1.0)  # a shorter hold never shortens a longer one
    assert lim.held_for() == pytest.approx(2.5)
    assert lim.acquire() == pytest.approx(2.5)  # sleeps on the fake clock, then takes a slot
    assert lim.held_for() == 0.0 and lim.in_window() == 1


def test_limiter_is_thread_safe() -> None:
    clock = Ticks()
    lim = RollingWindowLimiter(37, 10.0, clock=clock, sleep=clock.sleep)
    granted: list[int] = []
    lock = threading.Lock()

    def worker() -> None:
        n = sum(1 for _ in range(50) if lim.try_acquire() == 0.0)
        with lock:
            granted.append(n)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(granted) == 37
