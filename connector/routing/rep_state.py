"""A rep's state now, and why it is below its fair share: one wording for every surface.

`connector status`, `connector rep list`, the dashboard and `reassign --to` all call
``state_now`` (pure, clock injected) on the ``Candidate`` the router's eligibility reads, so
what they say is what the next pick would decide: the first of inactive, away, off shift and
capped that applies (``availability.REASONS``), with the instant it ends where one is known.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, time, timedelta
from typing import Literal

from connector.core.hours import zone
from connector.routing.availability import Candidate, Window, blocked_reason, periods

State = Literal["available", "inactive", "away", "off_shift", "capped"]


def fmt_utc(value: datetime) -> str:
    """An instant for people, to the minute: 2026-12-24 14:00 UTC."""
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")


@dataclass(frozen=True)
class RepState:
    """``until``: when this state ends (None: not before someone changes it, or unknown);
    ``note``: the time off's reason and where it was set, or what the cap counted."""

    state: State
    until: datetime | None = None
    note: str | None = None

    @property
    def available(self) -> bool:
        return self.state == "available"

    def text(self) -> str:
        """``available``, ``away until 2026-12-24 14:00 UTC (PTO, command line)``, ``off
        shift until ...``, ``capped until ... (20 of 20 leads today)``, ``inactive``."""
        words = self.state.replace("_", " ")
        if self.until is not None:
            words += f" until {fmt_utc(self.until)}"
        return words + (f" ({self.note})" if self.note else "")

    def as_dict(self) -> dict[str, str | None]:
        return {
            "state": self.state,
            "until": self.until.isoformat() if self.until else None,
            "note": self.note,
            "text": self.text(),
        }


def away_window(windows: Sequence[Window], now: datetime) -> Window | None:
    """The absence covering ``now``, extended through every absence that starts before it
    ends (back-to-back time off is one absence); None when none covers ``now``."""
    covering = [w for w in windows if w.covers(now)]
    if not covering:
        return None
    first = max(covering, key=lambda w: w.until)
    until = first.until
    grown = True
    while grown:
        grown = False
        for w in windows:
            if w.starts <= until < w.until:
                until, grown = w.until, True
    return Window(first.starts, until, first.reason, first.source)


def cap_reset(c: Candidate, now: datetime, timezone: str) -> datetime | None:
    """When the caps that are full at ``now`` make room again: the next midnight (a full day
    cap) or Monday 00:00 (a full week cap) in the team's zone; the later when both are full.
    None when no cap is full."""
    p = periods(now, timezone)
    tz = zone(timezone)
    ends = []
    if c.per_day is not None and c.day_count >= c.per_day:
        ends.append(datetime.combine(p.day + timedelta(days=1), time(0), tz))
    if c.per_week is not None and c.week_count >= c.per_week:
        ends.append(datetime.combine(p.week + timedelta(days=7), time(0), tz))
    return max(ends) if ends else None


def _cap_note(c: Candidate) -> str:
    full = []
    if c.per_day is not None and c.day_count >= c.per_day:
        full.append(f"{c.day_count} of {c.per_day} leads today")
    if c.per_week is not None and c.week_count >= c.per_week:
        full.append(f"{c.week_count} of {c.per_week} leads this week")
    return ", ".join(full)


def state_now(c: Candidate, now: datetime, timezone: str) -> RepState:
    """``c``'s state at ``now``; ``timezone`` is its team's (where the caps' days and weeks
    are counted)."""
    reason = blocked_reason(c, now)
    if reason == "inactive":
        return RepState("inactive")
    if reason == "away":
        w = away_window(c.away, now)
        assert w is not None
        note = ", ".join(x for x in (w.reason, w.source) if x)
        return RepState("away", w.until, note or None)
    if reason == "off_shift":
        assert c.hours is not None
        return RepState("off_shift", c.hours.next_open(now))
    reset = cap_reset(c, now, timezone)
    if reset is not None:
        return RepState("capped", reset, _cap_note(c))
    return RepState("available")


def fair_shares(weights: Mapping[int, int], active: Iterable[int], total: int) -> dict[int, float]:
    """Each member's weighted share of ``total`` leads: weight / sum of the active members'
    weights; an inactive member's share is 0 (the rotation gives it nothing)."""
    live = set(active)
    weight_sum = sum(w for m, w in weights.items() if m in live)
    return {
        m: (total * w / weight_sum if m in live and weight_sum else 0.0) for m, w in weights.items()
    }


SKIP_WORDS = {
    "inactive": "inactive",
    "away": "away",
    "off_shift": "off shift",
    "capped": "capped",
    "current_owner": "the current owner",
}


def below_share(
    leads: int, share: float, picks: int, skips: Mapping[str, int], window: str
) -> str | None:
    """Why a rep got at least one lead fewer than its weighted fair share in ``window``
    (e.g. ``the last 24h``), from the picks of its team recorded then: in how many it was
    passed over, by reason. None when it is not that far below."""
    if leads + 1 > share:
        return None
    passed = {k: n for k, n in skips.items() if n}
    if not passed:
        return (
            f"eligible in all {picks} picks of {window}: the rotation evens out over its "
            "epoch, not per window"
        )
    by = ", ".join(f"{SKIP_WORDS.get(k, k)} {n}" for k, n in sorted(passed.items()))
    return f"passed over in {sum(passed.values())} of {picks} picks of {window}: {by}"


def combined(states: Sequence[tuple[str, RepState]]) -> str:
    """One rep's states in its teams as one line: the state when every team says the same,
    else ``team: state; team: state``."""
    texts = {s.text() for _, s in states}
    if len(texts) == 1:
        return texts.pop()
    return "; ".join(f"{team}: {s.text()}" for team, s in states)
