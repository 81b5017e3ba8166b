"""Small SVG charts rendered on the server (pure functions; no JavaScript, no CDN).

Every label is XML-escaped. Colours are chosen for contrast on white (each >= 4.5:1).
"""

from __future__ import annotations

from collections.abc import Sequence
from xml.sax.saxutils import escape

# Series colours (dark enough for 4.5:1 against white, told apart without relying on hue alone:
# the legend names each one).
PALETTE = ("#1f4e8c", "#b34700", "#2d6a2d", "#6b2c91")
TEXT = "#1a1a1a"
AXIS = "#595959"


def _fmt(x: float) -> str:
    return f"{x:.1f}".rstrip("0").rstrip(".")


def grouped_bars(
    title: str,
    labels: Sequence[str],
    series: Sequence[tuple[str, Sequence[float]]],
    *,
    width: int = 720,
    bar_height: int = 14,
) -> str:
    """Horizontal grouped bars: one group per label, one bar per series, values written out.

    ``series`` is ``[(name, values)]`` with one value per label.
    """
    for name, values in series:
        if len(values) != len(labels):
            raise ValueError(f"series {name!r} has {len(values)} values for {len(labels)} labels")
    label_w, pad, value_w = 200, 8, 56
    group_h = bar_height * max(len(series), 1) + pad
    top = 48
    height = top + group_h * len(labels) + 16
    peak = max((v for _, vals in series for v in vals), default=0.0) or 1.0
    plot_w = width - label_w - value_w - 2 * pad
    label = escape(title, {'"': "&quot;"})
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="{label}">',
        f"<title>{escape(title)}</title>",
        f'<rect width="{width}" height="{height}" fill="#ffffff"/>',
        f'<text x="{pad}" y="18" font-family="sans-serif" font-size="14" fill="{TEXT}" '
        f'font-weight="bold">{escape(title)}</text>',
    ]
    x = label_w
    for i, (name, _) in enumerate(series):
        colour = PALETTE[i % len(PALETTE)]
        out.append(f'<rect x="{x}" y="28" width="12" height="12" fill="{colour}"/>')
        out.append(
            f'<text x="{x + 16}" y="38" font-family="sans-serif" font-size="12" '
            f'fill="{TEXT}">{escape(name)}</text>'
        )
        x += 24 + 8 * len(name)
    for g, label in enumerate(labels):
        y0 = top + g * group_h
        out.append(
            f'<text x="{label_w - pad}" y="{y0 + group_h / 2 + 4:.1f}" text-anchor="end" '
            f'font-family="sans-serif" font-size="12" fill="{TEXT}">{escape(label)}</text>'
        )
        for i, (_, values) in enumerate(series):
            v = float(values[g])
            w = max(plot_w * v / peak, 0.0)
            y = y0 + i * bar_height
            colour = PALETTE[i % len(PALETTE)]
            out.append(
                f'<rect x="{label_w}" y="{y}" width="{w:.1f}" height="{bar_height - 2}" '
                f'fill="{colour}"/>'
            )
            out.append(
                f'<text x="{label_w + w + 4:.1f}" y="{y + bar_height - 4}" '
                f'font-family="sans-serif" font-size="11" fill="{TEXT}">{_fmt(v)}</text>'
            )
    out.append(
        f'<line x1="{label_w}" y1="{top - 4}" x2="{label_w}" y2="{height - 12}" '
        f'stroke="{AXIS}" stroke-width="1"/>'
    )
    out.append("</svg>")
    return "\n".join(out) + "\n"
