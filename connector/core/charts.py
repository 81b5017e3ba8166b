"""Charts as inline SVG, drawn on the server: pure functions from numbers to markup, so the
dashboard needs no script, no CDN and no network."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

INK = "#1f2328"  # text and axes: 15.8:1 on white
GRID = "#d0d7de"
BAR = "#0b5cad"  # actual counts
SHARE = "#b35900"  # fair share marker
SERIES = ("#0b5cad", "#b35900", "#1a7f37", "#8250df")
DASHES = ("", "6 3", "2 3", "8 3 2 3")


@dataclass(frozen=True)
class Bar:
    label: str
    value: float
    reference: float | None = None  # drawn as a marker across the bar (the fair share)


@dataclass(frozen=True)
class Series:
    name: str
    values: Sequence[float | None]  # one per x label; None leaves a gap


def nice_ceiling(value: float) -> float:
    """The smallest 1, 2, 2.5 or 5 times a power of ten that is >= value (1 for 0 or less)."""
    if value <= 0 or not math.isfinite(value):
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 2.5, 5, 10):
        if step * power >= value * (1 - 1e-12):
            return float(step * power)
    return float(10 * power)  # pragma: no cover - the loop always returns


def ticks(top: float) -> list[float]:
    """Axis ticks from 0 to ``top`` (a nice_ceiling) in round steps: quarters of a 2 x 10^k
    top, fifths of any other."""
    lead = top / 10 ** math.floor(math.log10(top)) if top > 0 else 1.0
    count = 4 if abs(lead - 2) < 1e-9 else 5
    return [top * i / count for i in range(count + 1)]


def fmt_number(value: float) -> str:
    """A tick or value label: integers without decimals, others with at most two."""
    if abs(value - round(value)) < 1e-9:
        return f"{round(value):,}"
    return f"{value:,.2f}".rstrip("0").rstrip(".")


def _svg_open(width: int, height: int, title: str, desc: str, ident: str) -> str:
    return (
        f'<svg class="chart" role="img" '
        f'width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        f'aria-labelledby="{ident}-t {ident}-d">'
        f'<title id="{ident}-t">{escape(title)}</title><desc id="{ident}-d">{escape(desc)}</desc>'
        f'<rect width="{width}" height="{height}" fill="#ffffff"/>'
    )


def bar_chart(
    bars: Sequence[Bar],
    *,
    title: str,
    ident: str,
    width: int = 560,
    reference_label: str = "fair share",
) -> str:
    """Horizontal bars (one per label) with an optional reference marker on each."""
    row, label_w, pad_top, pad_bottom, right = 26, 170, 8, 28, 56
    height = pad_top + pad_bottom + row * max(len(bars), 1)
    plot_w = width - label_w - right
    top = nice_ceiling(max([b.value for b in bars] + [b.reference or 0 for b in bars] + [0]))
    desc = "; ".join(
        f"{b.label}: {fmt_number(b.value)}"
        + ("" if b.reference is None else f" ({reference_label} {fmt_number(b.reference)})")
        for b in bars
    )
    out = [_svg_open(width, height, title, desc or "no data", ident)]
    axis_y = pad_top + row * max(len(bars), 1)
    for t in ticks(top):
        x = label_w + plot_w * t / top
        out.append(
            f'<line x1="{x:.1f}" y1="{pad_top}" x2="{x:.1f}" y2="{axis_y}" stroke="{GRID}"/>'
            f'<text x="{x:.1f}" y="{axis_y + 16}" font-size="11" text-anchor="middle" '
            f'fill="{INK}">{fmt_number(t)}</text>'
        )
    for i, b in enumerate(bars):
        y = pad_top + i * row
        w = plot_w * b.value / top
        out.append(
            f'<text x="{label_w - 6}" y="{y + 17}" font-size="12" text-anchor="end" '
            f'fill="{INK}">{escape(b.label)}</text>'
            f'<rect x="{label_w}" y="{y + 5}" width="{w:.1f}" height="{row - 10}" fill="{BAR}"/>'
            f'<text x="{label_w + w + 4:.1f}" y="{y + 17}" font-size="11" '
            f'fill="{INK}">{fmt_number(b.value)}</text>'
        )
        if b.reference is not None:
            x = label_w + plot_w * b.reference / top
            out.append(
                f'<line x1="{x:.1f}" y1="{y + 2}" x2="{x:.1f}" y2="{y + row - 2}" '
                f'stroke="{SHARE}" stroke-width="3"/>'
            )
    out.append(
        f'<line x1="{label_w}" y1="{pad_top}" x2="{label_w}" y2="{axis_y}" stroke="{INK}"/></svg>'
    )
    return "".join(out)


def line_chart(
    x_labels: Sequence[str],
    series: Sequence[Series],
    *,
    title: str,
    ident: str,
    unit: str = "",
    width: int = 640,
    height: int = 220,
) -> str:
    """Lines over evenly spaced x labels; every point also gets a dot (single points show)."""
    left, right, pad_top, bottom = 56, 16, 12, 40
    plot_w, plot_h = width - left - right, height - pad_top - bottom
    values = [v for s in series for v in s.values if v is not None]
    top = nice_ceiling(max(values, default=0.0))
    n = len(x_labels)
    desc = "; ".join(
        f"{s.name}: "
        + ", ".join(
            f"{x} {fmt_number(v)}{unit}"
            for x, v in zip(x_labels, s.values, strict=False)
            if v is not None
        )
        for s in series
    )
    out = [_svg_open(width, height, title, desc if values else "no data", ident)]

    def px(i: int) -> float:
        return left + (plot_w * i / (n - 1) if n > 1 else plot_w / 2)

    def py(v: float) -> float:
        return pad_top + plot_h * (1 - v / top)

    for t in ticks(top):
        y = py(t)
        out.append(
            f'<line x1="{left}" y1="{y:.1f}" x2="{left + plot_w}" y2="{y:.1f}" stroke="{GRID}"/>'
            f'<text x="{left - 6}" y="{y + 4:.1f}" font-size="11" text-anchor="end" '
            f'fill="{INK}">{fmt_number(t)}{escape(unit)}</text>'
        )
    step = max(1, math.ceil(n / 8))
    for i, label in enumerate(x_labels):
        if i % step == 0 or i == n - 1:
            out.append(
                f'<text x="{px(i):.1f}" y="{pad_top + plot_h + 16}" font-size="11" '
                f'text-anchor="middle" fill="{INK}">{escape(label)}</text>'
            )
    for k, s in enumerate(series):
        color, dash = SERIES[k % len(SERIES)], DASHES[k % len(DASHES)]
        runs: list[list[tuple[float, float]]] = [[]]
        for i, v in enumerate(s.values[:n]):
            if v is None:
                runs.append([])
            else:
                runs[-1].append((px(i), py(v)))
        for run in runs:
            if len(run) > 1:
                pts = " ".join(f"{x:.1f},{y:.1f}" for x, y in run)
                dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
                out.append(
                    f'<polyline points="{pts}" fill="none" stroke="{color}" '
                    f'stroke-width="2"{dash_attr}/>'
                )
            for x, y in run:
                out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.5" fill="{color}"/>')
        lx = left + 8 + k * 110
        out.append(
            f'<line x1="{lx}" y1="{height - 8}" x2="{lx + 18}" y2="{height - 8}" '
            f'stroke="{color}" stroke-width="2"'
            + (f' stroke-dasharray="{dash}"' if dash else "")
            + f'/><text x="{lx + 22}" y="{height - 4}" font-size="11" fill="{INK}">'
            f"{escape(s.name)}</text>"
        )
    out.append(
        f'<line x1="{left}" y1="{pad_top}" x2="{left}" y2="{pad_top + plot_h}" stroke="{INK}"/>'
        f'<line x1="{left}" y1="{pad_top + plot_h}" x2="{left + plot_w}" '
        f'y2="{pad_top + plot_h}" stroke="{INK}"/></svg>'
    )
    return "".join(out)


def standalone(svg: str) -> str:
    """An inline chart as a file of its own (an SVG file needs its namespace)."""
    return svg.replace("<svg ", '<svg xmlns="http://www.w3.org/2000/svg" ', 1) + "\n"
