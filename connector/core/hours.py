"""Working hours and time zones: parsing with precise errors, and "is this instant on shift?".

Pure functions on plain data; the caller passes the instant (no clock is read here).

A weekly schedule is written as a mapping from days to time ranges, in one time zone::

    hours: {timezone: America/New_York, mon-fri: "09:00-17:30", sat: "10:00-12:00, 13:00-15:00"}

Days are ``mon tue wed thu fri sat sun``; a key is one day or a range of days (``mon-fri``,
``fri-mon`` wraps). A value is one range or several separated by commas; a range is
``HH:MM-HH:MM`` with the start before the end (``24:00`` ends a day). A day that is not listed
is off. A night shift is two ranges on two days (``mon: "22:00-24:00", tue: "00:00-06:00"``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, time, timedelta
from itertools import pairwise
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
_RANGE = re.compile(r"^(\d{2}):(\d{2})-(\d{2}):(\d{2})$")


def zone(name: str) -> ZoneInfo:
    """The IANA time zone ``name``; ValueError with a clear message when there is none."""
    if not isinstance(name, str) or not name or name != name.strip():
        raise ValueError(f"unknown time zone {name!r} (use an IANA name such as Europe/Berlin)")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(
            f"unknown time zone {name!r} (use an IANA name such as Europe/Berlin)"
        ) from None


def _minutes(hh: str, mm: str, day_key: str, text: str) -> int:
    h, m = int(hh), int(mm)
    if m > 59 or h > 24 or (h == 24 and m != 0):
        raise ValueError(f"{day_key}: {text!r} is not within 00:00 to 24:00")
    return h * 60 + m


def _days(key: str) -> list[int]:
    first, sep, last = key.partition("-")
    if first not in DAYS or (sep and last not in DAYS) or (sep and first == last):
        raise ValueError(
            f"{key!r} is not a day or a range of days (mon, tue, wed, thu, fri, sat, sun; "
            "e.g. mon-fri)"
        )
    a = DAYS.index(first)
    if not sep:
        return [a]
    b = DAYS.index(last)
    return [(a + i) % 7 for i in range((b - a) % 7 + 1)]


def _ranges(day_key: str, value: object) -> list[tuple[int, int]]:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f'{day_key}: expected time ranges like "09:00-17:30"')
    out: list[tuple[int, int]] = []
    for part in value.split(","):
        text = part.strip().replace(" ", "")
        m = _RANGE.match(text)
        if not m:
            raise ValueError(f'{day_key}: {part.strip()!r} is not a range like "09:00-17:30"')
        start = _minutes(m.group(1), m.group(2), day_key, part.strip())
        end = _minutes(m.group(3), m.group(4), day_key, part.strip())
        if end <= start:
            raise ValueError(
                f"{day_key}: {part.strip()!r} ends before it starts (write a night shift as "
                'two days: mon: "22:00-24:00", tue: "00:00-06:00")'
            )
        out.append((start, end))
    out.sort()
    for (_, end), (start, _) in pairwise(out):
        if start < end:
            raise ValueError(f"{day_key}: ranges overlap")
    return out


@dataclass(frozen=True)
class WeeklyHours:
    """On-shift minutes of each weekday (Monday first), in ``timezone``."""

    timezone: str
    days: tuple[tuple[tuple[int, int], ...], ...]

    def is_open(self, at: datetime) -> bool:
        """Whether the instant ``at`` (timezone-aware) falls inside the schedule."""
        local = at.astimezone(zone(self.timezone))
        minute = local.hour * 60 + local.minute
        return any(start <= minute < end for start, end in self.days[local.weekday()])

    def next_open(self, at: datetime) -> datetime:
        """The first instant at or after ``at`` that is on shift (``at`` itself when it is);
        the schedule has a working day, so one comes within a week."""
        if self.is_open(at):
            return at
        tz = zone(self.timezone)
        day = at.astimezone(tz).date()
        for i in range(8):
            d = day + timedelta(days=i)
            for start, _end in self.days[d.weekday()]:
                begins = datetime.combine(d, time(start // 60, start % 60), tz)
                if begins > at:
                    return begins
        raise AssertionError("a schedule with a working day opens within eight days")


def parse_hours(raw: object, default_timezone: str | None = None) -> WeeklyHours:
    """Parse the YAML mapping; ValueError naming the key and the problem."""
    if not isinstance(raw, dict):
        raise ValueError(
            'expected a mapping like {timezone: Europe/Berlin, mon-fri: "09:00-17:00"}'
        )
    tz = raw.get("timezone", default_timezone)
    if tz is None:
        raise ValueError("timezone is required (an IANA name such as America/New_York)")
    zone(tz)
    days: list[list[tuple[int, int]] | None] = [None] * 7
    given_in: list[str] = [""] * 7
    for key, value in raw.items():
        if key == "timezone":
            continue
        if not isinstance(key, str):
            raise ValueError(f"{key!r} is not a day or a range of days")
        ranges = _ranges(key, value)
        for d in _days(key):
            if days[d] is not None:
                raise ValueError(f"{DAYS[d]} is given twice: in {given_in[d]!r} and in {key!r}")
            days[d], given_in[d] = ranges, key
    if all(d is None for d in days):
        raise ValueError('no working days: list at least one, e.g. mon-fri: "09:00-17:00"')
    return WeeklyHours(tz, tuple(tuple(d or ()) for d in days))


def parse_local_time(text: str, tz: str) -> datetime:
    """An ISO date or date-time; one without an offset is read in ``tz`` (a date: 00:00)."""
    if not isinstance(text, str):
        raise ValueError(f"{text!r} is not a date or date-time like 2026-12-24T09:00")
    try:
        value = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(f"{text!r} is not a date or date-time like 2026-12-24T09:00") from None
    if value.tzinfo is None:
        value = value.replace(tzinfo=zone(tz))
    return value
