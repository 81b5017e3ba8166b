"""What a dispatcher's rounds did, counted (``DispatchStats``): rows claimed, sent, retried,
dead, superseded and stale, CRM requests and reads, lease renewals, and errors by code."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class DispatchStats:
    claimed: int = 0
    sent: int = 0
    retried: int = 0
    dead: int = 0
    requests: int = 0
    stale: int = 0
    superseded: int = 0
    reads: int = 0
    renewals: int = 0  # leases extended before a CRM call (a quarter of the lease gone)
    errors: dict[str, int] = field(default_factory=dict)

    def add(self, other: DispatchStats) -> None:
        self.claimed += other.claimed
        self.sent += other.sent
        self.retried += other.retried
        self.dead += other.dead
        self.requests += other.requests
        self.stale += other.stale
        self.superseded += other.superseded
        self.reads += other.reads
        self.renewals += other.renewals
        for k, v in other.errors.items():
            self.errors[k] = self.errors.get(k, 0) + v

    def count_error(self, code: str) -> None:
        self.errors[code] = self.errors.get(code, 0) + 1
