"""`connector rep away|back|list`: time off from the command line, on a fresh database."""

from __future__ import annotations

import json
from datetime import UTC, datetime, time, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from sqlalchemy import Engine, text

from connector.core.hours import DAYS
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
        "REP   NAME          TEAMS       NOW",
        "005A  Ada Lovelace  na_ae       away until 2099-12-24 14:00 UTC (PTO, command line)",
        "005B  Alan          na_ae       away until 2099-07-02 07:00 UTC (command line)",
        "005S  Sam           na_ae,emea  available",
        "005C  Grace         emea        away until 2098-12-31 23:00 UTC (sabbatical, config)",
        "005T  Sam           emea        available",
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
        ["rep", "away", "ada lovelance", "--until", "2099-01-01"],
        "connector: org acme: no rep 'ada lovelance' in the config; did you mean 'Ada Lovelace'?\n",
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


STATES = """
org: acme
crm:
  kind: salesforce
  instance_url: https://acme.my.salesforce.com
  auth: {method: session, access_token: "${ACME_TOKEN}"}
  object: Lead
teams:
  - name: na
    members:
      - {crm_user_id: "005A", name: Ada}
      - {crm_user_id: "005B", name: Bob, hours: {timezone: UTC, %(day)s: "09:00-10:00"}}
      - {crm_user_id: "005C", name: Cy, caps: {per_day: 0}}
  - name: emea
    timezone: Asia/Tokyo
    members:
      - {crm_user_id: "005A", name: Ada, caps: {per_week: 0}}
      - {crm_user_id: "005D", name: Dee, active: false}
rules:
  - {team: na}
"""


def test_rep_list_and_status_show_each_state_now_with_its_end(
    tmp_path: Path, db_url: str, engine: Engine, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """Off shift until the next shift start, capped until the cap's day or week ends in the
    team's zone, inactive; a rep whose teams disagree shows each team's state."""
    today = datetime.now(UTC).date()
    day = today + timedelta(days=2)  # not today nor tomorrow: Bob is off shift until then
    cfg = tmp_path / "acme.yaml"
    cfg.write_text(STATES % {"day": DAYS[day.weekday()]}, encoding="utf-8")
    monkeypatch.setenv("DATABASE_URL", db_url)
    monkeypatch.setenv("ACME_TOKEN", "tok")
    monkeypatch.setenv("CONNECTOR_CONFIG", str(cfg))
    bob_back = datetime.combine(day, time(9), UTC)
    cy_reset = datetime.combine(today + timedelta(days=1), time(0), UTC)
    tokyo = datetime.now(ZoneInfo("Asia/Tokyo")).date()
    monday = tokyo - timedelta(days=tokyo.weekday()) + timedelta(days=7)
    ada_reset = datetime.combine(monday, time(0), ZoneInfo("Asia/Tokyo"))

    def utc(value: datetime) -> str:
        return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")

    code, out, err = run(capsys, "rep", "list")  # one org: --org is optional
    assert (code, err) == (0, "")
    assert [line.split("  ", 1)[0] for line in out.splitlines()] == [
        "REP", "005A", "005B", "005C", "005D"
    ]  # fmt: skip
    at = out.splitlines()[0].index("NOW")
    states = {line[:4]: line[at:] for line in out.splitlines()[1:]}
    assert states == {
        "005A": f"na: available; emea: capped until {utc(ada_reset)} (0 of 0 leads this week)",
        "005B": f"off shift until {utc(bob_back)}",
        "005C": f"capped until {utc(cy_reset)} (0 of 0 leads today)",
        "005D": "inactive",
    }
    code, out, err = run(capsys, "status", "--json")
    assert (code, err) == (0, "")
    members = {
        (t["name"], m["crm_user_id"]): m["now"] for t in json.loads(out)["teams"]
        for m in t["members"]
    }  # fmt: skip
    assert members[("na", "005B")] == {
        "state": "off_shift",
        "until": bob_back.isoformat(),
        "note": None,
        "text": f"off shift until {utc(bob_back)}",
    }
    assert members[("emea", "005A")]["until"] == ada_reset.isoformat()
    assert members[("na", "005A")]["state"] == "available"
    code, out, _ = run(capsys, "status")
    assert f"off shift until {utc(bob_back)}" in out and "REP " in out


def test_org_is_optional_with_one_org_and_named_with_several(
    cli_env: Path, engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    folder = tmp_path / "orgs"
    folder.mkdir()
    (folder / "acme.yaml").write_text(CONFIG, encoding="utf-8")
    (folder / "globex.yaml").write_text(CONFIG.replace("org: acme", "org: globex"), "utf-8")
    monkeypatch.setenv("CONNECTOR_CONFIG", str(folder))
    for argv in (["rep", "list"], ["status"], ["outbox", "list"], ["inbox", "list"]):
        code, out, err = run(capsys, *argv)
        assert (code, out, err) == (
            2,
            "",
            "connector: several orgs configured (acme, globex): pass --org\n",
        ), argv
    code, out, _ = run(capsys, "rep", "list", "--org", "globex")
    assert code == 0 and out.startswith("REP ")
