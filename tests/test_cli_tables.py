"""The command line's lists are tables with a header row: `outbox list` (dead, superseded)
and `inbox list`, on the dashboard tests' routed world (a dead row, a superseded row, two
pushes), the CLI in-process."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import Engine

from connector.shell.cli import main
from crm_sandboxes import SalesforceSandbox
from tests.helpers.dashboard_world import ORG, World, build_world


@pytest.fixture
def world(
    engine: Engine,
    sf: SalesforceSandbox,
    db_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> World:
    w = build_world(engine, sf)
    monkeypatch.setenv("DATABASE_URL", db_url)
    monkeypatch.setenv("CONNECTOR_CONFIG", str(w.write_config(tmp_path)))
    for k, v in w.env.items():
        monkeypatch.setenv(k, v)
    return w


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[str], str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out.splitlines(), err


def cells(header: str, line: str) -> dict[str, str]:
    """A table row's cells by column, cut where the header's columns start."""
    names = [n.strip() for n in header.split("  ") if n.strip()]
    starts = [header.index(n) for n in names]
    ends = [*starts[1:], None]
    return {n: line[a:b].strip() for n, a, b in zip(names, starts, ends, strict=True)}


def test_outbox_and_inbox_lists_have_headers(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    code, lines, err = run(capsys, "outbox", "list")  # one org: --org is optional
    assert (code, err) == (0, "1 dead rows\n")
    assert lines[0].split() == ["ROW", "OBJECT", "CRM", "ID", "OWNER", "ATTEMPTS", "LAST", "ERROR"]
    dead = cells(lines[0], lines[1])
    assert dead["CRM ID"] == world.dead_crm_id and dead["OWNER"] in world.reps
    assert dead["OBJECT"] == "Lead" and dead["ATTEMPTS"] == "1"
    assert dead["LAST ERROR"].startswith("NOT_FOUND")
    assert len(lines) == 2

    code, lines, err = run(capsys, "outbox", "list", "--org", ORG, "--superseded")
    assert (code, err) == (0, "1 superseded rows\n")
    assert "FOUND OWNER" in lines[0]
    row = cells(lines[0], lines[1])
    assert (row["CRM ID"], row["FOUND OWNER"]) == (world.superseded_crm_id, world.reps[3])

    code, lines, err = run(capsys, "inbox", "list", "--state", "done")
    assert (code, err) == (0, "2 done events\n")
    assert lines[0].split() == ["EVENT", "SOURCE", "CRM", "ID", "ATTEMPTS", "LAST", "ERROR"]
    rows = [cells(lines[0], line) for line in lines[1:]]
    assert {r["SOURCE"] for r in rows} == {"salesforce_outbound"}
    assert world.pushed_crm_id in {r["CRM ID"] for r in rows}

    # nothing to list: no table, the count on stderr
    code, lines, err = run(capsys, "inbox", "list")
    assert (code, lines, err) == (0, [], "0 dead events\n")
