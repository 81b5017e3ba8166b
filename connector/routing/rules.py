"""Rule matching: which team a lead goes to (pure functions, no I/O).

Rules are tried in order and the first match wins. A rule matches when, for every field it
names, the lead's value equals one of the listed values. Values compare as trimmed,
case-insensitive text, because CRM picklists and form fills disagree on case ("us" vs "US").
A rule without ``when`` matches every lead.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from connector.core.config import FieldValues, Rule


@dataclass(frozen=True)
class Match:
    team: str
    rule_index: int
    rule_name: str


def _norm(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value).strip().casefold()


def _allowed(values: FieldValues) -> frozenset[str]:
    items = values if isinstance(values, list) else [values]
    return frozenset(_norm(v) for v in items)


@dataclass(frozen=True)
class CompiledRule:
    team: str
    index: int
    name: str
    conditions: tuple[tuple[str, frozenset[str]], ...]
    # the match this rule gives: one immutable object, shared by every lead it matches
    result: Match = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "result", Match(self.team, self.index, self.name))

    def matches(self, fields: Mapping[str, object]) -> bool:
        for name, allowed in self.conditions:
            value = fields.get(name)
            if value is None or _norm(value) not in allowed:
                return False
        return True


def compile_rules(rules: Sequence[Rule]) -> tuple[CompiledRule, ...]:
    compiled = []
    for i, rule in enumerate(rules):
        conds = tuple((k, _allowed(v)) for k, v in (rule.when or {}).items())
        name = rule.name or (f"rule {i}: " + (" and ".join(k for k, _ in conds) or "default"))
        compiled.append(CompiledRule(rule.team, i, name, conds))
    return tuple(compiled)


def match(rules: Sequence[CompiledRule], fields: Mapping[str, object]) -> Match | None:
    """The first rule the lead's fields satisfy, or None when no rule matches."""
    for rule in rules:
        if rule.matches(fields):
            return rule.result
    return None
