"""connector.routing.rules: which team a lead goes to (pure, no I/O)."""

from __future__ import annotations

from typing import Any

import pytest

from connector.core.config import Rule
from connector.routing.rules import compile_rules, match


def rules(*specs: dict[str, Any]) -> tuple[Any, ...]:
    return compile_rules([Rule.model_validate(s) for s in specs])


def team_for(compiled: tuple[Any, ...], fields: dict[str, object]) -> str | None:
    m = match(compiled, fields)
    return m.team if m else None


def test_first_match_wins() -> None:
    r = rules(
        {"team": "us", "when": {"Country": "US"}},
        {"team": "enterprise", "when": {"Size": "large"}},
        {"team": "rest"},
    )
    m = match(r, {"Country": "US", "Size": "large"})
    assert m is not None and (m.team, m.rule_index) == ("us", 0)
    m = match(r, {"Country": "DE", "Size": "large"})
    assert m is not None and (m.team, m.rule_index) == ("enterprise", 1)
    m = match(r, {"Country": "DE"})
    assert m is not None and (m.team, m.rule_index) == ("rest", 2)


@pytest.mark.parametrize("value", ["US", "us", " Us ", "\tuS\n"])
def test_compare_is_case_insensitive_and_trimmed(value: str) -> None:
    assert team_for(rules({"team": "t", "when": {"Country": " us "}}), {"Country": value}) == "t"


def test_casefold_not_just_lower() -> None:
    assert team_for(rules({"team": "t", "when": {"City": "Straße"}}), {"City": "STRASSE"}) == "t"


def test_scalar_and_list_values() -> None:
    r = rules({"team": "na", "when": {"Country": ["US", "CA"]}})
    assert team_for(r, {"Country": "ca"}) == "na"
    assert team_for(r, {"Country": "US"}) == "na"
    assert team_for(r, {"Country": "MX"}) is None
    single = rules({"team": "na", "when": {"Country": "US"}})
    assert team_for(single, {"Country": "US"}) == "na"
    assert team_for(single, {"Country": "USA"}) is None


def test_numbers_and_bools() -> None:
    r = rules(
        {"team": "big", "when": {"Employees": 500}},
        {"team": "flag", "when": {"Partner": True}},
        {"team": "score", "when": {"Score": [1.5, 2]}},
    )
    assert team_for(r, {"Employees": 500}) == "big"
    assert team_for(r, {"Employees": "500"}) == "big"
    assert team_for(r, {"Employees": 500.0}) == "big"
    assert team_for(r, {"Employees": " 500 "}) == "big"
    assert team_for(r, {"Employees": 501}) is None
    assert team_for(r, {"Partner": True}) == "flag"
    assert team_for(r, {"Partner": "TRUE"}) == "flag"
    assert team_for(r, {"Partner": "true "}) == "flag"
    assert team_for(r, {"Partner": False}) is None
    assert team_for(r, {"Partner": 1}) is None  # 1 is not "true"
    assert team_for(r, {"Score": "1.5"}) == "score"
    assert team_for(r, {"Score": 2.0}) == "score"
    assert team_for(r, {"Score": "2"}) == "score"


def test_all_when_keys_must_match() -> None:
    r = rules({"team": "t", "when": {"Country": "US", "Industry": ["Tech", "Bio"]}})
    assert team_for(r, {"Country": "US", "Industry": "bio"}) == "t"
    assert team_for(r, {"Country": "US", "Industry": "Retail"}) is None
    assert team_for(r, {"Country": "DE", "Industry": "Tech"}) is None
    assert team_for(r, {"Country": "US"}) is None


def test_missing_or_null_field_does_not_match() -> None:
    r = rules({"team": "t", "when": {"Country": "US"}})
    assert team_for(r, {}) is None
    assert team_for(r, {"Country": None}) is None
    assert team_for(r, {"country": "US"}) is None  # field names are exact


def test_default_rule_matches_everything() -> None:
    r = rules({"team": "us", "when": {"Country": "US"}}, {"team": "rest"})
    assert team_for(r, {}) == "rest"
    assert team_for(r, {"Country": None, "x": 1}) == "rest"


def test_no_rule_matches() -> None:
    assert match(rules({"team": "t", "when": {"Country": "US"}}), {"Country": "FR"}) is None
    assert match(compile_rules([]), {"Country": "FR"}) is None


def test_compiled_names() -> None:
    r = rules(
        {"team": "a", "when": {"Country": "US", "Size": "large"}},
        {"team": "b", "when": {"Country": "US"}, "name": "US inbound"},
        {"team": "c"},
    )
    assert [c.name for c in r] == ["rule 0: Country and Size", "US inbound", "rule 2: default"]
    assert [c.index for c in r] == [0, 1, 2]
    assert [c.team for c in r] == ["a", "b", "c"]
    m = match(r, {"Country": "US"})
    assert m is not None and m.rule_name == "US inbound"
