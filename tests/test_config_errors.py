"""Configuration errors that teach: every problem of a file at once, one line each
(`file:line: key.path: what is wrong; what to write`), secrets refused in every disguise, and
nothing stored when a config is refused."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from sqlalchemy import Engine, text

from connector.core.config import ConfigError
from connector.core.config_loading import ConfigProblems, parse_config
from connector.core.yaml_source import read_yaml
from connector.shell.cli import main

ROOT = Path(__file__).resolve().parent.parent
SECRET = "s3cret-value-never-printed"
OM = "om-url-secret-0123456789abcdef"
ENV = {"SF_ID": "client-id", "SF_SECRET": SECRET, "SF_OM": OM, "PGPASS": SECRET}

GOOD = """\
org: acme
crm:
  kind: salesforce
  instance_url: https://acme.my.salesforce.com
  auth:
    method: client_credentials
    client_id: ${SF_ID}
    client_secret: ${SF_SECRET}
  object: Lead
  organization_id: 00D5g000004ABCDEA4
  outbound_secrets: ["${SF_OM}"]
intake_owner_ids: ["00G5g00000QueueEAB"]
teams:
  - name: na_ae
    overflow_team: row_ae
    members:
      - {crm_user_id: "0055g00000AbCdEAAV", name: Ada Lovelace, weight: 1}
      - {crm_user_id: "0055g00000AbCdFAAV", name: Alan Turing, weight: 2}
  - name: row_ae
    members:
      - {crm_user_id: "0055g00000AbCdGAAV", name: Grace Hopper}
rules:
  - {team: na_ae, when: {Country: [US, CA]}, route_to: team}
  - {team: row_ae}
