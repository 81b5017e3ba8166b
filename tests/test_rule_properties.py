"""Properties of rule matching, on generated conditions and leads (Hypothesis): `not` is the
complement, `any`/`all` obey De Morgan, a rule set written back to YAML matches the same leads,
and the index gives what a plain scan of the rules gives."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from connector.core.config import Rule
from connector.core.config_loading import parse_config
from connector.core.rule_syntax import to_yaml
from connector.routing.rules import RuleSet, compile_rules, match

NOW = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
TYPES = {"Employees": "number", "Created": "date", "Tags": "multi"}
TEXTS = ["us", "CA", "vp", "Sales", "x"]
NUMBERS = [0, 10, 99.5, 1000]
DATES = ["2026-12-01", "7 days ago", "2026-12-01T10:00:00Z", "in 2 hours", "now"]
ABSOLUTE = ["2026-11-30", "2026-12-01", "2026-12-01T10:00:00Z", "2026-12-06T11:30:00Z"]


def _one_or_list(values: list[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(st.sampled_from(values), st.lists(st.sampled_from(values), min_size=1))


text_test = (
    st.builds(
        lambda f, op, arg, cs: {f: {op: arg, **({"case_sensitive": True} if cs else {})}},
        st.sampled_from(["Country", "Title"]),
        st.sampled_from(["in", "not_in", "contains", "starts_with", "ends_with"]),
        _one_or_list(TEXTS),
        st.booleans(),
    )
    | st.builds(
        lambda f, op, arg: {f: {op: arg}},
        st.sampled_from(["Country", "Title"]),
        st.sampled_from(["equals", "not_equals"]),
        st.sampled_from(TEXTS),
    )
    | st.builds(lambda v: {"Country": v}, _one_or_list(TEXTS))
)  # the original form
number_test = st.builds(
    lambda op, n: {"Employees": {op: n}},
    st.sampled_from(["gt", "gte", "lt", "lte", "equals"]),
    st.sampled_from(NUMBERS),
) | st.builds(
    lambda pair: {"Employees": {"between": sorted(pair)}},
    st.lists(st.sampled_from(NUMBERS), min_size=2, max_size=2),
)
date_test = st.builds(
    lambda op, d: {"Created": {op: d}},
    st.sampled_from(["gt", "gte", "lt", "lte"]),
    st.sampled_from(DATES),
) | st.builds(
    lambda pair: {"Created": {"between": sorted(pair)}},
    st.lists(st.sampled_from(["2026-11-30", "2026-12-01", "2026-12-05"]), min_size=2, max_size=2),
)
multi_test = st.builds(
    lambda op, v: {"Tags": {op: v}},
    st.sampled_from(["includes_any", "includes_all"]),
    _one_or_list(["a", "b", "c"]),
)
empty_test = st.builds(
    lambda f, op: {f: {op: True}},
    st.sampled_from(["Country", "Employees", "Created", "Tags", "Title"]),
    st.sampled_from(["is_empty", "is_not_empty"]),
)
leaf = st.one_of(text_test, number_test, date_test, multi_test, empty_test)
conditions = st.recursive(
    leaf,
    lambda kids: st.one_of(
        st.builds(lambda xs: {"all": xs}, st.lists(kids, min_size=1, max_size=3)),
        st.builds(lambda xs: {"any": xs}, st.lists(kids, min_size=1, max_size=3)),
        st.builds(lambda x: {"not": x}, kids),
    ),
    max_leaves=6,
)

MISSING = object()
CREATED = ["2026-12-01", "2026-11-30T23:00:00Z", "2026-12-06T11:00:00Z", "2026-12-06T13:00Z"]
CREATED += ["junk", "", None, MISSING]
leads = st.fixed_dictionaries(
    {
        "Country": st.sampled_from(["US", " us", "CA", "ca ", "", None, MISSING, 5, "Sales"]),
        "Title": st.sampled_from(["VP Sales", "svp", "x", "", None, MISSING, "US"]),
        "Employees": st.sampled_from([5, "10", "99.5", 1000, 1000.0, "lots", "", None, MISSING]),
        "Created": st.sampled_from(
            [
                "2026-12-01",
                "2026-11-30T23:00:00Z",
                "2026-12-06T11:00:00Z",
                "2026-12-06T13:00Z",
                "junk",
                "",
                None,
                MISSING,
            ]
        ),
        "Tags": st.sampled_from(["a;b", "A", "", ["b", "c"], "c; a ;b", None, MISSING]),
    }
).map(lambda d: {k: v for k, v in d.items() if v is not MISSING})


def compiled(*whens: dict[str, Any]) -> RuleSet:
    return compile_rules(
        [
            Rule.model_validate({"team": f"t{i}", "types": TYPES, "when": w})
            for i, w in enumerate(whens)
        ]
    )


def holds(when: dict[str, Any], lead: dict[str, object]) -> bool:
    return match(compiled(when), lead, NOW) is not None


@settings(max_examples=300, deadline=None)
@given(conditions, leads)
def test_not_is_the_complement(cond: dict[str, Any], lead: dict[str, object]) -> None:
    assert holds({"not": cond}, lead) is not holds(cond, lead)


@settings(max_examples=300, deadline=None)
@given(st.lists(conditions, min_size=1, max_size=4), leads)
def test_de_morgan(conds: list[dict[str, Any]], lead: dict[str, object]) -> None:
    negated = [{"not": c} for c in conds]
    assert holds({"not": {"all": conds}}, lead) is holds({"any": negated}, lead)
    assert holds({"not": {"any": conds}}, lead) is holds({"all": negated}, lead)
    assert holds({"all": conds}, lead) is all(holds(c, lead) for c in conds)
    assert holds({"any": conds}, lead) is any(holds(c, lead) for c in conds)


HEAD = """org: acme
crm:
  kind: salesforce
  instance_url: https://acme.my.salesforce.com
  auth: {method: session, access_token: "${TOKEN}"}
teams:
"""


@settings(max_examples=100, deadline=None)
@given(st.lists(conditions, min_size=1, max_size=6), st.lists(leads, min_size=1, max_size=10))
def test_a_rule_set_and_its_yaml_round_trip_match_the_same_leads(
    whens: list[dict[str, Any]], lead_list: list[dict[str, object]]
) -> None:
    original = compiled(*whens)
    rules = [
        {"team": f"t{i}", "types": TYPES, "when": to_yaml(r.node.cond)}
        for i, r in enumerate(original)
        if r.node is not None
    ]
    teams = "".join(
        f"  - {{name: t{i}, members: [{{crm_user_id: u{i}, name: R{i}}}]}}\n"
        for i in range(len(whens))
    )
    text_ = HEAD + teams + yaml.safe_dump({"rules": rules}, sort_keys=False)
    again = RuleSet(list(compile_rules(parse_config(text_, "rt.yaml", {"TOKEN": "x"}).rules)))
    for lead in lead_list:
        a, b = match(original, lead, NOW), match(again, lead, NOW)
        assert (a and a.rule_index) == (b and b.rule_index)


@settings(max_examples=200, deadline=None)
@given(st.lists(conditions, min_size=1, max_size=8), leads)
def test_the_index_finds_what_a_plain_scan_finds(
    whens: list[dict[str, Any]], lead: dict[str, object]
) -> None:
    rules = compiled(*whens)
    m = match(rules, lead, NOW)
    scan = next((r.index for r in rules if r.matches(lead, NOW)), None)
    assert (m.rule_index if m else None) == scan
