"""Rule operators, groups and field types (connector.routing.rules; pure, no I/O)."""

from __future__ import annotations

from datetime import UTC, date, datetime
from typing import Any

import pytest

from connector.core.config import Rule
from connector.routing.decisions import trace_rules
from connector.routing.rules import RuleSet, Tally, Values, compile_rules, match
from connector.shell.explain import rule_line

NOW = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)


def one(when: dict[str, Any], types: dict[str, str] | None = None) -> RuleSet:
    spec: dict[str, Any] = {"team": "t", "when": when}
    if types:
        spec["types"] = types
    return compile_rules([Rule.model_validate(spec)])


def hit(when: dict[str, Any], fields: dict[str, object], **kw: Any) -> bool:
    return match(one(when, kw.get("types")), fields, NOW) is not None


CASES: list[tuple[dict[str, Any], dict[str, object], bool]] = [
    # equals / in / not_equals / not_in: trimmed, case-insensitive text
    ({"Country": {"equals": "US"}}, {"Country": " us "}, True),
    ({"Country": {"in": ["US", "CA"]}}, {"Country": "Ca"}, True),
    ({"Country": {"in": ["US", "CA"]}}, {"Country": "MX"}, False),
    ({"Industry": {"not_equals": "Government"}}, {"Industry": "GOVERNMENT"}, False),
    ({"Industry": {"not_equals": "Government"}}, {"Industry": "Retail"}, True),
    ({"Industry": {"not_equals": "Government"}}, {}, True),  # a missing value is "not equal"
    ({"Industry": {"not_in": ["Gov", "Edu"]}}, {"Industry": "edu"}, False),
    ({"Country": {"equals": "US", "case_sensitive": True}}, {"Country": "us"}, False),
    ({"Country": {"equals": "US", "case_sensitive": True}}, {"Country": " US "}, True),
    # contains / starts_with / ends_with (any of a list)
    ({"Title": {"contains": "VP"}}, {"Title": "svp of sales"}, True),
    ({"Title": {"contains": ["VP", "Chief"]}}, {"Title": "Chief of Staff"}, True),
    ({"Title": {"contains": "VP"}}, {"Title": "Director"}, False),
    ({"Title": {"contains": "VP"}}, {}, False),
    ({"Title": {"contains": "VP", "case_sensitive": True}}, {"Title": "svp"}, False),
    ({"Email": {"ends_with": "@gmail.com"}}, {"Email": "A@GMail.com "}, True),
    ({"Email": {"ends_with": ["@gmail.com", "@yahoo.com"]}}, {"Email": "a@yahoo.com"}, True),
    ({"Email": {"starts_with": "info@"}}, {"Email": "Info@acme.com"}, True),
    ({"Email": {"starts_with": "info@"}}, {"Email": "ops@acme.com"}, False),
    # is_empty / is_not_empty: missing, None, blank and [] are empty
    ({"Phone": {"is_empty": True}}, {}, True),
    ({"Phone": {"is_empty": True}}, {"Phone": None}, True),
    ({"Phone": {"is_empty": True}}, {"Phone": "  "}, True),
    ({"Phone": {"is_empty": True}}, {"Phone": []}, True),
    ({"Phone": {"is_empty": True}}, {"Phone": "0"}, False),
    ({"Phone": {"is_empty": True}}, {"Phone": 0}, False),
    ({"Phone": {"is_not_empty": True}}, {"Phone": "555"}, True),
    ({"Phone": {"is_not_empty": True}}, {"Phone": ""}, False),
    # numbers: from JSON numbers or strings
    ({"Employees": {"gte": 1000}}, {"Employees": 1000}, True),
    ({"Employees": {"gte": 1000}}, {"Employees": "1000.0"}, True),
    ({"Employees": {"gte": 1000}}, {"Employees": " 1e3 "}, True),
    ({"Employees": {"gte": 1000}}, {"Employees": 999}, False),
    ({"Employees": {"gt": 1000}}, {"Employees": 1000}, False),
    ({"Employees": {"lt": 50}}, {"Employees": "49.5"}, True),
    ({"Employees": {"lte": 50}}, {"Employees": 50}, True),
    ({"Employees": {"between": [50, 999]}}, {"Employees": "999"}, True),
    ({"Employees": {"between": [50, 999]}}, {"Employees": 1000}, False),
    ({"Employees": {"gte": 10, "lt": 100}}, {"Employees": 100}, False),
    ({"Employees": {"gte": 10, "lt": 100}}, {"Employees": 10}, True),
    # numbers that do not parse: no match
    ({"Employees": {"gte": 1000}}, {"Employees": "1,000"}, False),
    ({"Employees": {"gte": 1000}}, {"Employees": "lots"}, False),
    ({"Employees": {"gte": 1000}}, {"Employees": "nan"}, False),
    ({"Employees": {"lt": 1000}}, {"Employees": "-inf"}, False),
    ({"Employees": {"gte": 0}}, {"Employees": True}, False),
    ({"Employees": {"gte": 0}}, {}, False),
    # dates: a day argument compares days (UTC), an instant compares instants
    ({"Created": {"gte": "2026-12-01"}}, {"Created": "2026-12-01T00:30:00.000+0000"}, True),
    ({"Created": {"gte": "2026-12-01"}}, {"Created": "2026-11-30T23:59:59Z"}, False),
    ({"Created": {"lt": date(2026, 12, 1)}}, {"Created": "2026-11-30"}, True),
    (
        {"Created": {"between": ["2026-01-01", "2026-03-31"]}},
        {"Created": "2026-03-31T22:00Z"},
        True,
    ),
    ({"Created": {"gt": "2026-12-01T10:00:00Z"}}, {"Created": "2026-12-01T11:00:00+02:00"}, False),
    ({"Created": {"gt": "2026-12-01T10:00:00Z"}}, {"Created": "2026-12-01T11:00:00+00:00"}, True),
    ({"Created": {"gt": "2026-12-01T10:00:00Z"}}, {"Created": "2026-12-02"}, True),
    # relative: NOW is 2026-12-06 12:00 UTC
    ({"Created": {"gte": "7 days ago"}}, {"Created": "2026-11-29T12:00:00Z"}, True),
    ({"Created": {"gte": "7 days ago"}}, {"Created": "2026-11-29T11:59:59Z"}, False),
    ({"Created": {"gte": "2 hours ago"}}, {"Created": "2026-12-06T10:30:00Z"}, True),
    ({"Created": {"lt": "in 1 week"}}, {"Created": "2026-12-12"}, True),
    ({"Created": {"lt": "now"}}, {"Created": "2026-12-07"}, False),
    ({"Created": {"gte": "7 days ago"}}, {"Created": "last tuesday"}, False),
    ({"Created": {"gte": "7 days ago"}}, {"Created": 1733443165000}, False),
    # multi-value: `;`-joined (Salesforce, HubSpot) or a list
    ({"Products": {"includes_any": ["API", "SSO"]}}, {"Products": "Billing;sso"}, True),
    ({"Products": {"includes_any": ["API", "SSO"]}}, {"Products": "Billing"}, False),
    ({"Products": {"includes_all": ["API", "SSO"]}}, {"Products": "api; SSO ;x"}, True),
    ({"Products": {"includes_all": ["API", "SSO"]}}, {"Products": ["api"]}, False),
    ({"Products": {"includes_all": ["API", "SSO"]}}, {"Products": ["SSO", "Api"]}, True),
    ({"Products": {"includes_any": "API"}}, {"Products": ""}, False),
    ({"Products": {"includes_any": "API"}}, {}, False),
]


