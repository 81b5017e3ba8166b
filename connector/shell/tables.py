"""Plain-text tables for the command line: a header row, then aligned columns (pure)."""

from __future__ import annotations

from collections.abc import Sequence


def table(
    headers: Sequence[str],
    rows: Sequence[Sequence[object]],
    right: Sequence[int] = (),
    indent: str = "",
) -> list[str]:
    """The lines of a table: ``headers`` then ``rows``, columns two spaces apart, those
    numbered in ``right`` aligned right; no trailing spaces. Cells are shown with str()."""
    cells = [[str(h) for h in headers], *[[str(c) for c in row] for row in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = []
    for r in cells:
        parts = [c.rjust(widths[i]) if i in right else c.ljust(widths[i]) for i, c in enumerate(r)]
        lines.append((indent + "  ".join(parts)).rstrip())
    return lines
