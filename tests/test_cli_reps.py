"""`connector rep away|back|list`: time off from the command line, on a fresh database."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from connector.shell.cli import main

CONFIG = """
org: acme
crm:
  kind: salesforce
  instance_url: https://acme.my.salesforce.com
  auth: {method: session, access_token: "${ACME_TOKEN}"}
  object: Lead
teams:
  - name: na_ae
    timezone: America/New_York
    members:
      - {crm_user_id: "005A", name: Ada Lovelace}
      - {crm_user_id: "005B", name: Alan, hours: {timezone: Europe/London, mon-fri: "09:00-17:00"}}
      - {crm_user_id: "005S", name: Sam}
  - name: emea
    timezone: Europe/Berlin
    members:
      - crm_user_id: "005C"
        name: Grace
        time_off: [{from: 2020-01-01, until: 2099-01-01, reason: sabbatical}]
      - {crm_user_id: "005S", name: Sam}
      - {crm_user_id: "005T", name: Sam}
rules:
  - {team: na_ae}
"""


@pytest.fixture
def cli_env(tmp_path: Path, db_url: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    cfg = tmp_path / "acme.yaml"
    cfg.write_text(CONFIG, encoding="utf-8")
    monkeypatch.setenv("DATABASE_URL", db_url)
    monkeypatch.setenv("ACME_TOKEN", "tok")
    monkeypatch.setenv("CONNECTOR_CONFIG", str(cfg))
    return cfg


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def stored(engine: Engine) -> list[tuple[object, ...]]:
    with engine.connect() as conn:
        return [
            tuple(r)
            for r in conn.execute(
                text("SELECT org, crm_user_id, until, reason FROM rep_time_off ORDER BY 2")
            )
        ]


def test_away_list_back(cli_env: Path, engine: Engine, capsys: pytest.CaptureFixture[str]) -> None:
    # by name, case-insensitive; a time without an offset is in the rep's team's zone
    code, out, err = run(
        capsys, "rep", "away", "ada lovelace", "--until", "2099-12-24T09:00", "--reason", "PTO"
    )
    assert (code, err) == (0, "")
    assert out == "Ada Lovelace (005A) is away until 2099-12-24 14:00 UTC\n"
    # by id; Alan's working hours are in London, so his local times are too
    code, out, _ = run(capsys, "rep", "away", "005B", "--until", "2099-07-01T09:00")
    assert out == "Alan (005B) is away until 2099-07-01 08:00 UTC\n"
    assert stored(engine) == [
        ("acme", "005A", datetime(2099, 12, 24, 14, tzinfo=UTC), "PTO"),
        ("acme", "005B", datetime(2099, 7, 1, 8, tzinfo=UTC), None),
    ]
    # setting it again replaces it; an explicit offset wins over the rep's zone
    run(capsys, "rep", "away", "005B", "--until", "2099-07-02T09:00+02:00")
    assert stored(engine)[1][2] == datetime(2099, 7, 2, 7, tzinfo=UTC)
    code, out, err = run(capsys, "rep", "list")
    assert (code, err) == (0, "")
    assert out.splitlines() == [
        "005A\tAda Lovelace\tna_ae\taway until 2099-12-24 14:00 UTC (PTO, command line)",
        "005B\tAlan\tna_ae\taway until 2099-07-02 07:00 UTC (command line)",
        "005S\tSam\tna_ae,emea\tavailable",
        "005C\tGrace\temea\taway until 2098-12-31 23:00 UTC (sabbatical, config)",
        "005T\tSam\temea\tavailable",
    ]
    code, out, _ = run(capsys, "rep", "back", "005A")
    assert (code, out) == (0, "Ada Lovelace (005A) is back\n")
    code, out, _ = run(capsys, "rep", "back", "005A")
    assert (code, out) == (0, "Ada Lovelace (005A) had no time off set from the command line\n")
    assert [r[1] for r in stored(engine)] == ["005B"]


BAD = [
    (
        ["rep", "away", "Nobody", "--until", "2099-01-01"],
        "connector: org acme: no rep 'Nobody' in the config (give a crm_user_id or a name; "
        "`connector rep list` shows them)\n",
    ),
    (
        ["rep", "back", "005Z"],
        "connector: org acme: no rep '005Z' in the config (give a crm_user_id or a name; "
        "`connector rep list` shows them)\n",
    ),
    (
        ["rep", "away", "sam", "--until", "2099-01-01"],
        "connector: org acme: 'sam' names several reps (005S, 005T): give a crm_user_id\n",
    ),
    (
        ["rep", "away", "005S", "--until", "2099-01-01"],
        "connector: --until '2099-01-01': Sam works in several time zones (America/New_York, "
        "Europe/Berlin); give the offset, e.g. 2026-12-24T09:00+01:00\n",
    ),
    (
        ["rep", "away", "005A"],
        "connector: rep away: --until is required (e.g. --until 2026-12-24T09:00)\n",
    ),
    (
        ["rep", "away", "005A", "--until", "next week"],
        "connector: --until: 'next week' is not a date or date-time like 2026-12-24T09:00\n",
    ),
    (
        ["rep", "away", "005A", "--until", "2001-01-01T09:00"],
        "connector: --until '2001-01-01T09:00' is not in the future\n",
    ),
    (
        ["rep", "away", "005A", "--until", "2099-01-01", "--reason", "x" * 201],
        "connector: --reason: must be 1 to 200 printable characters on one line\n",
    ),
    (  # in range for Python, but more than limits.MAX_SPAN_DAYS away
        ["rep", "away", "005A", "--until", "9000-01-01T00:00+00:00"],
        "connector: --until '9000-01-01T00:00+00:00' is more than 36600 days away\n",
    ),
    (  # past the last instant Python can read back from the database
        ["rep", "away", "005A", "--until", "9999-12-31T23:59-12:00"],
        "connector: --until '9999-12-31T23:59-12:00' is out of range\n",
    ),
    (
        ["rep", "away", "005A", "--until", "2099-01-01", "--reason", "two\nlines"],
        "connector: --reason: must be 1 to 200 printable characters on one line\n",
    ),
]


@pytest.mark.parametrize(("argv", "message"), BAD, ids=[" ".join(a[:3]) for a, _ in BAD])
def test_bad_input_is_refused_and_nothing_is_stored(
    cli_env: Path,
    engine: Engine,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    message: str,
) -> None:
    code, out, err = run(capsys, *argv)
    assert (code, out, err) == (2, "", message)
    assert stored(engine) == []


def test_unknown_org(cli_env: Path, engine: Engine, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "rep", "list", "--org", "globex")
    assert (code, err) == (2, "connector: org 'globex' is not configured (known: acme)\n")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["rep", "away", "--until", "2099-01-01"], "the following arguments are required: REP"),
        (["rep", "back", "005A", "--until", "2099-01-01"], "unrecognized arguments: --until"),
        (["rep", "list", "005A"], "unrecognized arguments: 005A"),
        (["rep", "away", "005A", "--reroute"], "unrecognized arguments: --reroute"),
    ],
)
def test_usage_mistakes_are_refused_by_the_parser(
    cli_env: Path,
    engine: Engine,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    message: str,
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
    assert stored(engine) == []