@pytest.mark.parametrize(("when", "fields", "expected"), CASES)
def test_operator(when: dict[str, Any], fields: dict[str, object], expected: bool) -> None:
    assert hit(when, fields) is expected


def test_declared_types() -> None:
    # a number field compares as a number in `equals`; text would see "2.0" != "2"
    assert hit({"Score": [1, 2]}, {"Score": "2.0"}, types={"Score": "number"})
    assert not hit({"Score": [1, 2]}, {"Score": "2.0"})
    assert hit(
        {"Day": {"equals": "2026-12-01"}}, {"Day": "2026-12-01T18:00Z"}, types={"Day": "date"}
    )
    assert hit({"Tags": {"is_empty": True}}, {"Tags": ";"}, types={"Tags": "multi"}) is False


def test_groups() -> None:
    west = {"any": [{"Country": "US", "State": ["CA", "OR", "WA"]}, {"Country": "CA"}]}
    assert hit(west, {"Country": "us", "State": "wa"})
    assert hit(west, {"Country": "CA", "State": "QC"})
    assert not hit(west, {"Country": "US", "State": "NY"})
    nested = {"all": [{"not": {"Industry": "Government"}}, {"any": [{"A": 1}, {"B": 1}]}]}
    assert hit(nested, {"Industry": "Retail", "B": "1"})
    assert not hit(nested, {"Industry": "government", "B": "1"})
    assert not hit(nested, {"Industry": "Retail"})
    assert hit({"not": {"Title": {"contains": "assistant"}}}, {"Title": "VP"})


