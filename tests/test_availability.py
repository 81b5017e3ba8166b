"""Caps, working hours and time off: config validation and the pure eligibility functions."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

import pytest

from connector.core.config import ConfigError, OrgConfig
from connector.core.config_loading import parse_config
from connector.core.hours import parse_hours, parse_local_time
from connector.routing.availability import (
    Candidate,
    Window,
    config_windows,
    eligibility,
    periods,
    room,
    unplaced_reason,
)

BASE = """
org: acme
crm:
  kind: salesforce
  instance_url: https://x.my.salesforce.com
  auth: {method: session, access_token: "${TOKEN}"}
teams:
  - name: a
%s
    members:
      - {crm_user_id: "005A", name: Ada%s}
      - {crm_user_id: "005B", name: Bob}
  - name: b
    overflow_team: %s
    members: [{crm_user_id: "005C", name: Cy}]
rules: [{team: a}]
"""


def cfg(team: str = "", member: str = "", overflow: str = "null") -> OrgConfig:
    return parse_config(BASE % (team, member, overflow), "a.yaml", {"TOKEN": "x"})


BAD = [
    (
        ("    timezone: Mars/Base", "", "null"),
        "teams[0].timezone: unknown time zone 'Mars/Base' (use an IANA name such as Europe/Berlin)",
    ),
    (
        ("    caps: {per_day: -1}", "", "null"),
        "teams[0].caps.per_day: must be at least 0, not -1",
    ),
    (
        ("    caps: {per_dya: 3}", "", "null"),
        "teams[0].caps.per_dya: unknown key; did you mean `per_day`?",
    ),
    (
        ("    overflow_team: nope", "", "null"),
        "teams[0].overflow_team: unknown team `nope`; write one of: a, b",
    ),
    (
        ("    overflow_team: a", "", "null"),
        "teams[0].overflow_team: overflow goes round in a circle (a -> a); end the chain with "
        "a team that has no overflow_team",
    ),
    (
        ("    overflow_team: b", "", "a"),
        "teams[0].overflow_team: overflow goes round in a circle (a -> b -> a); end the chain "
        "with a team that has no overflow_team",
    ),
    (
        ("    catch_up: some", "", "null"),
        "teams[0].catch_up: expected `none` or `{max_in_a_row: K}` with K from 1 to 1000",
    ),
    (
        ("    catch_up: {max_in_a_row: 0}", "", "null"),
        "teams[0].catch_up: expected `none` or `{max_in_a_row: K}` with K from 1 to 1000",
    ),
    (
        ("", ', hours: {mon-fri: "09:00-17:00"}', "null"),
        "teams[0].members[0].hours: timezone is required (an IANA name such as America/New_York)",
    ),
    (
        ("", ', hours: {timezone: Mars/Base, mon-fri: "09:00-17:00"}', "null"),
        "teams[0].members[0].hours: unknown time zone 'Mars/Base' (use an IANA name such as "
        "Europe/Berlin)",
    ),
    (
        ("", ', hours: {timezone: UTC, monday: "09:00-17:00"}', "null"),
        "teams[0].members[0].hours: 'monday' is not a day or a range of days (mon, tue, wed, "
        "thu, fri, sat, sun; e.g. mon-fri)",
    ),
    (
        ("", ', hours: {timezone: UTC, mon-fri: "9-17"}', "null"),
        "teams[0].members[0].hours: mon-fri: '9-17' is not a range like \"09:00-17:30\"",
    ),
    (
        ("", ', hours: {timezone: UTC, mon-fri: "17:00-09:00"}', "null"),
        "teams[0].members[0].hours: mon-fri: '17:00-09:00' ends before it starts (write a night "
        'shift as two days: mon: "22:00-24:00", tue: "00:00-06:00")',
    ),
    (
        ("", ', hours: {timezone: UTC, mon-fri: "09:00-25:00"}', "null"),
        "teams[0].members[0].hours: mon-fri: '09:00-25:00' is not within 00:00 to 24:00",
    ),
    (
        ("", ', hours: {timezone: UTC, mon-fri: "09:00-12:00", wed: "13:00-14:00"}', "null"),
        "teams[0].members[0].hours: wed is given twice: in 'mon-fri' and in 'wed'",
    ),
    (
        ("", ', hours: {timezone: UTC, mon: "09:00-12:00, 11:00-14:00"}', "null"),
        "teams[0].members[0].hours: mon: ranges overlap",
    ),
    (
        ("", ", hours: {timezone: UTC}", "null"),
        "teams[0].members[0].hours: no working days: list at least one, e.g. mon-fri: "
        '"09:00-17:00"',
    ),
    (
        ("", ", hours: {timezone: UTC, mon: 9}", "null"),
        'teams[0].members[0].hours: mon: expected time ranges like "09:00-17:30"',
    ),
    (
        ("", ', hours: "9-5"', "null"),
        "teams[0].members[0].hours: expected a mapping like {timezone: Europe/Berlin, mon-fri: "
        '"09:00-17:00"}',
    ),
    (
        ("", ", time_off: [{from: 2026-12-27, until: 2026-12-24}]", "null"),
        "teams[0].members[0].time_off[0].until: must be after `from`",
    ),
    (
        ("", ", time_off: [{from: tomorrow, until: 2026-12-24}]", "null"),
        "teams[0].members[0].time_off[0].from: 'tomorrow' is not a date or date-time like "
        "2026-12-24T09:00",
    ),
    (
        ("", ", time_off: [{until: 2026-12-24}]", "null"),
        "teams[0].members[0].time_off[0].from: missing; add `from:`",
    ),
]


@pytest.mark.parametrize(("parts", "message"), BAD, ids=[m for _, m in BAD])
def test_bad_values_are_refused_with_a_precise_message(
    parts: tuple[str, str, str], message: str
) -> None:
    with pytest.raises(ConfigError) as info:
        cfg(*parts)
    line = 9 if parts[0] else 11  # the team's inserted line, else Ada's
    assert str(info.value) == f"a.yaml:{line}: {message}"


def test_good_values_parse() -> None:
    c = cfg(
        "    timezone: Europe/Berlin\n    caps: {per_day: 20, per_week: 80}\n"
        "    overflow_team: b\n    catch_up: {max_in_a_row: 3}",
        ', caps: {per_day: 5}, hours: {timezone: America/New_York, mon-fri: "09:00-17:30", '
        'sat: "10:00-12:00, 13:00-14:00"}, time_off: [{from: 2026-12-24, until: '
        '"2026-12-28T09:00", reason: holidays}]',
    )
    team = c.team("a")
    ada, bob = team.members
    assert (team.timezone, team.overflow_team, team.max_in_a_row) == ("Europe/Berlin", "b", 3)
    assert (team.caps_of(ada).per_day, team.caps_of(ada).per_week) == (5, None)  # replaces
    assert (team.caps_of(bob).per_day, team.caps_of(bob).per_week) == (20, 80)
    assert ada.hours is not None and ada.hours.days[5] == ((600, 720), (780, 840))
    assert ada.hours.days[6] == ()
    assert (
        team.rep_timezone(ada) == "America/New_York" and team.rep_timezone(bob) == "Europe/Berlin"
    )
    (w,) = config_windows(team, ada)
    assert w.starts == datetime(2026, 12, 24, 5, tzinfo=UTC)  # 00:00 in New York
    assert w.until == datetime(2026, 12, 28, 14, tzinfo=UTC)
    assert c.overflow_chain("a") == ["a", "b"] and c.overflow_chain("b") == ["b"]
    assert cfg().team("a").max_in_a_row is None  # catch_up: none by default


def test_check_config_warns_when_catch_up_can_never_pay() -> None:
    c = cfg("    catch_up: {max_in_a_row: 1}")
    assert c.warnings() == [
        "intake_owner_ids: empty: every Salesforce record has an owner, so nothing will be "
        "routed; list the intake queue or integration user",
        "crm.outbound_secrets: empty: Outbound Messages are refused; add `outbound_secrets: "
        '["${ENV_NAME}"]` to receive them',
        "teams[0].catch_up.max_in_a_row: 1 is too low for Ada of team a (weight 1 of 2): back "
        "from time away, the rep can never catch up; set max_in_a_row to at least 2",
        "teams[0].catch_up.max_in_a_row: 1 is too low for Bob of team a (weight 1 of 2): back "
        "from time away, the rep can never catch up; set max_in_a_row to at least 2",
    ]
    assert len(cfg("    catch_up: {max_in_a_row: 2}").warnings()) == 2


def test_check_config_says_when_max_in_a_row_cannot_apply_to_a_heavy_rep() -> None:
    heavy = cfg("    catch_up: {max_in_a_row: 2}", ", weight: 5").warnings()[2:]
    assert heavy == [
        "teams[0].catch_up.max_in_a_row: 2 does not apply to Ada of team a (weight 5 of 6 is "
        "more than 2 of every 3 leads): back from time away it catches up without a limit on "
        "leads in a row; set max_in_a_row to at least 6 to limit it"
    ]
    assert cfg("    catch_up: {max_in_a_row: 6}", ", weight: 5").warnings()[2:] == []
    huge = cfg("    catch_up: {max_in_a_row: 1}", ", weight: 1000").warnings()[2:]
    assert huge == [
        "teams[0].catch_up.max_in_a_row: 1 does not apply to Ada of team a (weight 1000 of "
        "1001 is more than 1 of every 2 leads): back from time away it catches up without a "
        "limit on leads in a row; no max_in_a_row up to 1000 can limit it"
    ]


NY = parse_hours({"timezone": "America/New_York", "mon-fri": "09:00-17:30", "sun": "22:00-24:00"})


@pytest.mark.parametrize(
    ("at", "open_"),
    [
        (datetime(2026, 12, 7, 14, 0, tzinfo=UTC), True),  # Mon 09:00 New York
        (datetime(2026, 12, 7, 13, 59, tzinfo=UTC), False),  # Mon 08:59
        (datetime(2026, 12, 7, 22, 29, tzinfo=UTC), True),  # Mon 17:29
        (datetime(2026, 12, 7, 22, 30, tzinfo=UTC), False),  # Mon 17:30: the end is excluded
        (datetime(2026, 12, 12, 15, 0, tzinfo=UTC), False),  # Saturday
        (datetime(2026, 12, 7, 4, 59, tzinfo=UTC), True),  # Sun 23:59 New York (Mon in UTC)
        (datetime(2026, 7, 6, 13, 0, tzinfo=UTC), True),  # Mon 09:00 EDT (summer time)
        (datetime(2026, 7, 6, 12, 59, tzinfo=UTC), False),
    ],
)
def test_working_hours_are_read_in_the_reps_zone(at: datetime, open_: bool) -> None:
    assert NY.is_open(at) is open_


def test_day_ranges_wrap_and_end_at_midnight() -> None:
    h = parse_hours({"timezone": "UTC", "fri-mon": "00:00-24:00"})
    assert [bool(d) for d in h.days] == [True, False, False, False, True, True, True]
    assert h.is_open(datetime(2026, 12, 7, 23, 59, tzinfo=UTC))


def test_local_times() -> None:
    assert parse_local_time("2026-12-24T09:00", "Europe/Berlin") == datetime(
        2026, 12, 24, 8, tzinfo=UTC
    )
    assert parse_local_time("2026-12-24T09:00Z", "Europe/Berlin") == datetime(
        2026, 12, 24, 9, tzinfo=UTC
    )
    with pytest.raises(ValueError, match=r"^'soon' is not a date or date-time"):
        parse_local_time("soon", "UTC")


def test_periods_are_local_days_and_weeks_from_monday() -> None:
    # Sunday 23:30 UTC is already Monday in Berlin: a new day and a new week there
    at = datetime(2026, 12, 6, 23, 30, tzinfo=UTC)
    assert (periods(at, "UTC").day, periods(at, "UTC").week) == (
        date(2026, 12, 6),
        date(2026, 11, 30),
    )
    berlin = periods(at, "Europe/Berlin")
    assert (berlin.day, berlin.week) == (date(2026, 12, 7), date(2026, 12, 7))
    with pytest.raises(ValueError, match=r"^now must be timezone-aware$"):
        periods(datetime(2026, 12, 6), "UTC")


def test_room_is_the_tighter_cap() -> None:
    assert room(Candidate(1, True)) is None
    assert room(Candidate(1, True, per_day=5, day_count=3)) == 2
    assert room(Candidate(1, True, per_day=5, per_week=9, day_count=3, week_count=8)) == 1
    assert room(Candidate(1, True, per_week=9, week_count=12)) == 0  # a lowered cap: 0, not -3
    assert room(Candidate(1, True, per_day=0)) == 0


def test_eligibility_names_the_first_reason_that_applies() -> None:
    now = datetime(2026, 12, 7, 15, 0, tzinfo=UTC)  # Mon 10:00 New York
    away = (Window(now - timedelta(hours=1), now + timedelta(hours=1)),)
    past = (Window(now - timedelta(hours=2), now),)  # ends exactly now: back
    cands = [
        Candidate(1, True),
        Candidate(2, False, away=away, per_day=0),
        Candidate(3, True, away=away, per_day=0),
        Candidate(4, True, hours=parse_hours({"timezone": "UTC", "sat": "09:00-17:00"})),
        Candidate(5, True, hours=NY, per_day=3, day_count=3),
        Candidate(6, True, hours=NY, away=past, per_week=3, week_count=2),
    ]
    reasons = eligibility(cands, now)
    assert reasons == {1: None, 2: "inactive", 3: "away", 4: "off_shift", 5: "capped", 6: None}


def test_why_a_team_could_not_take_a_lead() -> None:
    assert unplaced_reason({}) == "no_active_member"
    assert unplaced_reason({1: "inactive"}) == "no_active_member"
    assert unplaced_reason({1: "capped", 2: "away", 3: "inactive"}) == "all_capped"
    assert unplaced_reason({1: "off_shift", 2: "away"}) == "none_available"


def test_configuration_doc_caps_example_parses() -> None:
    import re
    from pathlib import Path

    doc = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"
    text = doc.read_text(encoding="utf-8")
    block = next(b for b in re.findall(r"```yaml\n(.*?)```", text, re.S) if "overflow_team" in b)
    c = parse_config(
        BASE.split("teams:")[0] + block + "  - name: row_ae\n    members: "
        '[{crm_user_id: "005C", name: Cy}]\nrules: [{team: na_ae}]\n',
        "docs/configuration.md",
        {"TOKEN": "x"},
    )
    team = c.team("na_ae")
    assert (team.timezone, team.overflow_team, team.max_in_a_row) == (
        "America/New_York",
        "row_ae",
        3,
    )
    assert team.members[1].time_off[0].reason == "holidays"
