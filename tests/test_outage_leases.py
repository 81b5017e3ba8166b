"""connector/core/outage.py (what an outage writes to the log) and connector/core/leases.py
(the keeper's renewals), without a database."""

from __future__ import annotations

import logging
import threading

import pytest

from connector.core.errors import DatabaseError, DatabaseUnavailable
from connector.core.leases import HeldRows, LeaseKeeper
from connector.core.outage import Outage


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_an_outage_logs_its_start_summaries_and_end(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    o = Outage(logging.getLogger("test.outage"), summary_every_s=30.0, clock=clock)
    down = DatabaseUnavailable("database unavailable: connection refused\nmore detail")
    with caplog.at_level(logging.WARNING, logger="test.outage"):
        o.recovered()  # up: nothing
        assert o.counted("inbox rounds", down)
        for _ in range(500):
            clock.now += 0.05  # 25 s of failures
            assert o.counted("webhook deliveries", down)
        clock.now += 6.0
        assert o.counted("polls", down)  # 31 s after the start: a summary
        assert not o.counted("polls", DatabaseError("database error: X (SQLSTATE 42P01)"))
        clock.now += 1.5
        o.recovered()
        o.recovered()  # once
        clock.now += 1.0
        assert o.counted("shared CRM budget", down)  # a connection that died with it
        clock.now += 5.0
        assert o.counted("polls", down)  # past the aftermath: a new outage
    assert [r.getMessage() for r in caplog.records] == [
        "database unavailable (inbox rounds: database unavailable: connection refused); "
        "failures are counted until it is back, with a summary every 30 s",
        "database still unavailable after 31 s: 502 operations failed (inbox rounds 1, "
        "polls 1, webhook deliveries 500)",
        "database is back after 32.5 s: 502 operations failed meanwhile (inbox rounds 1, "
        "polls 1, webhook deliveries 500)",
        "database unavailable (polls: database unavailable: connection refused); failures "
        "are counted until it is back, with a summary every 30 s",
    ]
    assert o.late_failures == 1


def test_the_keeper_renews_until_the_block_ends() -> None:
    calls = threading.Semaphore(0)

    def renew() -> bool:
        calls.release()
        return True

    with LeaseKeeper(renew, lease_seconds=0.2) as keeper:
        for _ in range(3):  # every 0.05 s
            assert calls.acquire(timeout=5)
    assert keeper.renewals >= 3 and not keeper.lost
    assert keeper.since(0.0) == keeper.renewed_at
    assert keeper.since(None) is None


def test_the_keeper_stops_when_rows_were_taken_back_and_retries_errors() -> None:
    answers = iter([DatabaseUnavailable("down"), True, False])
    done = threading.Event()

    def renew() -> bool:
        answer = next(answers)
        if answer is False:
            done.set()
        if isinstance(answer, Exception):
            raise answer
        return answer

    with LeaseKeeper(renew, lease_seconds=0.2) as keeper:
        assert done.wait(5)
        keeper._thread.join(5)
    assert keeper.lost and keeper.renewals == 1
    assert keeper.since(123.0) is None  # the claim must stop


def test_held_rows_renew_only_what_is_not_finished() -> None:
    held = HeldRows([1, 2, 3])
    seen: list[list[int]] = []
    renew = held.renewal(lambda ids: seen.append(ids) or True)
    assert renew()
    with held.finishing([1, 3]):
        pass
    assert renew()
    with held.finishing([2]):
        pass
    assert renew()  # nothing held: nothing to renew
    assert seen == [[1, 2, 3], [2]]
