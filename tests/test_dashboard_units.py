"""The dashboard's pure parts: SVG charts, fair shares and windows, sessions and CSRF values,
and the contrast arithmetic the browser tests use."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta, timezone

import pytest

from connector.core import charts
from connector.shell.dashboard import figures, security
from tests.helpers.a11y import blend, contrast_ratio, parse_color, relative_luminance

# --- charts ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (0, 1),
        (-3, 1),
        (1, 1),
        (3, 5),
        (5, 5),
        (7, 10),
        (12, 20),
        (21, 25),
        (0.3, 0.5),
        (2500, 2500),
        (2501, 5000),
        (float("nan"), 1),
    ],
)
def test_nice_ceiling(value: float, expected: float) -> None:
    assert charts.nice_ceiling(value) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("top", "expected"),
    [
        (5, [0, 1, 2, 3, 4, 5]),
        (20, [0, 5, 10, 15, 20]),
        (2.5, [0, 0.5, 1, 1.5, 2, 2.5]),
        (1, [0, 0.2, 0.4, 0.6, 0.8, 1]),
    ],
)
def test_ticks_are_round(top: float, expected: list[float]) -> None:
    assert charts.ticks(top) == pytest.approx(expected)


def test_fmt_number() -> None:
    assert [charts.fmt_number(v) for v in (0, 3.0, 1234567, 2.5, 0.125, 1.10)] == [
        "0",
        "3",
        "1,234,567",
        "2.5",
        "0.12",
        "1.1",
    ]


def _widths(svg: str) -> list[float]:
    return [float(w) for w in re.findall(r'<rect x="\d+" y="[\d.]+" width="([\d.]+)"', svg)]


def test_bar_chart_scales_bars_and_marks_the_fair_share() -> None:
    svg = charts.bar_chart(
        [charts.Bar("Ada", 2, 2.25), charts.Bar("Alan", 5, 4.5), charts.Bar("Zero", 0, 0)],
        title="t",
        ident="x",
    )
    widths = _widths(svg)
    assert widths[1] == pytest.approx(widths[0] * 2.5, rel=0.01)  # 5 vs 2 on one scale
    assert widths[2] == 0
    markers = re.findall(r'stroke="#b35900" stroke-width="3"', svg)
    assert len(markers) == 3
    assert svg.startswith('<svg class="chart" role="img"')
    assert 'aria-labelledby="x-t x-d"' in svg
    assert '<desc id="x-d">Ada: 2 (fair share 2.25); Alan: 5 (fair share 4.5); Zero: 0' in svg


def test_chart_text_is_escaped_and_nothing_is_fetched() -> None:
    evil = '<script>alert("x")</script> & "q"'
    svg = charts.bar_chart([charts.Bar(evil, 1)], title=evil, ident="e")
    svg += charts.line_chart([evil], [charts.Series(evil, [1.0])], title=evil, ident="l")
    assert "<script>" not in svg
    assert "&lt;script&gt;" in svg
    assert "http" not in svg and "href" not in svg


def test_empty_charts_render() -> None:
    assert "no data" in charts.bar_chart([], title="t", ident="b")
    svg = charts.line_chart(["a", "b"], [charts.Series("p50", [None, None])], title="t", ident="l")
    assert "no data" in svg and "<polyline" not in svg


def test_line_chart_breaks_at_gaps_and_marks_single_points() -> None:
    svg = charts.line_chart(
        ["0", "1", "2", "3", "4"],
        [charts.Series("p50", [1.0, 2.0, None, 4.0, None])],
        title="t",
        ident="l",
        width=456,
    )
    lines = re.findall(r'<polyline points="([^"]+)"', svg)
    assert len(lines) == 1  # 0-1 joined; 3 alone gets only a dot
    assert len(lines[0].split()) == 2
    assert svg.count("<circle") == 3
    # y is measured down from the top: 4 (the top of a 5 axis) is higher than 1
    ys = [float(y) for y in re.findall(r'<circle cx="[\d.]+" cy="([\d.]+)"', svg)]
    assert ys[2] < ys[1] < ys[0]


# --- figures --------------------------------------------------------------------------------


def test_fair_shares_are_weighted_over_the_active_members() -> None:
    assert figures.fair_shares({1: 1, 2: 2, 3: 1}, [1, 2, 3], 12) == {1: 3.0, 2: 6.0, 3: 3.0}
    assert figures.fair_shares({1: 1, 2: 2, 3: 1}, [1, 2], 9) == {1: 3.0, 2: 6.0, 3: 0.0}
    assert figures.fair_shares({1: 1}, [], 5) == {1: 0.0}
    assert figures.fair_shares({}, [], 0) == {}


def _m(mid: int, team: str, weight: int = 1, active: bool = True) -> figures.Member:
    return figures.Member(1, team, mid, f"005{mid}", f"Rep {mid}", weight, active)


def test_team_windows_in_config_order_with_departed_members_that_had_leads() -> None:
    members = [
        _m(1, "b"),
        _m(2, "b", 3),
        _m(3, "b", active=False),
        _m(4, "b", active=False),
        _m(5, "a"),
    ]
    out = figures.team_windows(members, {1: 2, 2: 5, 3: 1}, ["b", "a", "empty"])
    assert [w.team for w in out] == ["b", "a", "empty"]
    b = out[0]
    assert b.total == 8
    assert [(r.member_id, r.leads, r.fair_share) for r in b.reps] == [
        (1, 2, 2.0),
        (2, 5, 6.0),
        (3, 1, 0.0),  # member 4: inactive, no leads: not shown
    ]
    assert out[1].total == 0 and out[1].reps[0].fair_share == 0
    assert out[2].reps == []


def test_day_and_hour_windows_are_utc() -> None:
    now = datetime(2026, 12, 3, 1, 30, tzinfo=timezone(timedelta(hours=5)))  # 20:30 UTC, Dec 2
    assert figures.start_of_day(now) == datetime(2026, 12, 2, tzinfo=UTC)
    slots = figures.hour_slots(now, 3)
    assert slots == [datetime(2026, 12, 2, h, tzinfo=UTC) for h in (18, 19, 20)]
    assert figures.fill_slots(slots, {slots[1]: 2.5}) == [None, 2.5, None]


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (None, "–"),
        (0.0123, "12 ms"),
        (0.5, "500 ms"),
        (1, "1.0 s"),
        (59.9, "59.9 s"),
        (90, "1.5 min"),
        (7200, "2.0 h"),
        (172800, "2.0 d"),
    ],
)
def test_fmt_seconds(seconds: float | None, text: str) -> None:
    assert figures.fmt_seconds(seconds) == text


# --- sessions and CSRF ----------------------------------------------------------------------


def test_session_cookie_round_trip_and_forgeries() -> None:
    key = security.session_key(None)
    cookie = security.new_session(key)
    nonce = security.session_nonce(key, cookie)
    assert nonce is not None and cookie.startswith(nonce + ".")
    other = security.session_key(None)  # another process without a token: its own key
    assert security.session_nonce(other, cookie) is None
    for forged in (
        None,
        "",
        "abc",
        f"{nonce}.",
        f"{nonce}.{'0' * 64}",
        f".{cookie}",
        f"{nonce}x.{cookie.split('.')[1]}",
        cookie + ".x",
    ):
        assert security.session_nonce(key, forged) is None, forged


def test_token_mode_key_is_stable_so_replicas_share_sessions() -> None:
    a, b = security.session_key("tok-1"), security.session_key("tok-1")
    assert a == b != security.session_key("tok-2")
    cookie = security.new_session(a)
    assert security.session_nonce(b, cookie) is not None
    assert security.session_nonce(security.session_key("tok-2"), cookie) is None


def test_csrf_value_is_bound_to_its_cookie() -> None:
    key = security.session_key("tok")
    one, two = security.new_session(key), security.new_session(key)
    n1 = security.session_nonce(key, one)
    assert n1 is not None
    value = security.csrf_token(key, n1)
    assert security.csrf_ok(key, one, value)
    assert not security.csrf_ok(key, two, value)  # another session's value
    assert not security.csrf_ok(key, None, value)
    assert not security.csrf_ok(key, one, None)
    assert not security.csrf_ok(key, one, "")
    assert not security.csrf_ok(key, one, value[:-1])
    assert not security.csrf_ok(security.session_key("other"), one, value)


def test_bearer() -> None:
    assert security.bearer_ok("t0k", "Bearer t0k")
    for given in ("", "t0k", "Bearer t0k ", "bearer t0k", "Bearer t0", "Basic t0k"):
        assert not security.bearer_ok("t0k", given), given
    assert not security.bearer_ok(None, "Bearer ")


# --- contrast (tests/helpers/a11y.py, used by the browser tests) -----------------------------


def test_parse_color() -> None:
    assert parse_color("rgb(31, 35, 40)") == (31, 35, 40, 1.0)
    assert parse_color("rgba(0, 0, 0, 0)") == (0, 0, 0, 0.0)
    assert parse_color("rgba(10, 20, 30, 0.5)") == (10, 20, 30, 0.5)
    assert parse_color("#0b5cad") == (11, 92, 173, 1.0)
    assert parse_color("#fff") == (255, 255, 255, 1.0)
    with pytest.raises(ValueError):
        parse_color("color(srgb 1 0 0)")


def test_contrast_ratio_known_values() -> None:
    assert relative_luminance((255, 255, 255)) == pytest.approx(1.0)
    assert contrast_ratio((0, 0, 0), (255, 255, 255)) == pytest.approx(21.0)
    assert contrast_ratio((255, 255, 255), (255, 255, 255)) == pytest.approx(1.0)
    # #767676 on white is the well-known 4.54:1 grey
    assert contrast_ratio((118, 118, 118), (255, 255, 255)) == pytest.approx(4.54, abs=0.01)
    assert contrast_ratio((119, 119, 119), (255, 255, 255)) < 4.5


def test_blend_semi_transparent_colour_over_its_background() -> None:
    assert blend((0, 0, 0, 0.5), (255, 255, 255)) == pytest.approx((127.5, 127.5, 127.5))
    assert blend((10, 20, 30, 1.0), (255, 255, 255)) == (10, 20, 30)
    assert blend((10, 20, 30, 0.0), (1, 2, 3)) == (1, 2, 3)
