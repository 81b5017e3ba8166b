"""Every id and number a user gives is range-checked: `connector.core.limits` (one helper per
kind of value), the command line (one line, exit 2, nothing changed) and the dashboard (400,
nothing changed). The webhook's notification id is in tests/test_web.py."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from sqlalchemy import Engine

from connector.core import limits
from connector.core.metrics import Metrics
from connector.shell.admin import create_admin_app
from connector.shell.cli import main
from connector.shell.service import serve_in_thread
from crm_sandboxes import SalesforceSandbox
from tests.helpers.dashboard_world import ORG, World, build_world, dead_row, outbox_states

TOO_BIG = str(2**63)  # one past the largest bigint

# --- the helpers (pure) --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (TOO_BIG, f"id: {TOO_BIG} is out of range (1 to 9223372036854775807)"),
        ("0", "id: 0 is out of range (1 to 9223372036854775807)"),
        ("-5", "id: -5 is out of range (1 to 9223372036854775807)"),
        ("1e3", "id: 1e3 is not a whole number"),
        ("0x10", "id: 0x10 is not a whole number"),
        ("\u00b2", "id: \u00b2 is not a whole number"),  # a digit to str.isdigit, not to int
        ("", "id: '' is not a whole number"),
        ("9" * 5000, f"id: {'9' * 37}... is out of range (1 to 9223372036854775807)"),
    ],
)
def test_row_id_refusals(value: str, message: str) -> None:
    with pytest.raises(limits.InputRangeError) as info:
        limits.row_id(value)
    assert str(info.value) == message


def test_row_id_accepts_the_whole_bigint_range() -> None:
    assert limits.row_id("1") == 1
    assert limits.row_id(" 9223372036854775807 ") == 2**63 - 1
    assert limits.row_id(42) == 42


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("1e20d", "since: 1e20d is not a span like 30d, 12h or 90m"),
        ("36601d", "since: 36601d is longer than 36600 days"),
        ("99999999999999999999999d", "since: 99999999999999999999999d is longer than 36600 days"),
        ("878401h", "since: 878401h is longer than 36600 days"),
        ("-3d", "since: -3d is not a span like 30d, 12h or 90m"),
        ("3w", "since: 3w is not a span like 30d, 12h or 90m"),
    ],
)
def test_span_refusals(value: str, message: str) -> None:
    with pytest.raises(limits.InputRangeError) as info:
        limits.span(value, "since")
    assert str(info.value) == message


def test_spans_up_to_the_limit() -> None:
    assert limits.span("36600d", "x") == timedelta(days=36_600)
    assert limits.span("878400h", "x") == timedelta(days=36_600)
    assert limits.span("90m", "x") == timedelta(minutes=90)


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "86401", "x"])
def test_seconds_refusals(value: str) -> None:
    with pytest.raises(limits.InputRangeError):
        limits.seconds(value, "lease", 1, 86_400)


def test_key_text_and_log_level() -> None:
    assert limits.key_text("04l000000000001AAA", "<Id>") == "04l000000000001AAA"
    for bad in ("", "x" * 256, "a\nb"):
        with pytest.raises(limits.InputRangeError) as info:
            limits.key_text(bad, "<Id>")
        assert str(info.value) == "<Id> must be 1 to 255 printable characters"
    assert limits.log_level("info") == "INFO"
    with pytest.raises(limits.InputRangeError) as info:
        limits.log_level("bogus")
    assert str(info.value) == "bogus is not a log level (DEBUG, INFO, WARNING, ERROR, CRITICAL)"


# --- the command line ----------------------------------------------------------------------


@pytest.fixture
def world(engine: Engine, sf: SalesforceSandbox) -> World:
    """A database with a dead outbox row (and sent, superseded and pending ones)."""
    return build_world(engine, sf)


ID_RANGE = "is out of range (1 to 9223372036854775807)"


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (
            ["outbox", "retry", "--id", TOO_BIG],
            f"connector outbox: argument --id: {TOO_BIG} {ID_RANGE}",
        ),
        (["outbox", "retry", "--id", "0"], f"connector outbox: argument --id: 0 {ID_RANGE}"),
        (
            ["inbox", "retry", "--id", TOO_BIG],
            f"connector inbox: argument --id: {TOO_BIG} {ID_RANGE}",
        ),
        (
            ["inbox", "retry", "--id", "1.5"],
            "connector inbox: argument --id: 1.5 is not a whole number",
        ),
        (
            ["outbox", "list", "--limit", "99999999999"],
            "connector outbox: argument --limit: 99999999999 is out of range (1 to 2147483647)",
        ),
        (
            ["simulate", "--since", "1e20d"],
            "connector simulate: argument --since: --since '1e20d': give a span like 30d, "
            "12h or 90m, or a date like 2026-11-01",
        ),
        (
            ["simulate", "--since", "999999999999d"],
            "connector simulate: argument --since: --since: 999999999999d is longer than "
            "36600 days",
        ),
        (
            ["simulate", "--since", "0001-01-01T00:00+01:00"],
            "connector simulate: argument --since: --since '0001-01-01T00:00+01:00': give a "
            "span like 30d, 12h or 90m, or a date like 2026-11-01",
        ),
        (
            ["--log-level", "bogus", "status"],
            "connector: argument --log-level: bogus is not a log level (DEBUG, INFO, WARNING, "
            "ERROR, CRITICAL)",
        ),
        (
            ["status", "--log-level", "bogus"],
            "connector status: argument --log-level: bogus is not a log level (DEBUG, INFO, "
            "WARNING, ERROR, CRITICAL)",
        ),
        (
            ["purge", "--days", "99999999999"],
            "connector purge: argument --days: 99999999999 is out of range (1 to 36600)",
        ),
        (
            ["serve", "--port", "70000"],
            "connector serve: argument --port: 70000 is out of range (0 to 65535)",
        ),
        (
            ["dispatch", "--lease-seconds", "nan"],
            "connector dispatch: argument --lease-seconds: nan is out of range (1 to 86400 s)",
        ),
        (
            ["run", "--dispatchers", "-1"],
            "connector run: argument --dispatchers: -1 is out of range (0 to 256)",
        ),
    ],
)
def test_cli_refuses_out_of_range_numbers_in_one_line(
    engine: Engine,
    world: World,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    argv: list[str],
    line: str,
) -> None:
    monkeypatch.setenv("CONNECTOR_CONFIG", "/nonexistent")  # never read: parsing stops first
    before = outbox_states(engine)
    with pytest.raises(SystemExit) as info:
        main(argv)
    out, err = capsys.readouterr()
    assert (info.value.code, out, err) == (2, "", line + "\n")
    assert outbox_states(engine) == before
    assert "dead" in {s for s, _ in before.values()}


def test_cli_environment_numbers_are_checked_too(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CONNECTOR_PORT", "eighty")
    with pytest.raises(SystemExit) as info:
        main(["serve"])
    assert info.value.code == 2
    assert (
        capsys.readouterr().err
        == "connector serve: argument --port: eighty is not a whole number\n"
    )
    monkeypatch.delenv("CONNECTOR_PORT")
    monkeypatch.setenv("CONNECTOR_LOG_LEVEL", "loud")
    with pytest.raises(SystemExit) as info:
        main(["status"])
    assert info.value.code == 2
    assert capsys.readouterr().err == (
        "connector: argument --log-level: loud is not a log level (DEBUG, INFO, WARNING, "
        "ERROR, CRITICAL)\n"
    )


def test_parse_since_keeps_its_forms() -> None:
    from connector.shell.cli import parse_since

    now = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
    assert parse_since("36600d", now) == now - timedelta(days=36_600)
    assert parse_since("2026-11-01T08:00+01:00", now) == datetime(2026, 11, 1, 7, tzinfo=UTC)


# --- the dashboard -------------------------------------------------------------------------


@contextmanager
def dashboard(engine: Engine, world: World) -> Iterator[httpx.Client]:
    app = create_admin_app(engine, Metrics(), token=None, configs={ORG: world.cfg})
    with serve_in_thread(app) as base, httpx.Client(base_url=base, timeout=30) as client:
        yield client


def test_dashboard_refuses_out_of_range_ids_with_400(engine: Engine, world: World) -> None:
    import re

    row = dead_row(engine)
    with dashboard(engine, world) as c:
        page = c.get(f"/dashboard/org/{ORG}").text
        m = re.search(r'name="csrf" value="([0-9a-f]{64})"', page)
        assert m
        before = outbox_states(engine)
        for bad in (TOO_BIG, "9" * 400):
            resp = c.post(f"/dashboard/org/{ORG}/outbox/{bad}/retry", data={"csrf": m.group(1)})
            assert resp.status_code == 400, bad
            assert "outbox row id: " in resp.text and "is out of range" in resp.text
            assert outbox_states(engine) == before
            lead = c.get(f"/dashboard/org/{ORG}/lead/{bad}")
            assert lead.status_code == 400
            assert "lead id: " in lead.text and "is out of range" in lead.text
        shown = c.get(f"/dashboard/org/{ORG}", params={"retried": "\u00b2"})
        assert shown.status_code == 200 and "is pending again" not in shown.text
        # the same form with the dead row's own id still works
        ok = c.post(f"/dashboard/org/{ORG}/outbox/{row}/retry", data={"csrf": m.group(1)})
        assert ok.status_code == 303
        assert outbox_states(engine)[row] == ("pending", 0)