def test_unparsed_values_fail_their_condition_and_are_counted_once_per_lead() -> None:
    rules = compile_rules(
        [
            Rule.model_validate({"team": "a", "when": {"Employees": {"gte": 1000}}}),
            Rule.model_validate({"team": "b", "when": {"Employees": {"lt": 1000}}}),
            Rule.model_validate({"team": "c", "when": {"Created": {"gte": "7 days ago"}}}),
            Rule.model_validate({"team": "d"}),
        ]
    )
    tally = Tally()
    m = match(rules, {"Employees": "1.000,5", "Created": "yesterday"}, NOW, tally)
    assert m is not None and m.team == "d"
    assert tally.snapshot() == {("Employees", "number"): 1, ("Created", "date"): 1}
    m = match(rules, {"Employees": "", "Created": None}, NOW, tally)  # empty: not counted
    assert m is not None and m.team == "d"
    assert tally.snapshot() == {("Employees", "number"): 1, ("Created", "date"): 1}


def test_relative_dates_match_by_the_instant_given() -> None:
    rules = one({"Created": {"gte": "7 days ago"}})
    lead = {"Created": "2026-11-30T00:00:00Z"}
    assert match(rules, lead, NOW) is not None
    assert match(rules, lead, datetime(2026, 12, 8, tzinfo=UTC)) is None
    assert not rules.timeless and compile_rules([Rule.model_validate({"team": "t"})]).timeless


def test_territory_free_rules_need_no_config_but_territory_rules_do() -> None:
    rule = Rule.model_validate({"territory": "na"})
    with pytest.raises(ValueError, match="names territory 'na': pass the config"):
        compile_rules([rule])


def test_the_trace_says_which_condition_decided_with_the_leads_value() -> None:
    rules = compile_rules(
        [
            Rule.model_validate(
                {
                    "team": "ent",
                    "name": "big",
                    "when": {"Employees": {"gte": 1000}, "Industry": {"not_equals": "Gov"}},
                }
            ),
            Rule.model_validate(
                {"team": "west", "when": {"any": [{"State": ["CA", "OR"]}, {"Country": "CA"}]}}
            ),
            Rule.model_validate({"team": "rest", "when": {"Country": ["US"]}}),
        ]
    )
    tried, values = trace_rules(rules, {"Employees": "500", "Country": "US", "State": "NY"}, NOW)
    assert values == {"Employees": "500", "Industry": None, "State": "NY", "Country": "US"}
    assert tried[0]["checks"] == [
        {"field": "Employees", "op": "gte", "args": [1000], "type": "number", "ok": False},
        {"field": "Industry", "op": "not_equals", "args": ["Gov"], "ok": True},
    ]
    assert [rule_line(r, values) for r in tried] == [
        "  rule 0 \"big\" -> team ent: no match (Employees (number) gte 1000: lead has '500')",
        '  rule 1 "rule 1: State and Country" -> team west: no match (any of (State in ca|or; '
        "Country in ca): State: lead has 'NY', Country: lead has 'US')",
        '  rule 2 "rule 2: Country" -> team rest: matched (Country in us)',
    ]


