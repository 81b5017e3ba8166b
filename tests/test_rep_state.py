"""A rep's state now (routing/rep_state.py, pure): what every surface shows, with the instant
each state ends, and why a rep is below its fair share."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from connector.core.hours import parse_hours
from connector.routing.availability import Candidate, Window
from connector.routing.rep_state import (
    RepState,
    away_window,
    below_share,
    cap_reset,
    combined,
    state_now,
)
from connector.shell.tables import table

# Wednesday 2026-12-02 18:30 UTC = 19:30 in Berlin, 13:30 in New York
NOW = datetime(2026, 12, 2, 18, 30, tzinfo=UTC)
BERLIN_9_TO_5 = parse_hours({"timezone": "Europe/Berlin", "mon-fri": "09:00-17:00"})


def at(text: str) -> datetime:
    return datetime.fromisoformat(text)


def test_available() -> None:
    s = state_now(Candidate(1, True), NOW, "UTC")
    assert s == RepState("available") and s.available and s.text() == "available"


def test_inactive_wins_over_everything() -> None:
    c = Candidate(1, False, BERLIN_9_TO_5, (Window(NOW, NOW + timedelta(days=1)),), per_day=0)
    assert state_now(c, NOW, "UTC").text() == "inactive"


def test_off_shift_until_the_next_shift_start() -> None:
    s = state_now(Candidate(1, True, BERLIN_9_TO_5), NOW, "UTC")
    assert (s.state, s.until) == ("off_shift", at("2026-12-03T08:00+00:00"))
    assert s.text() == "off shift until 2026-12-03 08:00 UTC"
    # Friday evening: Monday 09:00 Berlin
    friday = datetime(2026, 12, 4, 17, 0, tzinfo=UTC)
    assert state_now(Candidate(1, True, BERLIN_9_TO_5), friday, "UTC").until == at(
        "2026-12-07T08:00+00:00"
    )
    # before the shift of the same day
    early = datetime(2026, 12, 2, 6, 0, tzinfo=UTC)
    assert BERLIN_9_TO_5.next_open(early) == at("2026-12-02T08:00+00:00")


def test_next_open_crosses_a_daylight_saving_change_and_is_now_when_open() -> None:
    hours = parse_hours({"timezone": "Europe/Berlin", "sun": "10:00-12:00"})
    # Saturday 2026-03-28 (CET, +01:00); Sunday 29 is summer time (+02:00)
    assert hours.next_open(at("2026-03-28T12:00+00:00")) == at("2026-03-29T08:00+00:00")
    inside = at("2026-03-29T09:00+00:00")
    assert hours.next_open(inside) == inside
    # a night shift's second half starts at 00:00 of the next day
    night = parse_hours({"timezone": "UTC", "mon": "22:00-24:00", "tue": "00:00-06:00"})
    assert night.next_open(at("2026-12-01T07:00+00:00")) == at("2026-12-07T22:00+00:00")


def test_away_until_with_reason_and_source_and_back_to_back_absences() -> None:
    cmd = Window(NOW - timedelta(hours=1), NOW + timedelta(hours=2), "PTO", "command line")
    s = state_now(Candidate(1, True, away=(cmd,)), NOW, "UTC")
    assert s.text() == "away until 2026-12-02 20:30 UTC (PTO, command line)"
    # a second absence starting when (or before) the first ends extends it; a later one not
    nxt = Window(NOW + timedelta(hours=2), NOW + timedelta(days=1), "trip")
    later = Window(NOW + timedelta(days=2), NOW + timedelta(days=3))
    w = away_window([later, nxt, cmd], NOW)
    assert w is not None and w.until == NOW + timedelta(days=1) and w.reason == "PTO"
    assert away_window([later], NOW) is None
    # away wins over off shift (the order the router reports them in)
    c = Candidate(1, True, BERLIN_9_TO_5, (Window(NOW, NOW + timedelta(hours=1)),))
    assert state_now(c, NOW, "UTC").text() == "away until 2026-12-02 19:30 UTC (config)"


def test_capped_until_the_reset_of_the_full_cap_in_the_team_zone() -> None:
    day_full = Candidate(1, True, per_day=3, day_count=3, per_week=10, week_count=3)
    s = state_now(day_full, NOW, "America/New_York")
    # next midnight in New York (EST, -05:00)
    assert s.until == at("2026-12-03T05:00+00:00")
    assert s.text() == "capped until 2026-12-03 05:00 UTC (3 of 3 leads today)"
    week_full = Candidate(1, True, per_day=3, day_count=1, per_week=5, week_count=5)
    assert state_now(week_full, NOW, "UTC").until == at("2026-12-07T00:00+00:00")
    both = Candidate(1, True, per_day=3, day_count=3, per_week=5, week_count=5)
    s = state_now(both, NOW, "UTC")
    assert s.until == at("2026-12-07T00:00+00:00")
    assert s.note == "3 of 3 leads today, 5 of 5 leads this week"
    assert cap_reset(Candidate(1, True, per_day=3, day_count=2), NOW, "UTC") is None
    # a shift ending does not matter while the rep is on shift and capped
    on_shift = Candidate(1, True, BERLIN_9_TO_5, per_day=0)
    assert state_now(on_shift, at("2026-12-02T10:00+00:00"), "UTC").state == "capped"


def test_as_dict_is_json_ready() -> None:
    s = RepState("off_shift", at("2026-12-03T08:00+00:00"))
    assert s.as_dict() == {
        "state": "off_shift",
        "until": "2026-12-03T08:00:00+00:00",
        "note": None,
        "text": "off shift until 2026-12-03 08:00 UTC",
    }


@pytest.mark.parametrize(
    ("leads", "share", "picks", "skips", "expected"),
    [
        (5, 5.0, 10, {}, None),
        (4, 4.9, 10, {"off_shift": 3}, None),  # less than one lead short: not below
        (
            2,
            6.0,
            24,
            {"off_shift": 14, "capped": 2},
            "passed over in 16 of 24 picks of the last 24h: capped 2, off shift 14",
        ),
        (
            1,
            3.0,
            9,
            {},
            "eligible in all 9 picks of the last 24h: the rotation evens out over its epoch, "
            "not per window",
        ),
    ],
)
def test_below_share(
    leads: int, share: float, picks: int, skips: dict[str, int], expected: str | None
) -> None:
    assert below_share(leads, share, picks, skips, "the last 24h") == expected


def test_combined_states_of_a_rep_in_several_teams() -> None:
    a, b = RepState("available"), RepState("off_shift", at("2026-12-03T08:00+00:00"))
    assert combined([("na", a), ("emea", a)]) == "available"
    assert combined([("na", a), ("emea", b)]) == (
        "na: available; emea: off shift until 2026-12-03 08:00 UTC"
    )


def test_table_has_a_header_and_aligned_columns() -> None:
    assert table(["ID", "NAME", "N"], [[1, "Ada", 10], [22, "Al", 3]], right=(0, 2)) == [
        "ID  NAME   N",
        " 1  Ada   10",
        "22  Al     3",
    ]
    assert table(["A", "B"], [], indent="  ") == ["  A  B"]
