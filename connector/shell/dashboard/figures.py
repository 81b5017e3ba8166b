"""The dashboard's arithmetic on plain data: fair shares, time windows, buckets, labels."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from connector.routing.rep_state import fair_shares


@dataclass(frozen=True)
class Member:
    team_id: int
    team: str
    member_id: int
    crm_user_id: str
    name: str
    weight: int
    active: bool


@dataclass(frozen=True)
class RepLine:
    member_id: int
    crm_user_id: str
    name: str
    weight: int
    active: bool
    leads: int
    fair_share: float


@dataclass(frozen=True)
class TeamWindow:
    team: str
    total: int
    reps: list[RepLine]


def team_windows(
    members: Sequence[Member], counts: Mapping[int, int], team_order: Sequence[str]
) -> list[TeamWindow]:
    """Leads per rep against their fair share of the team's leads in one window, teams in
    config order. A member no longer configured but with leads in the window still shows."""
    by_team: dict[str, list[Member]] = {}
    for m in members:
        by_team.setdefault(m.team, []).append(m)
    out = []
    for team in team_order:
        ms = [m for m in by_team.get(team, []) if m.active or counts.get(m.member_id, 0)]
        total = sum(counts.get(m.member_id, 0) for m in ms)
        shares = fair_shares(
            {m.member_id: m.weight for m in ms}, [m.member_id for m in ms if m.active], total
        )
        reps = [
            RepLine(
                m.member_id,
                m.crm_user_id,
                m.name,
                m.weight,
                m.active,
                counts.get(m.member_id, 0),
                shares[m.member_id],
            )
            for m in ms
        ]
        out.append(TeamWindow(team, total, reps))
    return out


def start_of_day(now: datetime) -> datetime:
    """Midnight UTC of ``now``'s day: "today" on the dashboard is the UTC day."""
    now = now.astimezone(UTC)
    return now.replace(hour=0, minute=0, second=0, microsecond=0)


def hour_slots(now: datetime, hours: int) -> list[datetime]:
    """The starts of the last ``hours`` whole UTC hours, oldest first, the current one last."""
    end = now.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
    return [end - timedelta(hours=hours - 1 - i) for i in range(hours)]


def fill_slots(
    slots: Sequence[datetime], rows: Mapping[datetime, float | None]
) -> list[float | None]:
    """Values by slot start, None where no row fell in the slot."""
    return [rows.get(s) for s in slots]


def fmt_seconds(value: float | None) -> str:
    """A latency or age for people: 850 ms, 12.3 s, 4.2 min, 3.1 h, 2.0 d."""
    if value is None:
        return "–"
    if value < 1:
        return f"{value * 1000:.0f} ms"
    for size, unit in ((86400, "d"), (3600, "h"), (60, "min")):
        if value >= size:
            return f"{value / size:.1f} {unit}"
    return f"{value:.1f} s"


def fmt_time(value: datetime | None) -> str:
    """A timestamp in UTC, to the second."""
    if value is None:
        return "–"
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