def test_rules_are_filed_under_the_tokens_a_lead_must_have() -> None:
    specs: list[dict[str, Any]] = [
        {"team": "a", "when": {"Title": {"contains": "Chief"}}},
        {"team": "a", "when": {"Email": {"ends_with": ["@acme.com", "@Corp.io"]}}},
        {"team": "a", "when": {"any": [{"Title": {"starts_with": "head"}}, {"Country": "US"}]}},
        {"team": "a", "when": {"Tags": {"includes_all": ["api", "sso"]}}},
        {"team": "a", "when": {"Employees": {"gte": 5}, "Country": ["DE", "FR"]}},
        {"team": "a", "when": {"any": [{"Title": {"contains": "vp"}}, {"Country": "US"}]}},
        {"team": "a", "when": {"not": {"Country": "US"}}},
        {"team": "a", "when": {"Country": {"equals": "US", "case_sensitive": True}}},
    ]
    rules = compile_rules([Rule.model_validate(s) for s in specs])
    assert {k: sorted(t) for k, t in rules.filed.tables.items()} == {
        ("tri", "Title"): ["chi"],
        ("suf", "Email"): ["@acme.com", "@corp.io"],
        ("pre", "Title"): ["head"],
        ("eq", "Country"): ["de", "fr", "us"],
        ("item", "Tags"): ["api"],
    }
    assert rules.filed.always == (5, 6, 7)
    v = Values({"Title": "Our CHIEF of staff", "Email": "x@acme.com", "Tags": "sso;api"}, NOW, None)
    assert sorted(rules.filed.hits(v)) == [0, 1, 3]
    long = Values({"Title": "x" * 300}, NOW, None)  # too long to split: its rules are tested
    assert rules.filed.hits(long) == (0,)


def test_the_index_gives_the_first_match_in_rule_order() -> None:
    """Rules indexed by a required value and rules without one interleave: the answer is
    still the first rule in order, as a plain scan finds it."""
    specs: list[dict[str, Any]] = [
        {"team": "a", "when": {"Country": "US", "Employees": {"gte": 500}}},
        {"team": "b", "when": {"Title": {"contains": "vp"}}},
        {"team": "c", "when": {"Country": ["US", "CA"]}},
        {"team": "d", "when": {"State": "CA"}},
        {"team": "e"},
    ]
    rules = compile_rules([Rule.model_validate(s) for s in specs])
    assert set(rules.filed.tables) == {("eq", "Country"), ("eq", "State")}
    assert rules.filed.always == (1, 4)  # "vp" is too short to file, the default has nothing
    leads: list[dict[str, object]] = [
        {"Country": "US", "Employees": 900, "Title": "VP"},
        {"Country": "US", "Employees": 9, "Title": "VP"},
        {"Country": "CA", "State": "CA"},
        {"State": "CA"},
        {"Country": "DE"},
    ]
    for lead in leads:
        m = match(rules, lead, NOW)
        scan = next(r for r in rules if r.matches(lead, NOW))
        assert m is not None and m.rule_index == scan.index, lead
    assert [match(rules, x, NOW).team for x in leads] == ["a", "b", "c", "d", "e"]  # type: ignore[union-attr]


def test_a_long_trace_lists_twenty_misses_then_counts_the_rest() -> None:
    specs = [{"team": "t", "when": {"Country": f"C{i}"}} for i in range(30)]
    rules = compile_rules([Rule.model_validate(s) for s in [*specs, {"team": "d"}]])
    tried, values = trace_rules(rules, {"Country": "C27"}, NOW)
    assert [r.get("index") for r in tried] == [*range(20), None, 27]
    assert tried[20] == {"not_listed": 7} and tried[21]["matched"] is True
    assert rule_line(tried[20], values) == "  7 more rules did not match (not listed)"
    tried, _ = trace_rules(rules, {"Country": "X"}, NOW)
    assert tried[20:] == [{"not_listed": 10}, tried[21]] and tried[21]["index"] == 30
    tried, _ = trace_rules(rules, {"Country": "C20"}, NOW)  # the 21st rule: no count
    assert [r.get("index") for r in tried] == [*range(21)]
    assert trace_rules(compile_rules([]), {}, NOW) == ([], {})
