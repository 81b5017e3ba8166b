"""Configs written before the operators load and route exactly as they did: the shipped
examples, the tests' sample org and any generated rule set in the original
``when: {Field: [values]}`` form, against the original matcher (kept here as the
specification), on the same leads."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from connector.core.config import OrgConfig, Rule
from connector.core.config_loading import parse_config
from connector.routing.rules import compile_rules, match
from tests.helpers.sample_org import SAMPLE_ENV, SAMPLE_YAML

ROOT = Path(__file__).resolve().parent.parent


def old_norm(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value).strip().casefold()


def old_match(rules: list[Rule], fields: Mapping[str, object]) -> tuple[str, int, str] | None:
    """The matcher as it was: every field equals one of its values, first rule wins."""
    for i, rule in enumerate(rules):
        conds = [
            (k, frozenset(old_norm(v) for v in (vs if isinstance(vs, list) else [vs])))
            for k, vs in (rule.when or {}).items()
        ]
        name = rule.name or (f"rule {i}: " + (" and ".join(k for k, _ in conds) or "default"))
        if all(
            fields.get(k) is not None and old_norm(fields.get(k)) in allowed for k, allowed in conds
        ):
            assert rule.team is not None
            return rule.team, i, name
    return None


def shipped() -> list[OrgConfig]:
    out = []
    for path in sorted((ROOT / "config").glob("*.yaml")):
        text = path.read_text(encoding="utf-8")
        env = {name: "x" * 30 for name in re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", text)}
        out.append(parse_config(text, str(path), env))
    out.append(parse_config(SAMPLE_YAML, "acme.yaml", SAMPLE_ENV))
    return out


def variants(cfgs: list[OrgConfig]) -> list[object]:
    """Each value the rules name, in other cases and with spaces, plus values they do not."""
    out: list[object] = [None, "", "  ", "XX", 0, 1, 1.0, True, False, "true", "1.0"]
    for cfg in cfgs:
        for rule in filter(_original, cfg.rules):
            for vs in (rule.when or {}).values():
                for v in vs if isinstance(vs, list) else [vs]:
                    s = str(v)
                    out += [v, s.lower(), s.upper(), f"  {s}\t", s.swapcase(), s + "x"]
    return out


def test_shipped_and_sample_configs_route_as_before() -> None:
    cfgs = shipped()
    assert len(cfgs) >= 3
    values = variants(cfgs)
    for cfg in cfgs:
        # the rules in the original form (an example may show the operators too)
        original = [r for r in cfg.rules if r.territory is None and _original(r)]
        assert original
        rules = compile_rules(original)
        names = sorted({k for r in original for k in (r.when or {})})
        for i, v in enumerate(values):
            for j, w in enumerate(values[::7]):
                lead = {n: (v if k % 2 == 0 else w) for k, n in enumerate(names)}
                lead.update({"Other": i + j})
                m = match(rules, lead)
                assert (m and (m.team, m.rule_index, m.rule_name)) == old_match(original, lead)


def _original(rule: Rule) -> bool:
    return all(
        not isinstance(v, dict) and k not in ("all", "any", "not")
        for k, v in (rule.when or {}).items()
    )


scalar = st.one_of(
    st.sampled_from(["US", "us ", "Ca", "DE", "1", "1.0", "true", "x y", "Straße"]),
    st.integers(-2, 2),
    st.sampled_from([1.0, 1.5, 2.0]),
    st.booleans(),
)
old_when = st.dictionaries(
    st.sampled_from(["Country", "Size", "Partner", "Score"]),
    st.one_of(scalar, st.lists(scalar, min_size=1, max_size=3)),
    min_size=1,
    max_size=3,
)
old_rules = st.lists(
    st.builds(
        lambda i, w, named: {"team": f"t{i}", "when": w, **({"name": f"r{i}"} if named else {})},
        st.integers(0, 3),
        st.one_of(old_when, st.none()),
        st.booleans(),
    ),
    min_size=1,
    max_size=8,
)
lead_value = st.one_of(scalar, st.none(), st.just("STRASSE"), st.just(" TRUE "))
old_leads = st.dictionaries(
    st.sampled_from(["Country", "Size", "Partner", "Score", "country"]), lead_value, max_size=5
)


@settings(max_examples=200, deadline=None)
@given(old_rules, st.lists(old_leads, min_size=1, max_size=20))
def test_any_rule_set_in_the_original_form_routes_as_before(
    specs: list[dict[str, Any]], leads: list[dict[str, object]]
) -> None:
    specs = [{k: v for k, v in s.items() if v is not None} for s in specs]
    # written out as YAML and read back, as an operator's file would be
    rules = [Rule.model_validate(r) for r in yaml.safe_load(yaml.safe_dump(specs))]
    compiled = compile_rules(rules)
    for lead in leads:
        m = match(compiled, lead)
        assert (m and (m.team, m.rule_index, m.rule_name)) == old_match(rules, lead)