"""
# Six slips in one file, on lines 9, 15, 17, 18 and 23.
BAD = (
    GOOD.replace("  object: Lead", "  objct: Lead")
    .replace("overflow_team: row_ae", "overflow_team: row")
    .replace("name: Ada Lovelace, weight: 1", "name: Ada Lovelace, wieght: 1")
    .replace(
        '"0055g00000AbCdFAAV", name: Alan Turing, weight: 2', "101, name: Alan Turing, weight: 0"
    )
    .replace("{team: na_ae, when", "{team: na_ea, when")
    .replace("route_to: team}", "route_to: acount_owner}")
)
BAD_LINES = [
    "acme.yaml:9: crm.objct: unknown key; did you mean `object`?",
    "acme.yaml:15: teams[0].overflow_team: unknown team `row`; did you mean `row_ae`?",
    "acme.yaml:17: teams[0].members[0].wieght: unknown key; did you mean `weight`?",
    "acme.yaml:18: teams[0].members[1].crm_user_id: expected text, not a number; write it in "
    'quotes: "101"',
    "acme.yaml:18: teams[0].members[1].weight: must be at least 1, not 0",
    "acme.yaml:23: rules[0].route_to: `acount_owner` is not allowed; did you mean `account_owner`?",
    "acme.yaml:23: rules[0].team: unknown team `na_ea`; did you mean `na_ae`?",
]


def problems(text_: str, env: dict[str, str] | None = None) -> list[str]:
    with pytest.raises(ConfigProblems) as info:
        parse_config(text_, "acme.yaml", ENV if env is None else env)
    lines = info.value.lines
    assert str(info.value) == "\n".join(lines)
    for value in (SECRET, "hunter2", "aHVudGVyMg"):
        assert all(value not in line for line in lines), lines
    return lines


def test_the_good_file_loads_without_warnings() -> None:
    assert parse_config(GOOD, "acme.yaml", ENV).warnings() == []


def test_every_mistake_of_a_file_is_reported_at_once_with_its_line() -> None:
    assert problems(BAD) == BAD_LINES


def test_reference_checks_run_even_when_fields_fail() -> None:
    # the weight fails field validation, so the model's own check of rule teams never runs
    text_ = GOOD.replace("weight: 2", "weight: 0").replace("{team: row_ae}", "{team: emea}")
    assert problems(text_) == [
        "acme.yaml:18: teams[0].members[1].weight: must be at least 1, not 0",
        "acme.yaml:24: rules[1].team: unknown team `emea`; write one of: na_ae, row_ae",
    ]


def test_a_key_given_twice() -> None:
    text_ = GOOD.replace("  object: Lead\n", "  object: Lead\n  object: Contact\n")
    assert problems(text_) == [
        "acme.yaml:10: crm.object: given twice (also on line 9); keep one",
    ]


@pytest.mark.parametrize(
    ("text_", "line"),
    [
        (
            GOOD.replace("  object: Lead", "\tobject: Lead"),
            "acme.yaml:9: crm.auth.client_secret: YAML syntax: found character '\\t' that "
            "cannot start any token (column 1); indent with spaces, not tabs; quote a value "
            "that starts with @ or `",
        ),
        (
            GOOD.replace("  - name: row_ae", "   - name: row_ae"),
            "acme.yaml:19: teams[0].members[1]: YAML syntax: expected <block end>, but found "
            "'<block sequence start>' (column 4); this line is indented differently from the "
            "keys before it: line it up with its mapping's keys (spaces only)",
        ),
        (
            GOOD.replace("name: Grace Hopper}", 'name: "Grace Hopper}'),
            "acme.yaml:21: teams[1].members: YAML syntax: found unexpected end of stream "
            "(column 51); close the quote that this value opens",
        ),
    ],
)
def test_yaml_syntax_errors_name_the_key_path_and_line(text_: str, line: str) -> None:
    assert problems(text_) == [line]


def test_values_are_those_of_safe_load() -> None:
    for path in sorted((ROOT / "config").glob("*.yaml")):
        text_ = path.read_text(encoding="utf-8")
        assert read_yaml(text_).data == yaml.safe_load(text_)
    merged = "base: &b {x: 1, y: 2}\nmore: {<<: *b, y: 3}\nwhen: 2026-12-24\n"
    assert read_yaml(merged).data == yaml.safe_load(merged)


def test_an_alias_inside_itself_and_an_unknown_tag_are_problems() -> None:
    assert problems("org: &a [*a]\n")[0] == (
        "acme.yaml:1: org[0]: this alias refers to the value it is inside of; write the value out"
    )
    assert problems(GOOD.replace("object: Lead", "object: !lead Lead")) == [
        "acme.yaml:9: crm.object: could not determine a constructor for the tag '!lead'; "
        "write a plain value without a tag"
    ]


def test_the_shipped_examples_load_clean(capsys: pytest.CaptureFixture[str]) -> None:
    env = {n: "x" * 32 for n in re.findall(r"\$\{(\w+)\}", _examples())}
    with pytest.MonkeyPatch.context() as mp:
        for name, value in env.items():
            mp.setenv(name, value)
        mp.delenv("DATABASE_URL", raising=False)
        code = main(["--config", str(ROOT / "config"), "check-config"])
    out, err = capsys.readouterr()
    assert (code, err) == (0, "")
    assert out.splitlines() == [
        "org acme: salesforce Lead, 2 teams, 4 members (4 active), 3 rules",
        "org globex: hubspot contacts, 2 teams, 4 members (4 active), 2 rules",
    ]


def _examples() -> str:
    return "".join(p.read_text() for p in sorted((ROOT / "config").glob("*.yaml")))


# --- secrets -----------------------------------------------------------------------------

WRITE = "write a `${ENV_NAME}` reference and set that variable"


@pytest.mark.parametrize(
    ("written", "message"),
    [
        ("!!binary aHVudGVyMg==", f"a YAML tag (!!binary) on a secret; {WRITE}"),
        ("!!str hunter2", f"a YAML tag (!!str) on a secret; {WRITE}"),
        ('!!str "${SF_SECRET}"', f"a YAML tag (!!str) on a secret; {WRITE}"),
        ("! hunter2", f"a YAML tag (!) on a secret; {WRITE}"),
        ("12345", f"a secret must be text, not a number; {WRITE}"),
        ("true", f"a secret must be text, not true/false; {WRITE}"),
        ("hunter2", f"a literal secret; {WRITE}"),
        ('"hunter2${SF_SECRET}"', f"a literal secret; {WRITE}"),
    ],
)
def test_a_secret_written_as_anything_but_a_reference_is_refused(
    written: str, message: str
) -> None:
    text_ = GOOD.replace("client_secret: ${SF_SECRET}", f"client_secret: {written}")
    assert problems(text_) == [f"acme.yaml:8: crm.auth.client_secret: {message}"]


def test_secrets_in_lists_and_other_models_are_found_by_their_type() -> None:
    text_ = GOOD.replace('outbound_secrets: ["${SF_OM}"]', "outbound_secrets: [!!binary aGk=, 7]")
    assert problems(text_) == [
        f"acme.yaml:11: crm.outbound_secrets[0]: a YAML tag (!!binary) on a secret; {WRITE}",
        f"acme.yaml:11: crm.outbound_secrets[1]: a secret must be text, not a number; {WRITE}",
    ]
    hubspot = (
        "org: globex\ncrm:\n  kind: hubspot\n  auth: {access_token: !!binary aGk=}\n"
        "teams: [{name: a, members: [{crm_user_id: '1', name: A}]}]\nrules: [{team: a}]\n"
    )
    assert problems(hubspot) == [
        f"acme.yaml:4: crm.auth.access_token: a YAML tag (!!binary) on a secret; {WRITE}"
    ]


@pytest.mark.parametrize("value", ["", "  ", "\n"])
def test_an_empty_environment_value_is_refused_naming_the_variable(value: str) -> None:
    assert problems(GOOD, {**ENV, "SF_SECRET": value}) == [
        "acme.yaml:8: crm.auth.client_secret: environment variable SF_SECRET is empty; set it "
        "to the value"
    ]


@pytest.mark.parametrize(
    ("written", "env", "message"),
    [
        (
            "!!binary cG9zdGdyZXNxbDovL2FwcDpodW50ZXIyQGRiL3I=",
            ENV,
            f"a YAML tag (!!binary) on a secret; {WRITE}",
        ),
        (
            '"host=db user=app password=hunter2 dbname=routing"',
            ENV,
            "a libpq keyword string (host=... password=...) is not accepted; write "
            "postgresql://USER:${PGPASSWORD}@HOST:5432/DBNAME",
        ),
        (
            '"host=db password=${PGPASS}"',
            ENV,
            "a libpq keyword string (host=... password=...) is not accepted; write "
            "postgresql://USER:${PGPASSWORD}@HOST:5432/DBNAME",
        ),
        (
            '"${DB}"',
            {**ENV, "DB": f"host=db password={SECRET}"},
            "the value of DB: a libpq keyword string (host=... password=...) is not accepted; "
            "write postgresql://USER:PASSWORD@HOST:5432/DBNAME",
        ),
        (
            '"${DB}"',
            {**ENV, "DB": f"mysql://app:{SECRET}@db/r"},
            "the value of DB: unsupported database driver 'mysql'; write "
            "postgresql://USER:PASSWORD@HOST:5432/DBNAME",
        ),
    ],
)
def test_database_urls_are_checked(written: str, env: dict[str, str], message: str) -> None:
    assert problems(f"database_url: {written}\n{GOOD}", env) == [
        f"acme.yaml:1: database_url: {message}"
    ]


# --- the command line ----------------------------------------------------------------------


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name, value in ENV.items():
        monkeypatch.setenv(name, value)
    # check-config never connects: a URL that leads nowhere is fine
    monkeypatch.setenv("DATABASE_URL", "postgresql://nobody@127.0.0.1:9/none")
    return tmp_path


def test_check_config_prints_one_line_per_problem_and_exits_2(
    cli: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = cli / "acme.yaml"
    bad.write_text(BAD, encoding="utf-8")
    assert main(["--config", str(bad), "check-config"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == [line.replace("acme.yaml", str(bad), 1) for line in BAD_LINES]


def test_check_config_reports_every_file_of_a_folder(
    cli: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (cli / "a.yaml").write_text(GOOD.replace("  object: Lead", "  objct: Lead"), encoding="utf-8")
    (cli / "b.yaml").write_text(
        GOOD.replace("org: acme", "org: beta").replace("weight: 2", "weight: 0"), encoding="utf-8"
    )
    assert main(["--config", str(cli), "check-config"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"{cli / 'a.yaml'}:9: crm.objct: unknown key; did you mean `object`?",
        f"{cli / 'b.yaml'}:18: teams[0].members[1].weight: must be at least 1, not 0",
    ]


def test_check_config_refuses_an_empty_secret(
    cli: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = cli / "acme.yaml"
    cfg.write_text(GOOD, encoding="utf-8")
    monkeypatch.setenv("SF_SECRET", "")
    assert main(["--config", str(cfg), "check-config"]) == 2
    out, err = capsys.readouterr()
    assert (out, err) == (
        "",
        f"{cfg}:8: crm.auth.client_secret: environment variable SF_SECRET is empty; set it "
        "to the value\n",
    )


def test_check_config_refuses_a_keyword_database_url_in_one_line(
    cli: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = cli / "acme.yaml"
    cfg.write_text(GOOD, encoding="utf-8")
    monkeypatch.setenv("DATABASE_URL", f"host=db password={SECRET}")
    assert main(["--config", str(cfg), "check-config"]) == 2
    out, err = capsys.readouterr()
    assert (out, err) == (
        "",
        "connector: DATABASE_URL: a libpq keyword string (host=... password=...) is not "
        "accepted; write postgresql://USER:PASSWORD@HOST:5432/DBNAME\n",
    )


def test_warnings_name_the_file_line_and_key(cli: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = cli / "acme.yaml"
    cfg.write_text(
        GOOD.replace("  organization_id: 00D5g000004ABCDEA4\n", "").replace(
            '    members:\n      - {crm_user_id: "0055g00000AbCdEAAV"',
            "    catch_up: {max_in_a_row: 2}\n    members:\n"
            '      - {crm_user_id: "0055g00000AbCdEAAV"',
        ),
        encoding="utf-8",
    )
    assert main(["--config", str(cfg), "check-config"]) == 0
    out, err = capsys.readouterr()
    assert out == "org acme: salesforce Lead, 2 teams, 3 members (3 active), 2 rules\n"
    assert err.splitlines() == [
        f"{cfg}:2: warning: crm.organization_id: not set: every Outbound Message is refused "
        "(403 organization_id_not_configured); add the Salesforce.com Organization ID from "
        "Setup > Company Information (00D...)",
        f"{cfg}:15: warning: teams[0].catch_up.max_in_a_row: 2 is too low for Alan Turing of "
        "team na_ae (weight 2 of 3): back from time away, the rep can never catch up; set "
        "max_in_a_row to at least 3",
    ]


def _counts(engine: Engine) -> dict[str, int]:
    with engine.connect() as conn:
        return {
            t: conn.execute(text(f"SELECT count(*) FROM {t}")).scalar_one()
            for t in ("teams", "members", "leads", "assignments")
        }


@pytest.mark.parametrize(
    ("edit", "env", "line"),
    [
        (
            ("weight: 2", "weight: 0"),
            {},
            "18: teams[0].members[1].weight: must be at least 1, not 0",
        ),
        (
            ("client_secret: ${SF_SECRET}", "client_secret: !!binary aHVudGVyMg=="),
            {},
            f"8: crm.auth.client_secret: a YAML tag (!!binary) on a secret; {WRITE}",
        ),
        (
            ("", ""),
            {"SF_SECRET": ""},
            "8: crm.auth.client_secret: environment variable SF_SECRET is empty; set it to the "
            "value",
        ),
    ],
)
def test_migrate_with_a_refused_config_stores_nothing(
    cli: Path,
    db_url: str,
    engine: Engine,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    edit: tuple[str, str],
    env: dict[str, str],
    line: str,
) -> None:
    cfg = cli / "acme.yaml"
    cfg.write_text(GOOD.replace(*edit) if edit[0] else GOOD, encoding="utf-8")
    monkeypatch.setenv("DATABASE_URL", db_url)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    before = _counts(engine)
    assert main(["--config", str(cfg), "migrate"]) == 2
    out, err = capsys.readouterr()
    assert (out, err) == ("", f"{cfg}:{line}\n")
    assert _counts(engine) == before == {"teams": 0, "members": 0, "leads": 0, "assignments": 0}


def test_other_config_errors_keep_their_one_line() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config("org: [", "acme.yaml", ENV)
    assert isinstance(info.value, ConfigProblems) and len(info.value.lines) == 1


def test_a_key_that_is_not_text_does_not_hide_the_other_problems() -> None:
    assert problems("org: acme\n[1, 2]: y\n") == [
        "acme.yaml:1: crm: missing; add `crm:`",
        "acme.yaml:1: teams: missing; add `teams:`",
        "acme.yaml:1: rules: missing; add `rules:`",
        "acme.yaml:2: a key that is not plain text; write `name: value`",
    ]
