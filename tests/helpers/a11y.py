"""Accessibility arithmetic for the browser tests: WCAG 2 contrast from CSS colours."""

from __future__ import annotations

import re

RGB = tuple[float, float, float]
RGBA = tuple[float, float, float, float]

_FUNC = re.compile(
    r"^rgba?\(\s*([\d.]+)[,\s]+([\d.]+)[,\s]+([\d.]+)(?:\s*[,/]\s*([\d.]+%?))?\s*\)$"
)


def parse_color(css: str) -> RGBA:
    """A computed CSS colour (rgb()/rgba(), or #rgb/#rrggbb) as (r, g, b, alpha)."""
    s = css.strip().lower()
    m = _FUNC.match(s)
    if m:
        alpha = m.group(4)
        a = (
            1.0
            if alpha is None
            else (float(alpha[:-1]) / 100 if alpha.endswith("%") else float(alpha))
        )
        return (float(m.group(1)), float(m.group(2)), float(m.group(3)), a)
    if re.fullmatch(r"#[0-9a-f]{3}", s):
        return (int(s[1] * 2, 16), int(s[2] * 2, 16), int(s[3] * 2, 16), 1.0)
    if re.fullmatch(r"#[0-9a-f]{6}", s):
        return (int(s[1:3], 16), int(s[3:5], 16), int(s[5:7], 16), 1.0)
    raise ValueError(f"cannot read colour {css!r}")


def blend(top: RGBA, under: RGB) -> RGB:
    """``top`` painted over the opaque colour ``under``."""
    a = top[3]
    if a >= 1:
        return (top[0], top[1], top[2])
    return tuple(top[i] * a + under[i] * (1 - a) for i in range(3))  # type: ignore[return-value]


def relative_luminance(rgb: RGB) -> float:
    def channel(c: float) -> float:
        c = c / 255
        return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4

    r, g, b = (channel(c) for c in rgb)
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def contrast_ratio(fg: RGB, bg: RGB) -> float:
    hi, lo = sorted((relative_luminance(fg), relative_luminance(bg)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)
