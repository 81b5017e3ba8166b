"""Rules in the YAML: bad conditions refused one line each (file:line, rule, field, operator),
territory tables (inline and CSV) checked for overlaps and gaps, and nothing stored from a
refused file."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from connector.core.config import ConfigError, OrgConfig
from connector.core.config_loading import load_configs, parse_config
from connector.routing.rules import match, org_rules
from connector.shell.cli import main

ENV = {"TOKEN": "unused"}
HEAD = """org: acme
crm:
  kind: salesforce
  instance_url: https://acme.my.salesforce.com
  auth: {method: session, access_token: "${TOKEN}"}
  object: Lead
teams:
  - name: na
    members: [{crm_user_id: "005A", name: Ada}]
  - name: west
    members: [{crm_user_id: "005B", name: Bea}]
  - name: east
    members: [{crm_user_id: "005C", name: Cy}]
"""


def refusal(yaml_text: str, source: str = "acme.yaml") -> list[str]:
    with pytest.raises(ConfigError) as err:
        parse_config(yaml_text, source, ENV)
    return str(err.value).splitlines()


def test_every_bad_condition_is_one_line_with_file_line_rule_field_and_operator() -> None:
    rules = """rules:
  - name: big
    team: na
    when:
      Employees: {gte: lots}
      Title: {containz: VP}
  - team: west
    when:
      any:
        - {Created: {after: 2026-01-01}}
        - {Created: {between: [2026-03-01, 2026-01-01]}}
        - {Tags: {includes_any: []}}
      not: {Phone: {is_empty: false}}
  - name: typed
    team: east
    types: {Score: number}
    when: {Score: {contains: "1"}, Email: {ends_with: ""}}
"""
    assert refusal(HEAD + rules) == [
        "acme.yaml:18: rules[0].when.Employees.gte: rule 'big', field Employees, "
        "operator gte, 'lots': expected a number or a date",
        "acme.yaml:19: rules[0].when.Title.containz: rule 'big', field Title, "
        "operator containz, unknown operator; known: equals, in, not_equals, not_in, contains, "
        "starts_with, ends_with, is_empty, is_not_empty, gt, gte, lt, lte, between, "
        "includes_any, includes_all",
        "acme.yaml:23: rules[1].when.any[0].Created.after: field Created, operator after, "
        "unknown operator; known: equals, in, not_equals, not_in, contains, starts_with, "
        "ends_with, is_empty, is_not_empty, gt, gte, lt, lte, between, includes_any, "
        "includes_all",
        "acme.yaml:24: rules[1].when.any[1].Created.between: field Created, operator "
        "between, 2026-03-01, 2026-01-01: low is above high",
        "acme.yaml:25: rules[1].when.any[2].Tags.includes_any: field Tags, operator "
        "includes_any, expected a value or a non-empty list of values",
        "acme.yaml:26: rules[1].when.not.Phone.is_empty: field Phone, operator is_empty, "
        "write `is_empty: true` (for the opposite, `is_not_empty`)",
        "acme.yaml:30: rules[2].when.Score.contains: rule 'typed', field Score, operator "
        "contains, does not apply to a number field",
        "acme.yaml:30: rules[2].when.Email.ends_with: rule 'typed', field Email, operator "
        "ends_with, an empty value matches everything; remove it",
    ]


@pytest.mark.parametrize(
    ("when", "message"),
    [
        ("{Size: {gt: [1, 2]}}", "field Size, operator gt, expected one value"),
        ("{Size: {between: 5}}", "field Size, operator between, expected [low, high]"),
        ("{Size: {gte: 1 day}}", "field Size, operator gte, '1 day': expected a number or a date"),
        ("{Size: {}}", "field Size, names no operator"),
        ("{Size: {case_sensitive: true}}", "field Size, names no operator"),
        ("{Size: {equals: a, case_sensitive: 1}}", "field Size, expected true or false"),
        ("{Size: {gte: 5, case_sensitive: true}}",
         "field Size, operator gte, case_sensitive applies to text, not to a number field"),
        ("{any: []}", "`any` needs a non-empty list of conditions"),
        ("{not: [a]}", "expected a mapping of fields and groups (all, any, not)"),
        ("{Bad-Name: x}", "field Bad-Name, not a CRM field name (letters, digits and _ only)"),
    ],
)  # fmt: skip
def test_bad_condition_messages(when: str, message: str) -> None:
    lines = refusal(HEAD + f"rules:\n  - {{team: na, when: {when}}}\n")
    assert len(lines) == 1 and lines[0].startswith("acme.yaml:15: rules[0].when")
    assert lines[0].endswith(": " + message)


def test_rule_needs_a_team_or_a_territory_and_types_must_be_known() -> None:
    assert refusal(HEAD + "rules:\n  - {when: {A: b}}\n") == [
        "acme.yaml:14: rules[0]: name a `team`, or a `territory` whose rows name the teams "
        "(not both)"
    ]
    assert refusal(HEAD + "rules:\n  - {team: na, types: {A: money}, when: {A: 1}}\n") == [
        "acme.yaml:15: rules[0].types.A: `money` is not allowed; write one of: date, multi, "
        "number, text"
    ]
    assert refusal(HEAD + "rules:\n  - {territory: nowhere}\n") == [
        "acme.yaml:15: rules[0].territory: unknown territory `nowhere`; there is none to refer to"
    ]


TERRITORY = """territories:
  na:
    fields: {country: Country, state: State, postal_code: PostalCode}
    rows:
      - {country: US, state: CA, team: west}
      - {country: US, postal_code: "100-149", team: east}
      - {country: US, postal_code: "900-939", team: west}
      - {country: US, postal_code: "941", team: west}
      - {country: us, team: na}
      - {country: CA, postal_code: "K1A", team: east}
