"""Who may take a lead right now: caps, working hours and time off (pure, clock injected).

Every function takes ``now`` (timezone-aware) from its caller; nothing here reads a clock or
the database. ``eligibility`` names, for every candidate rep, why it is skipped (or None when
it may take the lead); a recorder can store that mapping as it is.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from typing import Any, Literal

from connector.core.config import Member, Team
from connector.core.hours import WeeklyHours, parse_local_time, zone

Reason = Literal["inactive", "away", "off_shift", "capped"]
# In this order: the first that applies is the one reported.
REASONS: tuple[Reason, ...] = ("inactive", "away", "off_shift", "capped")


@dataclass(frozen=True)
class Periods:
    """The day and the week (starting Monday) ``now`` falls in, as local dates of a zone."""

    day: date
    week: date


def periods(now: datetime, timezone: str) -> Periods:
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    local = now.astimezone(zone(timezone)).date()
    return Periods(local, local - timedelta(days=local.weekday()))


@dataclass(frozen=True)
class Window:
    """An absence from ``starts`` (inclusive) to ``until`` (exclusive); ``reason`` and
    ``source`` (``config`` or ``command line``) are for display only."""

    starts: datetime
    until: datetime
    reason: str | None = field(default=None, compare=False)
    source: str = field(default="config", compare=False)

    def covers(self, now: datetime) -> bool:
        return self.starts <= now < self.until


@dataclass(frozen=True)
class Candidate:
    """One configured rep of a team, with what its eligibility depends on."""

    member_id: int
    active: bool
    hours: WeeklyHours | None = None
    away: tuple[Window, ...] = ()
    per_day: int | None = None
    per_week: int | None = None
    day_count: int = 0  # leads this member got in the current day / week (team's zone)
    week_count: int = 0


def room(c: Candidate) -> int | None:
    """How many more leads the caps let ``c`` take in this day and week; None: no cap."""
    left = [
        cap - n
        for cap, n in ((c.per_day, c.day_count), (c.per_week, c.week_count))
        if cap is not None
    ]
    return max(0, min(left)) if left else None


def blocked_reason(c: Candidate, now: datetime) -> Reason | None:
    """Why ``c`` cannot take a lead at ``now`` for a reason other than its caps."""
    if not c.active:
        return "inactive"
    if any(w.covers(now) for w in c.away):
        return "away"
    if c.hours is not None and not c.hours.is_open(now):
        return "off_shift"
    return None


def eligibility(candidates: Iterable[Candidate], now: datetime) -> dict[int, Reason | None]:
    """member id -> the reason it is skipped at ``now``, or None when it may take a lead."""
    out: dict[int, Reason | None] = {}
    for c in candidates:
        reason = blocked_reason(c, now)
        if reason is None and room(c) == 0:
            reason = "capped"
        out[c.member_id] = reason
    return out


def unplaced_reason(reasons: Mapping[int, str | None]) -> str:
    """Why a team could not take a lead: nobody active, everyone available capped, or none
    available (every active rep away or off shift)."""
    active = [r for r in reasons.values() if r != "inactive"]
    if not active:
        return "no_active_member"
    if "capped" in active:
        return "all_capped"
    return "none_available"


def config_windows(team: Team, member: Member) -> tuple[Window, ...]:
    """The member's `time_off` entries from the YAML (validated when the file was loaded)."""
    tz = team.rep_timezone(member)
    return tuple(
        Window(parse_local_time(t.starts, tz), parse_local_time(t.until, tz), t.reason)
        for t in member.time_off
    )


def member_candidate(
    team: Team,
    member: Member | None,
    row: Any,
    load: tuple[int, int],
    away_reason: str | None = None,
) -> Candidate:
    """What the eligibility of one member row (``team_candidates``) depends on: the config
    and its database row; ``load`` is its leads of the day and week, ``away_reason`` the
    reason given with its time off set from the command line."""
    away = config_windows(team, member) if member else ()
    if row.away_until is not None:
        away += (Window(row.away_from, row.away_until, away_reason, "command line"),)
    caps = team.caps_of(member) if member else team.caps
    return Candidate(
        member_id=row.id,
        active=row.active,
        hours=member.hours if member else None,
        away=away,
        per_day=caps.per_day,
        per_week=caps.per_week,
        day_count=load[0],
        week_count=load[1],
    )
