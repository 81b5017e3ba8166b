"""Range checks for the numbers and ids a user gives (command line, dashboard forms and
URLs, webhook bodies): one helper per kind of value, so every entry point refuses the same
values with the same one-line message, before anything reaches the database."""

from __future__ import annotations

import math
import re
from datetime import timedelta

BIGINT_MAX = 2**63 - 1
"""The largest PostgreSQL bigint: every row id is one."""

INT_MAX = 2**31 - 1
"""The largest PostgreSQL integer (counts, limits, days)."""

MAX_SPAN_DAYS = 36_600
"""The longest span back from now (`--since 30d`): a hundred years."""

MAX_KEY_CHARS = 255
"""The longest id or key a sender may give that is stored in an indexed column (a
PostgreSQL B-tree entry holds at most about 2,700 bytes: a longer one fails the insert)."""

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")

_WHOLE = re.compile(r"[+-]?[0-9]+")
_SPAN = re.compile(r"([0-9]+)([dhm])")
_SPAN_UNITS = {"d": ("days", 1.0), "h": ("hours", 24.0), "m": ("minutes", 1440.0)}


class InputRangeError(ValueError):
    """A value from a user outside what the connector accepts; the message is one line and
    says what is accepted."""


def _lead(what: str) -> str:
    return f"{what}: " if what else ""


def _show(value: object) -> str:
    """The value as the message quotes it: short, one line."""
    text = str(value)
    text = text if len(text) <= 40 else text[:37] + "..."
    return repr(text) if not text.isprintable() or not text else text


def whole_number(value: str | int, what: str, low: int, high: int) -> int:
    """A whole number from ``low`` to ``high`` (decimal digits only: no ``1e3``, no ``0x``)."""
    if isinstance(value, bool):
        raise InputRangeError(f"{_lead(what)}{_show(value)} is not a whole number")
    if isinstance(value, int):
        n = value
    else:
        text = value.strip()
        if not _WHOLE.fullmatch(text):
            raise InputRangeError(f"{_lead(what)}{_show(value)} is not a whole number")
        if len(text.lstrip("+-0")) > 20:
            raise InputRangeError(f"{_lead(what)}{_show(value)} is out of range ({low} to {high})")
        n = int(text)
    if not low <= n <= high:
        raise InputRangeError(f"{_lead(what)}{_show(value)} is out of range ({low} to {high})")
    return n


def row_id(value: str | int, what: str = "id") -> int:
    """A database row id: a whole number from 1 to 2^63-1 (a PostgreSQL bigint)."""
    return whole_number(value, what, 1, BIGINT_MAX)


def seconds(value: str | float, what: str, low: float, high: float) -> float:
    """A finite number of seconds from ``low`` to ``high`` (no nan, no inf)."""
    try:
        s = float(value)
    except (TypeError, ValueError):
        raise InputRangeError(f"{_lead(what)}{_show(value)} is not a number of seconds") from None
    if not math.isfinite(s) or not low <= s <= high:
        bounds = f"{low:g} to {high:g} s"
        raise InputRangeError(f"{_lead(what)}{_show(value)} is out of range ({bounds})")
    return s


def span(value: str, what: str) -> timedelta:
    """A span like ``30d``, ``12h`` or ``90m`` of at most MAX_SPAN_DAYS days."""
    m = _SPAN.fullmatch(value.strip())
    if m is None:
        raise InputRangeError(f"{_lead(what)}{_show(value)} is not a span like 30d, 12h or 90m")
    digits, unit = m.groups()
    name, per_day = _SPAN_UNITS[unit]
    limit = int(MAX_SPAN_DAYS * per_day)
    if len(digits.lstrip("0")) > 12 or int(digits) > limit:
        raise InputRangeError(f"{_lead(what)}{_show(value)} is longer than {MAX_SPAN_DAYS} days")
    return timedelta(**{name: int(digits)})


def key_text(value: str, what: str, max_chars: int = MAX_KEY_CHARS) -> str:
    """An id or key a sender gave that is stored in an indexed column: 1 to ``max_chars``
    printable characters."""
    if not value or len(value) > max_chars or not value.isprintable():
        raise InputRangeError(f"{what} must be 1 to {max_chars} printable characters")
    return value


def log_level(value: str) -> str:
    """A logging level name, any case."""
    name = value.strip().upper()
    if name not in LOG_LEVELS:
        raise InputRangeError(f"{_show(value)} is not a log level ({', '.join(LOG_LEVELS)})")
    return name