rules:
  - {name: by territory, territory: na}
  - {name: rest, team: na}
"""


def test_territory_rows_route_the_most_specific_row() -> None:
    cfg = parse_config(HEAD + TERRITORY, "acme.yaml", ENV)
    rules = org_rules(cfg)

    def team(**fields: object) -> tuple[str, str] | None:
        m = match(rules, fields)
        return (m.team, m.rule_name) if m else None

    assert team(Country="US", State="NY", PostalCode="10001") == ("east", "by territory")
    assert team(Country="US", State="CA", PostalCode="10001") == ("east", "by territory")
    assert team(Country="us", State="ca", PostalCode="95014") == ("west", "by territory")
    assert team(Country="US", State="NY", PostalCode="94103-1234") == ("west", "by territory")
    assert team(Country="US", State="NY", PostalCode="950") == ("na", "by territory")
    assert team(Country="US", State="NY", PostalCode="94") == ("na", "by territory")
    assert team(Country="US") == ("na", "by territory")
    assert team(Country="CA", PostalCode="k1a 0b1") == ("east", "by territory")
    assert team(Country="CA", PostalCode="M5V") == ("na", "rest")  # no row: the next rule
    assert team(State="CA") == ("na", "rest")
    assert cfg.read_fields[:3] == ["Country", "State", "PostalCode"]
    assert cfg.warnings() == [
        "intake_owner_ids: empty: every Salesforce record has an owner, so nothing will be "
        "routed; list the intake queue or integration user",
        "crm.outbound_secrets: empty: Outbound Messages are refused; add `outbound_secrets: "
        '["${ENV_NAME}"]` to receive them',
        "territories.na: 2 gap(s) between postal ranges, first US 150-899 (between rows[1] "
        "and rows[2]) and 1 more: leads there fall to the state's or country's row, else to "
        "the next rule",
    ]


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ('[{country: US, postal_code: "900-961", team: west}, '
         '{country: US, postal_code: "94", team: east}]',
         "rows[0] and rows[1] overlap: postal codes 900-961 and 94 of US"),
        ("[{country: US, state: CA, team: west}, {country: us, state: ' ca ', team: east}]",
         "rows[0] and rows[1] overlap: both cover US/CA"),
        ('[{country: US, postal_code: "90-9", team: west}]',
         "rows[0]: postal range '90-9': both ends need the same number of characters"),
        ('[{country: US, postal_code: "99-90", team: west}]',
         "rows[0]: postal range '99-90': low is above high"),
        ("[{country: US, team: emea}]",
         "territories.na.rows[0].team: unknown team `emea`; write one of: east, na, west"),
        ("[{country: US, zip: '1', team: na}]",
         "rows[0]: unknown column(s) zip (known: country, state, postal_code, team)"),
        ("[{state: CA, team: na}]", "rows[0]: needs a country and a team"),
        ("[]", "has no rows"),
    ],
)  # fmt: skip
def test_territory_refusals(rows: str, message: str) -> None:
    text_ = (
        HEAD
        + TERRITORY.split("    rows:")[0]
        + f"    rows: {rows}\nrules:\n  - {{territory: na}}\n"
    )
    lines = refusal(text_)
    if message.startswith("rows[0]"):  # a row at fault: its line in the file
        assert lines == [f"acme.yaml:17: territories.na.rows[0]: {message}"]
    elif message.startswith("territories."):
        assert lines == [f"acme.yaml:17: {message}"]
    else:
        assert lines == [f"acme.yaml:15: territories.na: {message}"]


def test_territory_csv_next_to_the_config(tmp_path: Path) -> None:
    (tmp_path / "na.csv").write_text(
        "country,state,postal_code,team\nUS,CA,,west\nUS,,100-149,east\nUS,,,na\n",
        encoding="utf-8",
    )
    yaml_text = HEAD + (
        "territories:\n  na:\n    fields: {country: Country, state: State, "
        "postal_code: PostalCode}\n    file: na.csv\nrules:\n  - {territory: na}\n"
    )
    (tmp_path / "acme.yaml").write_text(yaml_text, encoding="utf-8")
    cfg = load_configs(tmp_path / "acme.yaml", ENV)["acme"]
    rules = org_rules(cfg)
    m = match(rules, {"Country": "US", "State": "CA", "PostalCode": "12345"})
    assert m is not None and m.team == "east"
    assert cfg.territories["na"].table.rows[0].where == "na.csv:2"

    (tmp_path / "na.csv").write_text(
        "country,state,postal_code,team\nUS,,100-149,east\nUS,,14,west\n", encoding="utf-8"
    )
    with pytest.raises(ConfigError) as err:
        load_configs(tmp_path / "acme.yaml", ENV)
    assert str(err.value) == (
        f"{tmp_path / 'acme.yaml'}:15: territories.na: na.csv:2 and na.csv:3 overlap: postal "
        "codes 100-149 and 14 of US"
    )
    for bad, message in [
        ("../na.csv", "`../na.csv` must be a name in the config's folder"),
        ("/etc/passwd", "`/etc/passwd` must be a name in the config's folder"),
        ("gone.csv", "cannot read gone.csv: [Errno 2] No such file or directory: "),
    ]:
        (tmp_path / "acme.yaml").write_text(yaml_text.replace("na.csv", bad), encoding="utf-8")
        with pytest.raises(ConfigError) as err:
            load_configs(tmp_path / "acme.yaml", ENV)
        assert str(err.value).startswith(
            f"{tmp_path / 'acme.yaml'}:17: territories.na.file: {message}"
        )
    with pytest.raises(ConfigError) as err:
        parse_config(yaml_text, "acme.yaml", ENV)  # no folder to read it from
    assert str(err.value) == (
        "acme.yaml:17: territories.na.file: a territory file is read next to a config file"
    )
    (tmp_path / "acme.yaml").write_text(yaml_text, encoding="utf-8")
    (tmp_path / "na.csv").write_text("country,team\nUS,na,extra\n", encoding="utf-8")
    with pytest.raises(ConfigError) as err:
        load_configs(tmp_path / "acme.yaml", ENV)
    assert str(err.value) == (
        f"{tmp_path / 'acme.yaml'}:17: territories.na.file: na.csv:2: one row a line, as many "
        "cells as the header"
    )


def test_check_config_and_migrate_refuse_a_bad_rule_and_store_nothing(
    tmp_path: Path,
    db_url: str,
    engine: Engine,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    bad = tmp_path / "acme.yaml"
    bad.write_text(HEAD + "rules:\n  - {team: na, when: {Employees: {gte: lots}}}\n", "utf-8")
    monkeypatch.setenv("TOKEN", "unused")
    monkeypatch.setenv("DATABASE_URL", db_url)
    line = (
        f"{bad}:15: rules[0].when.Employees.gte: "
        "field Employees, operator gte, 'lots': expected a number or a date\n"
    )
    for command in ("check-config", "migrate"):
        code = main(["--config", str(bad), command])
        out, err = capsys.readouterr()
        assert (code, out, err) == (2, "", line)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM teams")).scalar_one() == 0
    good = HEAD + TERRITORY
    bad.write_text(good, "utf-8")
    assert main(["--config", str(bad), "check-config"]) == 0
    out, err = capsys.readouterr()
    assert out == (
        "org acme: salesforce Lead, 3 teams, 3 members (3 active), 2 rules, "
        "1 territory tables (6 rows)\n"
    )
    assert "territories.na: 2 gap(s) between postal ranges" in err


def test_old_form_configs_parse_to_the_same_fields(sample_cfg: OrgConfig) -> None:
    assert sample_cfg.rules[0].when == {"Country": ["US", "CA"]}
    assert sample_cfg.rules[0].fields == ["Country"]


def test_unparsed_values_are_counted_in_metrics(engine: Engine) -> None:
    from connector.core.metrics import Metrics
    from connector.routing.assign import Lead, Router
    from connector.routing.teams import apply_teams

    cfg = parse_config(
        HEAD + "rules:\n  - {team: west, when: {Employees: {gte: 1000}}}\n  - {team: na}\n",
        "acme.yaml",
        ENV,
    )
    apply_teams(engine, cfg)
    metrics = Metrics()
    router = Router(engine, cfg, unparsed=metrics.unparsed("acme"))
    out = router.assign_many(
        [Lead("00Q000000000001", {"Employees": "1,500"}), Lead("00Q000000000002", {})], "api"
    )
    assert [o.team for o in out] == ["na", "na"]  # did not parse: no match, the next rule
    out = router.assign_many([Lead("00Q000000000003", {"Employees": "many"})], "api")
    assert out[0].team == "na"
    body = metrics.render().decode()
    assert (
        'connector_rule_values_unparsed_total{field="Employees",org="acme",type="number"} 2.0'
        in body.splitlines()
    )


def test_the_trace_names_the_territory_row_that_decided() -> None:
    from connector.routing.decisions import trace_rules
    from connector.shell.explain import rule_line

    cfg = parse_config(HEAD + TERRITORY, "acme.yaml", ENV)
    tried, values = trace_rules(org_rules(cfg), {"Country": "US", "PostalCode": "12345"})
    assert [rule_line(r, values) for r in tried] == [
        '  rule 0 "by territory" -> team east: matched (territory na (row rows[1]))'
    ]
    tried, values = trace_rules(org_rules(cfg), {"Country": "MX", "PostalCode": "12345"})
    assert [rule_line(r, values) for r in tried] == [
        '  rule 0 "by territory" -> team of its territory: no match '
        "(territory na: no row covers the lead)",
        '  rule 1 "rest" -> team na: matched (default rule)',
    ]
