"""Territory tables: country, state/province and postal code (a prefix or a range) to a team.

A row names a country, optionally a state, optionally a postal code: a prefix (``941``) or a
range of prefixes of one length (``900-961``: codes whose first 3 characters are 900 to 961).
The most specific row that covers a lead wins: a postal row of the lead's state, then a postal
row of the country (any state), then the state's row, then the country's. Two rows at the same
level that cover a common code are an overlap: refused at load, naming both rows. Holes
between the numeric ranges of one country and state are gaps: reported as a warning.

Text compares trimmed and case-insensitive; postal codes without spaces and hyphens and in
upper case (``94103-1234`` is ``941031234``, ``k1a 0b1`` is ``K1A0B1``). A lookup is two
dictionary reads and at most two binary searches (``bisect``) over the sorted ranges: O(log n)
in the table's size. Building and checking are pure; reading a CSV is the loader's.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise

# A character no postal code holds: a range's high end is ``high + TOP``, so every code that
# starts with ``high`` sorts below it.
TOP = "\U0010ffff"
COLUMNS = ("country", "state", "postal_code", "team")


def text_key(value: object) -> str:
    """A country or state as compared: trimmed, case-folded."""
    return str(value).strip().casefold()


def postal_key(value: object) -> str:
    """A postal code as compared: no spaces or hyphens, upper case."""
    return str(value).replace(" ", "").replace("-", "").upper()


@dataclass(frozen=True)
class Row:
    """One row as written; ``where`` names it in messages (``rows[3]`` or ``na.csv:5``)."""

    country: str
    state: str
    postal: str
    team: str
    where: str


@dataclass(frozen=True)
class _Span:
    low: str
    high_end: str  # high + TOP
    length: int
    row: Row


@dataclass
class Table:
    """A checked table, ready for ``lookup``."""

    rows: tuple[Row, ...]
    # (country, state or "") -> spans sorted by low, and their lows (for bisect)
    spans: dict[tuple[str, str], list[_Span]] = field(default_factory=dict)
    lows: dict[tuple[str, str], list[str]] = field(default_factory=dict)
    # (country, state or "") -> the row without a postal code
    areas: dict[tuple[str, str], Row] = field(default_factory=dict)
    gaps: list[str] = field(default_factory=list)

    @property
    def teams(self) -> set[str]:
        return {r.team for r in self.rows}

    def lookup(self, country: object, state: object, postal: object) -> Row | None:
        """The most specific row covering these values (None values are absent), or None."""
        if country is None:
            return None
        c = text_key(country)
        s = text_key(state) if state is not None else ""
        if postal is not None:
            p = postal_key(postal)
            if p:
                keys = ((c, s), (c, "")) if s else ((c, ""),)
                for key in keys:
                    lows = self.lows.get(key)
                    if lows is None:
                        continue
                    i = bisect_right(lows, p) - 1
                    if i >= 0:
                        span = self.spans[key][i]
                        if p <= span.high_end and len(p) >= span.length:
                            return span.row
        if s:
            row = self.areas.get((c, s))
            if row is not None:
                return row
        return self.areas.get((c, ""))


def parse_postal(spec: str) -> tuple[str, str] | str:
    """``941`` -> (941, 941); ``900-961`` -> (900, 961); a message when it is neither."""
    text = spec.strip().upper().replace(" ", "")
    if text.count("-") == 1:
        low, high = text.split("-")
        if not low or len(low) != len(high):
            return f"postal range {spec!r}: both ends need the same number of characters"
        if low > high:
            return f"postal range {spec!r}: low is above high"
        return low, high
    if "-" in text or not text:
        return f"postal code {spec!r}: write a prefix (941) or a range (900-961)"
    return text, text


def build_table(raw_rows: Sequence[Mapping[str, object]], wheres: Sequence[str]) -> Table | str:
    """Check and index rows (each a mapping of ``COLUMNS``); a message naming the rows at
    fault when they overlap or are malformed."""
    rows: list[Row] = []
    spans: dict[tuple[str, str], list[_Span]] = {}
    areas: dict[tuple[str, str], Row] = {}
    for raw, where in zip(raw_rows, wheres, strict=True):
        unknown = sorted(set(map(str, raw)) - set(COLUMNS))
        if unknown:
            return f"{where}: unknown column(s) {', '.join(unknown)} (known: {', '.join(COLUMNS)})"
        values = {k: raw.get(k) for k in COLUMNS}
        if any(v is not None and not isinstance(v, str | int) for v in values.values()):
            return f"{where}: values must be text"
        country = text_key(values["country"] or "")
        team = str(values["team"] or "").strip()
        if not country or not team:
            return f"{where}: needs a country and a team"
        state = text_key(values["state"] or "")
        postal_spec = str(values["postal_code"] or "").strip()
        row = Row(country, state, postal_spec, team, where)
        rows.append(row)
        if not postal_spec:
            prev = areas.get((country, state))
            if prev is not None:
                return f"{prev.where} and {where} overlap: both cover {_area(row)}"
            areas[(country, state)] = row
            continue
        parsed = parse_postal(postal_spec)
        if isinstance(parsed, str):
            return f"{where}: {parsed}"
        low, high = parsed
        spans.setdefault((country, state), []).append(_Span(low, high + TOP, len(low), row))
    table = Table(tuple(rows), areas=areas)
    for key, group in spans.items():
        group.sort(key=lambda s: (s.low, s.high_end))
        for a, b in pairwise(group):
            if b.low <= a.high_end:
                return (
                    f"{a.row.where} and {b.row.where} overlap: postal codes "
                    f"{a.row.postal} and {b.row.postal} of {_area(a.row)}"
                )
            gap = _gap(a, b)
            if gap:
                table.gaps.append(f"{_area(a.row)} {gap} (between {a.row.where} and {b.row.where})")
        table.spans[key] = group
        table.lows[key] = [s.low for s in group]
    return table


def _area(row: Row) -> str:
    return row.country.upper() + (f"/{row.state.upper()}" if row.state else "")


def _gap(a: _Span, b: _Span) -> str | None:
    """The numeric codes between two neighbouring ranges of one length, if any."""
    high = a.high_end[:-1]
    if a.length != b.length or not (high.isdigit() and b.low.isdigit()):
        return None
    first, last = int(high) + 1, int(b.low) - 1
    if first > last:
        return None
    w = a.length
    return f"{first:0{w}d}" if first == last else f"{first:0{w}d}-{last:0{w}d}"
