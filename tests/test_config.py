"""connector.core.config and config_loading: parsing, env references, refusals and the messages
that explain them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from connector.core.config import ConfigError, OrgConfig
from connector.core.config_loading import config_path_from, load_configs, parse_config, pick_org
from tests.helpers.sample_org import SAMPLE_ENV, SAMPLE_YAML

ROOT = Path(__file__).resolve().parent.parent
CONFIG_DOC = ROOT / "docs" / "configuration.md"
SECRET = SAMPLE_ENV["ACME_SF_SECRET"]

HUBSPOT_YAML = """
org: globex
crm:
  kind: hubspot
  auth: {access_token: "${GLOBEX_TOKEN}"}
  webhook_secrets: ["${GLOBEX_HOOK_1}", "${GLOBEX_HOOK_2}"]
  portal_id: 62515
teams:
  - name: smb
    members: [{crm_user_id: "101", name: Kim}]
rules: [{team: smb}]
"""
HUBSPOT_ENV = {"GLOBEX_TOKEN": "pat-tok-xyz", "GLOBEX_HOOK_1": "hook-one", "GLOBEX_HOOK_2": "h2"}


def error(text: str, env: dict[str, str] | None = None, source: str = "acme.yaml") -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(text, source, SAMPLE_ENV if env is None else env)
    message = str(info.value)
    for value in (*SAMPLE_ENV.values(), *HUBSPOT_ENV.values(), "hunter2"):
        assert value not in message, f"secret {value!r} leaked into {message!r}"
    return message


def test_configuration_doc_sample_parses() -> None:
    blocks = re.findall(r"```yaml\n(.*?)```", CONFIG_DOC.read_text(encoding="utf-8"), re.S)
    sample = next(b for b in blocks if b.startswith("org:"))
    cfg = parse_config(sample, "docs/configuration.md", SAMPLE_ENV)
    assert cfg.org == "acme" and cfg.crm.kind == "salesforce" and cfg.crm_object == "Lead"
    assert [(m.crm_user_id, m.weight, m.active) for m in cfg.team("na_ae").members] == [
        ("0055g00000AbCdEAAV", 1, True),
        ("0055g00000AbCdFAAV", 2, True),
    ]
    assert cfg.rules[0].when == {"Country": ["US", "CA"]}


def test_example_configs_parse() -> None:
    env = {name: "x" * 32 for name in re.findall(r"\$\{(\w+)\}", _examples_text())}
    configs = load_configs(ROOT / "config", env)
    assert configs and all(isinstance(c, OrgConfig) for c in configs.values())


def _examples_text() -> str:
    return "".join(p.read_text() for p in sorted((ROOT / "config").glob("*.y*ml")))


def test_env_refs_are_resolved() -> None:
    cfg = parse_config(SAMPLE_YAML, "acme.yaml", SAMPLE_ENV)
    assert cfg.crm.kind == "salesforce"
    auth = cfg.crm.auth
    assert auth.client_id is not None and auth.client_id.get_secret_value() == "id-123"
    assert auth.client_secret is not None and auth.client_secret.get_secret_value() == SECRET
    assert SECRET not in repr(cfg) and SECRET not in str(cfg.model_dump())
    hs = parse_config(HUBSPOT_YAML, "globex.yaml", HUBSPOT_ENV)
    assert hs.crm.kind == "hubspot"
    assert [s.get_secret_value() for s in hs.crm.webhook_secrets] == ["hook-one", "h2"]


def test_env_ref_inside_a_longer_value() -> None:
    text = SAMPLE_YAML.replace(
        "https://acme.my.salesforce.com", "https://${ACME_HOST}.my.salesforce.com"
    )
    cfg = parse_config(text, "acme.yaml", {**SAMPLE_ENV, "ACME_HOST": "acme2"})
    assert (
        cfg.crm.kind == "salesforce" and cfg.crm.instance_url == "https://acme2.my.salesforce.com"
    )


def test_missing_env_var_names_key_path_and_variable() -> None:
    env = {"ACME_SF_ID": "id-123", "ACME_OM_SECRET": SAMPLE_ENV["ACME_OM_SECRET"]}
    assert error(SAMPLE_YAML, env) == (
        "acme.yaml:6: crm.auth.client_secret: environment variable ACME_SF_SECRET is not set; "
        "set it where the connector runs"
    )
    assert error(SAMPLE_YAML, {}).splitlines() == [
        "acme.yaml:6: crm.auth.client_id: environment variable ACME_SF_ID is not set; "
        "set it where the connector runs",
        "acme.yaml:6: crm.auth.client_secret: environment variable ACME_SF_SECRET is not set; "
        "set it where the connector runs",
        "acme.yaml:8: crm.outbound_secrets[0]: environment variable ACME_OM_SECRET is not set; "
        "set it where the connector runs",
    ]


def test_literal_secret_is_refused() -> None:
    text = SAMPLE_YAML.replace('"${ACME_SF_SECRET}"', "hunter2")
    assert error(text) == (
        "acme.yaml:6: crm.auth.client_secret: a literal secret; write a `${ENV_NAME}` "
        "reference and set that variable"
    )
    # an env reference wrapped in literal text is still a literal secret
    text = SAMPLE_YAML.replace('"${ACME_SF_SECRET}"', '"hunter2${ACME_SF_SECRET}"')
    assert error(text).startswith("acme.yaml:6: crm.auth.client_secret: a literal secret;")


def test_literal_webhook_secret_in_a_list_is_refused() -> None:
    text = HUBSPOT_YAML.replace('"${GLOBEX_HOOK_2}"', "hunter2")
    assert error(text, HUBSPOT_ENV, "globex.yaml") == (
        "globex.yaml:6: crm.webhook_secrets[1]: a literal secret; write a `${ENV_NAME}` "
        "reference and set that variable"
    )
    text = HUBSPOT_YAML.replace('access_token: "${GLOBEX_TOKEN}"', "access_token: hunter2")
    assert error(text, HUBSPOT_ENV, "globex.yaml").startswith(
        "globex.yaml:5: crm.auth.access_token: a literal secret;"
    )


DB_ENV = {**SAMPLE_ENV, "DATABASE_URL": "postgresql://app:pw1@db/r", "PGPASS": "pw2"}


@pytest.mark.parametrize(
    ("written", "resolved"),
    [
        ('"${DATABASE_URL}"', "postgresql://app:pw1@db/r"),
        (
            '"postgresql://app:${PGPASS}@db:5432/routing"',
            "postgresql://app:pw2@db:5432/routing",
        ),
        ("postgresql://app@db.internal:5432/routing", "postgresql://app@db.internal:5432/routing"),
        ("postgresql://db.internal/routing", "postgresql://db.internal/routing"),
        ('"postgresql://db/routing?password=${PGPASS}"', "postgresql://db/routing?password=pw2"),
    ],
)
def test_database_url_accepted_forms(written: str, resolved: str) -> None:
    cfg = parse_config(f"database_url: {written}\n{SAMPLE_YAML}", "acme.yaml", DB_ENV)
    assert cfg.database_url is not None
    assert cfg.database_url.get_secret_value() == resolved
    assert "pw1" not in repr(cfg) and "pw2" not in repr(cfg)


@pytest.mark.parametrize(
    "written",
    [
        "postgresql://app:hunter2@db:5432/routing",
        "postgresql+psycopg://app:hunter2@db/routing?sslmode=require",
        '"postgresql://app:hunter2${PGPASS}@db/routing"',  # a reference plus literal text
        "postgresql://app@db/routing?sslmode=require&password=hunter2",
    ],
)
def test_database_url_with_a_literal_password_is_refused(written: str) -> None:
    message = error(f"database_url: {written}\n{SAMPLE_YAML}", DB_ENV)
    assert message == (
        "acme.yaml:1: database_url: a literal password; write it as a `${ENV_NAME}` reference "
        "(postgresql://USER:${PGPASSWORD}@HOST/DBNAME) or the whole URL as one"
    )
    assert "hunter2" not in message


def test_unknown_key_is_refused_naming_the_key() -> None:
    text = SAMPLE_YAML.replace("  object: Lead", "  objct: Lead")
    assert error(text) == "acme.yaml:7: crm.objct: unknown key; did you mean `object`?"
    text = SAMPLE_YAML.replace("name: Ada Lovelace, weight: 1", "name: Ada Lovelace, wieght: 1")
    assert error(text) == (
        "acme.yaml:13: teams[0].members[0].wieght: unknown key; did you mean `weight`?"
    )
    assert error(SAMPLE_YAML.replace("\nrules:", "\nrulez:")).splitlines() == [
        "acme.yaml:2: rules: missing; add `rules:`",
        "acme.yaml:20: rulez: unknown key; did you mean `rules`?",
    ]
    # nothing close: the keys that are allowed there
    assert error(SAMPLE_YAML.replace("  object: Lead", "  zzz: Lead")) == (
        "acme.yaml:7: crm.zzz: unknown key; write one of: api_version, auth, instance_url, "
        "kind, object, organization_id, outbound_allow_cidrs, outbound_secrets, parent_field"
    )


def test_bad_kind() -> None:
    assert error(SAMPLE_YAML.replace("kind: salesforce", "kind: dynamics")) == (
        "acme.yaml:4: crm.kind: `dynamics` is not a kind; write one of: hubspot, salesforce"
    )
    assert error(SAMPLE_YAML.replace("kind: salesforce", "kind: salesfroce")) == (
        "acme.yaml:4: crm.kind: `salesfroce` is not a kind; did you mean `salesforce`?"
    )
    assert error(SAMPLE_YAML.replace("  kind: salesforce\n", "")) == (
        "acme.yaml:3: crm.kind: missing; add `kind:` (hubspot, salesforce)"
    )


def test_rule_to_unknown_team() -> None:
    assert error(SAMPLE_YAML.replace("{team: row_ae}", "{team: emea}")) == (
        "acme.yaml:22: rules[1].team: unknown team `emea`; write one of: na_ae, row_ae"
    )
    assert error(SAMPLE_YAML.replace("{team: row_ae}", "{team: row-ae}")) == (
        "acme.yaml:22: rules[1].team: unknown team `row-ae`; did you mean `row_ae`?"
    )


def test_duplicate_team() -> None:
    text = SAMPLE_YAML.replace("name: row_ae", "name: na_ae").replace(
        "{team: row_ae}", "{team: na_ae}"
    )
    assert error(text) == (
        "acme.yaml:15: teams[1].name: team `na_ae` is already defined (teams[0]); give each "
        "team its own name"
    )


def test_duplicate_member() -> None:
    text = SAMPLE_YAML.replace("AbCdIAAV", "AbCdHAAV")
    assert error(text) == (
        "acme.yaml:19: teams[1].members[2].crm_user_id: `0055g00000AbCdHAAV` is listed twice "
        "(also members[1]); list each rep once"
    )


def test_bad_weight_names_the_member() -> None:
    assert error(SAMPLE_YAML.replace("weight: 2,", "weight: 0,")) == (
        "acme.yaml:14: teams[0].members[1].weight: must be at least 1, not 0"
    )


def test_empty_when_is_refused() -> None:
    msg = error(SAMPLE_YAML.replace("when: {Country: [US, CA]}", "when: {}"))
    assert "rules[0].when: `when` must name at least one field; omit it for a default rule" in msg
    msg = error(SAMPLE_YAML.replace("when: {Country: [US, CA]}", "when: {Country: []}"))
    line = SAMPLE_YAML.splitlines().index(
        next(x for x in SAMPLE_YAML.splitlines() if "when: {Country: [US, CA]}" in x)
    )
    assert msg.splitlines() == [
        f"acme.yaml:{line + 1}: rules[0].when.Country: field Country, lists no values"
    ]


def test_yaml_syntax_error_gives_line_number() -> None:
    text = SAMPLE_YAML.replace("  - name: row_ae", "  - name: [row_ae")
    line = SAMPLE_YAML.splitlines().index("  - name: row_ae") + 1
    assert error(text) == (
        f"acme.yaml:{line + 1}: teams[1].name[0]: YAML syntax: expected ',' or ']', but got "
        "':' (column 12); close the [list] on the line it starts, or quote the value"
    )
    assert error("org: x\n  bad: value\n") == (
        "acme.yaml:2: org: YAML syntax: mapping values are not allowed here (column 6); a "
        "`key: value` where the YAML expected a plain value: indent this line like the keys "
        "of its mapping, or quote a value that holds ': '"
    )


def test_top_level_must_be_a_mapping() -> None:
    expected = "expected `key: value` lines at the top level (org:, crm:, ...)"
    assert error("- 1\n") == f"acme.yaml:1: {expected}"
    assert error("") == f"acme.yaml:1: {expected}"


def test_messages_never_contain_secret_values() -> None:
    # a validation error elsewhere in a file whose secrets resolved fine
    text = SAMPLE_YAML.replace("kind: salesforce", "kind: salesforce\n  bogus: 1")
    assert "crm.bogus" in error(text)
    # a secret resolved into a field with a format check
    text = SAMPLE_YAML.replace("https://acme.my.salesforce.com", '"${ACME_SF_SECRET}"')
    assert error(text) == (
        "acme.yaml:5: crm.instance_url: not of the form expected; write a base URL with no "
        "path, such as https://acme.my.salesforce.com"
    )
    # an auth method missing its fields while other secrets are set
    text = SAMPLE_YAML.replace("method: client_credentials", "method: password")
    assert error(text).splitlines() == [
        "acme.yaml:6: crm.auth.username: auth method password needs it; add `username: ...`",
        "acme.yaml:6: crm.auth.password: auth method password needs it; add "
        "`password: ${ENV_NAME}`",
    ]


def _write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(text, encoding="utf-8")
    return path


def test_folder_with_two_orgs(tmp_path: Path) -> None:
    _write(tmp_path, "acme.yaml", SAMPLE_YAML)
    _write(tmp_path, "globex.yml", HUBSPOT_YAML)
    _write(tmp_path, "notes.txt", "not: a config")
    configs = load_configs(tmp_path, {**SAMPLE_ENV, **HUBSPOT_ENV})
    assert sorted(configs) == ["acme", "globex"]
    assert configs["globex"].crm.kind == "hubspot"


def test_single_file(tmp_path: Path) -> None:
    path = _write(tmp_path, "acme.yaml", SAMPLE_YAML)
    assert list(load_configs(str(path), SAMPLE_ENV)) == ["acme"]


def test_error_in_a_folder_names_the_file(tmp_path: Path) -> None:
    _write(tmp_path, "acme.yaml", SAMPLE_YAML)
    bad = _write(tmp_path, "globex.yaml", HUBSPOT_YAML.replace("kind: hubspot", "kind: hubspt"))
    with pytest.raises(ConfigError) as info:
        load_configs(tmp_path, {**SAMPLE_ENV, **HUBSPOT_ENV})
    assert str(info.value) == f"{bad}:4: crm.kind: `hubspt` is not a kind; did you mean `hubspot`?"


def test_duplicate_org_across_files(tmp_path: Path) -> None:
    first = _write(tmp_path, "a.yaml", SAMPLE_YAML)
    second = _write(tmp_path, "b.yaml", SAMPLE_YAML)
    with pytest.raises(ConfigError) as info:
        load_configs(tmp_path, SAMPLE_ENV)
    assert str(info.value) == (
        f"{second}:2: org: `acme` is already defined by {first}; give each file its own org"
    )


def test_empty_folder(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_configs(tmp_path, SAMPLE_ENV)
    assert str(info.value) == f"{tmp_path}: folder holds no .yaml or .yml file"


def test_missing_path(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_configs(tmp_path / "nope.yaml", SAMPLE_ENV)
    assert str(info.value) == f"{tmp_path / 'nope.yaml'}: no such file or folder"


def test_connector_config_default(monkeypatch: pytest.MonkeyPatch) -> None:
    assert config_path_from("given.yaml", {"CONNECTOR_CONFIG": "env.yaml"}) == "given.yaml"
    assert config_path_from(None, {"CONNECTOR_CONFIG": "env.yaml"}) == "env.yaml"
    monkeypatch.setenv("CONNECTOR_CONFIG", "/etc/connector")
    assert config_path_from(None) == "/etc/connector"
    monkeypatch.delenv("CONNECTOR_CONFIG")
    with pytest.raises(ConfigError) as info:
        config_path_from(None)
    assert str(info.value) == (
        "no configuration: pass --config FILE_OR_FOLDER or set CONNECTOR_CONFIG"
    )


def test_pick_org() -> None:
    acme = parse_config(SAMPLE_YAML, "acme.yaml", SAMPLE_ENV)
    globex = parse_config(HUBSPOT_YAML, "globex.yaml", HUBSPOT_ENV)
    assert pick_org({"acme": acme}, None) is acme
    both = {"globex": globex, "acme": acme}
    assert pick_org(both, "globex") is globex
    with pytest.raises(ConfigError) as info:
        pick_org(both, None)
    assert str(info.value) == "several orgs configured (acme, globex): pass --org"
    with pytest.raises(ConfigError) as info:
        pick_org(both, "initech")
    assert str(info.value) == "org 'initech' is not configured (known: acme, globex)"


def test_contact_parent_key() -> None:
    cfg = parse_config(SAMPLE_YAML.replace("object: Lead", "object: Contact"), "a", SAMPLE_ENV)
    assert cfg.crm.parent_key == "AccountId"
    assert parse_config(SAMPLE_YAML, "a", SAMPLE_ENV).crm.parent_key is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            SAMPLE_YAML.replace(
                "  object: Lead\n", "  object: Lead\n  organization_id: 00D5g000004ABC\n", 1
            ),
            "8: crm.organization_id: not a Salesforce organization id (15 or 18 characters, "
            "00D...)",
        ),
        (
            SAMPLE_YAML.replace(
                "  object: Lead\n", "  object: Lead\n  outbound_allow_cidrs: [10.0.0.0/33]\n", 1
            ),
            "8: crm.outbound_allow_cidrs: '10.0.0.0/33' is not an IP network (e.g. 13.108.0.0/14)",
        ),
        (
            SAMPLE_YAML.replace(
                "intake_owner_ids:", "poll: {unrouted_owner_ids: [x]}\nintake_owner_ids:", 1
            ),
            "9: poll.unrouted_owner_ids: moved: write these ids as `intake_owner_ids` at the top "
            "level of the file (they now apply to every input path, not only the poll)",
        ),
        (
            HUBSPOT_YAML.replace("  portal_id: 62515\n", ""),
            "3: crm.portal_id: required with webhook_secrets (events of other portals must be "
            "told apart and refused); add `portal_id: N`, your HubSpot account id",
        ),
        (
            SAMPLE_YAML.replace("{Country: [US, CA]}", "{Country name: [US]}", 1),
            "21: rules[0].when.Country name: field Country name, "
            "not a CRM field name (letters, digits and _ only)",
        ),
    ],
)
def test_trust_settings_are_validated(text: str, message: str) -> None:
    env = {**SAMPLE_ENV, **HUBSPOT_ENV}
    with pytest.raises(ConfigError) as err:
        parse_config(text, "x.yaml", env)
    assert str(err.value) == f"x.yaml:{message}"


def test_short_outbound_secret_is_refused_without_echoing_it() -> None:
    env = {**SAMPLE_ENV, "ACME_OM_SECRET": "too-short"}
    with pytest.raises(ConfigError) as err:
        parse_config(SAMPLE_YAML, "x.yaml", env)
    assert "too-short" not in str(err.value)
    assert str(err.value) == (
        "x.yaml:8: crm.outbound_secrets[0]: must be 24 to 200 characters of A-Z a-z 0-9 . _ ~ "
        "- (it is sent as a URL path segment); generate one with `python3 -c 'import secrets; "
        "print(secrets.token_urlsafe(32))'`"
    )


def test_warnings_name_settings_that_route_nothing() -> None:
    cfg = parse_config(
        SAMPLE_YAML.replace('intake_owner_ids: ["00G5g00000QueueEAB"]\n', ""), "x.yaml", SAMPLE_ENV
    )
    assert cfg.warnings() == [
        "intake_owner_ids: empty: every Salesforce record has an owner, so nothing will be "
        "routed; list the intake queue or integration user",
        "crm.organization_id: not set: every Outbound Message is refused (403 "
        "organization_id_not_configured); add the Salesforce.com Organization ID from Setup > "
        "Company Information (00D...)",
    ]
    with_id = SAMPLE_YAML.replace(
        "  object: Lead\n", "  object: Lead\n  organization_id: 00D5g000004ABCDEA4\n"
    )
    assert parse_config(with_id, "x.yaml", SAMPLE_ENV).warnings() == []


def test_parent_field_means_the_same_to_config_and_adapter() -> None:
    """One rule (crm_adapters.fields): an empty parent_field means "no parent" everywhere."""
    from connector.shell.adapters import adapter_for
    from crm_adapters.salesforce import SalesforceAdapter

    contact = SAMPLE_YAML.replace("object: Lead", "object: Contact")
    for text, expected in (
        (contact, "AccountId"),
        (contact.replace("object: Contact", 'object: Contact\n  parent_field: ""'), None),
        (
            SAMPLE_YAML.replace("object: Lead", "object: Lead\n  parent_field: Parent__c"),
            "Parent__c",
        ),
    ):
        cfg = parse_config(text, "a", SAMPLE_ENV)
        adapter = adapter_for(cfg)
        assert isinstance(adapter, SalesforceAdapter)
        assert cfg.crm.parent_key == adapter.settings.effective_parent_field == expected
