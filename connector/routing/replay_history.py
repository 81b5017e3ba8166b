"""The stored window a what-if replay reads: its leads, what the connector did with each, and
the state the teams' rotations were in (``History`` and its parts; plain data, no I/O)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import date, datetime
from typing import Any

from connector.routing.domains import AccountRow


@dataclass(frozen=True)
class HistoryLead:
    """One stored lead and what the connector did with it."""

    lead_id: int
    crm_id: str
    fields: Mapping[str, Any]
    received_at: datetime
    # the team that decided (its rep's team when assigned) and the rep; ``reason`` why not
    team: str | None = None
    owner: str | None = None
    reason: str | None = None
    assignment_id: int | None = None
    epoch: int | None = None
    # reassigned since it was routed: ``team``/``owner`` are routing's pick, ``current_team``
    # the team of its owner now
    reassigned: bool = False
    current_team: str | None = None
    parent_id: str | None = None
    # from the recorded decision: the instant availability was judged at (None: not recorded),
    # the batch (its first lead id), the decision's id, the reps away by `rep away` (or, for
    # older decisions, skipped as away), the teams it overflowed from, given to its account's
    # owner
    at: datetime | None = None
    batch: int | None = None
    decision_id: int | None = None
    away: frozenset[str] = frozenset()
    overflowed: tuple[str, ...] = ()
    by_account: bool = False

    @property
    def judged_at(self) -> datetime:
        return self.at or self.received_at


@dataclass(frozen=True)
class TeamRotation:
    """A team's rotation as the database has it now."""

    epoch: int
    fingerprint: str


@dataclass(frozen=True)
class Mirror:
    """The account mirror as it is now: accounts by id and by domain."""

    by_id: dict[str, AccountRow] = field(default_factory=dict)
    by_domain: dict[str, list[AccountRow]] = field(default_factory=dict)


LoadKey = tuple[str, str, str, date]  # team, crm_user_id, "day" | "week", first day


@dataclass(frozen=True)
class History:
    leads: list[HistoryLead]
    rotations: dict[str, TeamRotation]
    # team -> epoch -> crm_user_id -> leads received before the window
    counts_before: dict[str, dict[int, dict[str, int]]]
    # crm_user_id -> the name the database knows (reps no longer in the config)
    names: dict[str, str] = field(default_factory=dict)
    # team -> crm_user_id -> turns at the team's first recorded decision of the window
    turns_start: dict[str, dict[str, int]] = field(default_factory=dict)
    # the caps' counts before the window (see the loads_before query)
    loads_before: dict[LoadKey, int] = field(default_factory=dict)
    # team -> its latest owners before the window, newest first (catch-up teams only)
    recent_before: dict[str, list[str]] = field(default_factory=dict)
    accounts: Mirror = field(default_factory=Mirror)
