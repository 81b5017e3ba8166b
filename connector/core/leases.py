"""Short leases kept alive while a claim is worked on, for every claim queue (inbox events,
outbox rows, and any later one).

A claim's rows carry a lease (``lease_until``); a process that dies stops renewing it, and
once it ended another process takes the rows over (its next full claim frees expired
leases). So the lease can be short, and a dead process's rows wait about one lease, when
the living renew theirs from a thread every quarter of it while they work, however long a
CRM call takes. ``LeaseKeeper`` is that thread; what "renew" means (one statement on the
claim's rows) is the queue's own.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from types import TracebackType

from connector.core import outage

log = logging.getLogger(__name__)

DEFAULT_LEASE_S = 10.0
"""How long a claim of a process that died blocks its rows (renewed every quarter of it)."""


def renew_every(lease_seconds: float) -> float:
    """The keeper's period: a quarter of the lease, so a renewal missed by a slow database
    statement still leaves half a lease."""
    return lease_seconds / 4


class LeaseKeeper:
    """``with LeaseKeeper(renew, lease_seconds):`` calls ``renew()`` from a thread every
    quarter of the lease until the block ends. ``renew`` returns whether every row of the
    claim is still held: on False the keeper stops and ``lost`` is set (the claim must send
    nothing more). ``renewed_at`` is the monotonic time taken just before the latest
    successful renewal (or the keeper's start): the lease runs at least until
    ``renewed_at + lease_seconds``. A renewal that fails for another reason (the database
    unavailable) is tried again at the next period."""

    def __init__(
        self,
        renew: Callable[[], bool],
        lease_seconds: float,
        *,
        started_at: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        name: str = "lease-keeper",
    ) -> None:
        self.renew = renew
        self.every = renew_every(lease_seconds)
        self.clock = clock
        self.renewed_at = clock() if started_at is None else started_at
        self.renewals = 0
        self.lost = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def since(self, lease_from: float | None) -> float | None:
        """When the claim's lease started, given the caller's own idea of it (None: the
        claim stops): the keeper's latest renewal if later, None once it lost rows."""
        if lease_from is None or self.lost:
            return None
        return max(lease_from, self.renewed_at)

    def __enter__(self) -> LeaseKeeper:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            at = self.clock()
            try:
                held = self.renew()
            except Exception as exc:
                if not outage.counted("lease renewals", exc):
                    log.warning("lease renewal failed: %s", type(exc).__name__)
                continue
            if not held:
                self.lost = True
                return
            self.renewed_at = at
            self.renewals += 1


class HeldRows:
    """The rows of a claim not finished yet: a ``LeaseKeeper`` renews these, the worker
    finishes them, one at a time, so a renewal never misses a row the worker just finished
    and takes it for a row taken back."""

    def __init__(self, ids: Iterable[int]) -> None:
        self.ids = set(ids)
        self._lock = threading.Lock()

    def renewal(self, renew: Callable[[list[int]], bool]) -> Callable[[], bool]:
        """``renew(ids)`` of the rows still held, for a LeaseKeeper (True when none)."""

        def run() -> bool:
            with self._lock:
                ids = sorted(self.ids)
                return renew(ids) if ids else True

        return run

    @contextmanager
    def finishing(self, ids: Iterable[int]) -> Iterator[None]:
        """Around the statement that finishes ``ids``: no renewal runs meanwhile, and they
        are no longer held after it."""
        with self._lock:
            yield
            self.ids.difference_update(ids)
