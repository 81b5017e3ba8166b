"""Rule matching: which team a lead goes to (pure functions, no I/O).

Rules are tried in order and the first match wins. A rule's ``when`` (parsed at load by
``connector.core.rule_syntax``) is compiled here once into plain Python tests over the lead's
fields: no regular expressions, nothing evaluated from the config at match time. Text
compares trimmed and case-insensitive (CRM picklists and form fills disagree on case: "us"
vs "US"), numbers as numbers, dates as days or instants, multi-value fields (``A;B;C`` or a
list) as sets. A value that does not parse as its condition's type fails that condition and
is counted (``unparsed``), never an exception. A rule without ``when`` matches every lead;
a rule with a ``territory`` matches a lead its table has a row for, and routes to that row's
team.

Speed: every rule whose ``when`` requires a field to equal one of a set of texts is indexed by
those texts, so a lead is tested only against the rules its values can satisfy (and the rules
that have no such condition), in rule order. Each field is read and parsed once per lead.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from threading import Lock
from typing import Any, Protocol

from connector.core.config import OrgConfig, Rule, Territory
from connector.core.rule_syntax import (
    Condition,
    Group,
    Not,
    Relative,
    Test,
    as_instant,
    date_bound,
    fields_of,
    norm_text,
    number,
    parse_date,
)
from connector.core.territories import Row, Table
from connector.routing.rule_index import RuleIndex

Check = Callable[["Values"], bool]


@dataclass(frozen=True)
class Match:
    team: str
    rule_index: int
    rule_name: str


_norm = norm_text


def _exact(value: object) -> str:
    """``_norm`` without the case folding (``case_sensitive: true``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value).strip()


class Unparsed(Protocol):
    """Where a value that did not parse as its condition's type is counted (by field and
    type): a ``Tally``, or the /metrics counter (``connector.core.metrics``)."""

    def add(self, key: tuple[str, str]) -> None: ...


class Tally:
    """Values that did not parse as their condition's type, by (field, type): thread-safe,
    read by /metrics."""

    def __init__(self) -> None:
        self._lock = Lock()
        self.counts: dict[tuple[str, str], int] = {}

    def add(self, key: tuple[str, str]) -> None:
        with self._lock:
            self.counts[key] = self.counts.get(key, 0) + 1

    def snapshot(self) -> dict[tuple[str, str], int]:
        with self._lock:
            return dict(self.counts)


class Values:
    """One lead's fields as the conditions read them: each field read once per type (the
    caches are plain dicts by field name; the tests read them directly)."""

    __slots__ = ("_now", "dates", "fields", "multis", "numbers", "texts", "unparsed")

    def __init__(
        self, fields: Mapping[str, object], now: datetime | None, unparsed: Unparsed | None
    ) -> None:
        self.fields = fields
        self._now = now
        self.unparsed = unparsed
        self.texts: dict[str, str | None] = {}
        self.numbers: dict[str, float | None] = {}
        self.dates: dict[str, date | datetime | None] = {}
        self.multis: dict[str, frozenset[str] | None] = {}

    @property
    def now(self) -> datetime:
        if self._now is None:
            self._now = datetime.now(UTC)
        return self._now

    def text(self, name: str) -> str | None:
        try:
            return self.texts[name]
        except KeyError:
            value = self.fields.get(name)
            out = self.texts[name] = None if value is None else _norm(value)
            return out

    def exact(self, name: str) -> str | None:
        value = self.fields.get(name)
        return None if value is None else _exact(value)

    def empty(self, name: str) -> bool:
        value = self.fields.get(name)
        if value is None:
            return True
        if isinstance(value, str):
            return not value.strip()
        if isinstance(value, list | tuple | set | frozenset | dict):
            return not value
        return False

    def _bad(self, name: str, kind: str) -> None:
        if self.unparsed is not None:
            self.unparsed.add((name, kind))

    def number(self, name: str) -> float | None:
        try:
            return self.numbers[name]
        except KeyError:
            pass
        out = None
        if not self.empty(name):
            out = number(self.fields.get(name))
            if out is None:
                self._bad(name, "number")
        self.numbers[name] = out
        return out

    def date(self, name: str) -> date | datetime | None:
        try:
            return self.dates[name]
        except KeyError:
            pass
        out: date | datetime | None = None
        if not self.empty(name):
            value = self.fields.get(name)
            if isinstance(value, datetime):
                out = value if value.tzinfo is not None else value.replace(tzinfo=UTC)
            elif isinstance(value, date):
                out = value
            elif isinstance(value, str):
                out = parse_date(value)
            if out is None:
                self._bad(name, "date")
        self.dates[name] = out
        return out

    def multi(self, name: str) -> frozenset[str] | None:
        try:
            return self.multis[name]
        except KeyError:
            pass
        value = self.fields.get(name)
        out: frozenset[str] | None
        if value is None:
            out = None
        elif isinstance(value, list | tuple | set | frozenset):
            out = frozenset(t for t in (_norm(v) for v in value if v is not None) if t)
        else:
            out = frozenset(t for t in (p.strip().casefold() for p in _norm(value).split(";")) if t)
        self.multis[name] = out
        return out


# --- compiling one test -------------------------------------------------------------------


def _text_test(t: Test) -> Check:
    f = t.field
    read: Callable[[Values], str | None] = (
        (lambda v: v.exact(f)) if t.case_sensitive else (lambda v: v.text(f))
    )
    conv = _exact if t.case_sensitive else _norm
    args = tuple(conv(a) for a in t.args)
    op = t.op
    if op in ("equals", "in", "not_equals", "not_in"):
        allowed = frozenset(args)
        if t.case_sensitive:

            def is_in(v: Values) -> bool:
                s = v.exact(f)
                return s is not None and s in allowed

        else:

            def is_in(v: Values) -> bool:
                s = v.text(f)
                return s is not None and s in allowed

        if op in ("equals", "in"):
            return is_in
        return lambda v: not is_in(v)
    if op == "starts_with":
        return lambda v: (s := read(v)) is not None and s.startswith(args)
    if op == "ends_with":
        return lambda v: (s := read(v)) is not None and s.endswith(args)
    if op == "contains":
        return lambda v: (s := read(v)) is not None and any(a in s for a in args)
    raise AssertionError(op)


def _number_test(t: Test) -> Check:
    f, op = t.field, t.op
    nums = [n for n in (number(a) for a in t.args) if n is not None]
    if op in ("equals", "in", "not_equals", "not_in"):
        allowed = frozenset(nums)

        def is_in(v: Values) -> bool:
            n = v.number(f)
            return n is not None and n in allowed

        return is_in if op in ("equals", "in") else (lambda v: not is_in(v))
    if op == "between":
        lo, hi = nums

        def between(v: Values) -> bool:
            n = v.number(f)
            return n is not None and lo <= n <= hi

        return between
    (b,) = nums
    if op == "gt":
        return lambda v: (n := v.number(f)) is not None and n > b
    if op == "gte":
        return lambda v: (n := v.number(f)) is not None and n >= b
    if op == "lt":
        return lambda v: (n := v.number(f)) is not None and n < b
    return lambda v: (n := v.number(f)) is not None and n <= b


_COMPARE: dict[str, Callable[[Any, Any], bool]] = {
    "gt": lambda a, b: a > b,
    "gte": lambda a, b: a >= b,
    "lt": lambda a, b: a < b,
    "lte": lambda a, b: a <= b,
    "equals": lambda a, b: a == b,
}


def _date_side(value: date | datetime, bound: date | datetime | Relative, now: datetime) -> Any:
    """(the value, the bound) on one scale: days when the bound is a day, else instants."""
    if isinstance(bound, Relative):
        return as_instant(value), now - timedelta(seconds=bound.seconds)
    if isinstance(bound, datetime):
        return as_instant(value), bound
    day = value.astimezone(UTC).date() if isinstance(value, datetime) else value
    return day, bound


def _date_test(t: Test) -> Check:
    f, op = t.field, t.op
    bounds = [date_bound(a) for a in t.args]
    compare = _COMPARE["equals" if op in ("equals", "in", "not_equals", "not_in") else "gte"]

    def holds(value: date | datetime, now: datetime) -> bool:
        if op in ("equals", "in", "not_equals", "not_in"):
            return any(compare(*_date_side(value, b, now)) for b in bounds if b is not None)
        if op == "between":
            lo, hi = bounds
            assert lo is not None and hi is not None
            a, b = _date_side(value, lo, now)
            c, d = _date_side(value, hi, now)
            return bool(a >= b and c <= d)
        (b,) = bounds
        assert b is not None
        return _COMPARE[op](*_date_side(value, b, now))

    def check(v: Values) -> bool:
        d = v.date(f)
        return d is not None and holds(d, v.now)

    if op in ("not_equals", "not_in"):
        return lambda v: not check(v)
    return check


def _multi_test(t: Test) -> Check:
    f = t.field
    wanted = frozenset(_norm(a) for a in t.args)
    if t.op == "includes_any":
        return lambda v: (m := v.multi(f)) is not None and not m.isdisjoint(wanted)
    return lambda v: (m := v.multi(f)) is not None and wanted <= m


def compile_test(t: Test) -> Check:
    """One test as a function of a lead's ``Values`` (the one place an operator is tested)."""
    if t.op == "is_empty":
        return lambda v: v.empty(t.field)
    if t.op == "is_not_empty":
        return lambda v: not v.empty(t.field)
    if t.type == "number":
        return _number_test(t)
    if t.type == "date":
        return _date_test(t)
    if t.type == "multi":
        return _multi_test(t)
    return _text_test(t)


# --- compiling a condition tree -------------------------------------------------------------


@dataclass(frozen=True)
class Node:
    """A condition and its compiled test; a group's children in order."""

    cond: Condition
    check: Check
    children: tuple[Node, ...] = ()


def _all(checks: Sequence[Check]) -> Check:
    if len(checks) == 1:
        return checks[0]
    if len(checks) == 2:
        a, b = checks
        return lambda v: a(v) and b(v)

    def every(v: Values) -> bool:
        for c in checks:  # noqa: SIM110 (a loop: faster than all() of a generator)
            if not c(v):
                return False
        return True

    return every


def _any(checks: Sequence[Check]) -> Check:
    def some(v: Values) -> bool:
        for c in checks:  # noqa: SIM110 (a loop: faster than any() of a generator)
            if c(v):
                return True
        return False

    return some


def compile_condition(cond: Condition) -> Node:
    if isinstance(cond, Test):
        return Node(cond, compile_test(cond))
    if isinstance(cond, Not):
        inner = compile_condition(cond.item)
        c = inner.check
        return Node(cond, lambda v: not c(v), (inner,))
    kids = tuple(compile_condition(i) for i in cond.items)
    # cheap tests first: the result is the same (tests have no effects but the count of
    # values that did not parse), and a failed text test spares a date's parsing
    checks = [k.check for k in sorted(kids, key=lambda k: _cost(k.cond))]
    return Node(cond, _all(checks) if cond.kind == "all" else _any(checks), kids)


def _cost(cond: Condition) -> int:
    if isinstance(cond, Test):
        return {"text": 0, "number": 1, "multi": 2, "date": 3}[cond.type]
    return 4


def conjuncts(node: Node) -> list[Node]:
    """The nodes that must all hold (a top-level ``all`` flattened)."""
    if isinstance(node.cond, Group) and node.cond.kind == "all":
        return [n for k in node.children for n in conjuncts(k)]
    return [node]


def _relative(cond: Condition) -> bool:
    if isinstance(cond, Test):
        return cond.type == "date" and any(isinstance(date_bound(a), Relative) for a in cond.args)
    if isinstance(cond, Not):
        return _relative(cond.item)
    return any(_relative(i) for i in cond.items)


# --- rules ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Zone:
    """A rule's territory table and the fields it reads."""

    name: str
    territory: Territory
    table: Table = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "table", self.territory.table)

    def row(self, v: Values) -> Row | None:
        f = self.territory.fields
        get = v.fields.get
        return self.table.lookup(
            get(f.country),
            get(f.state) if f.state else None,
            get(f.postal_code) if f.postal_code else None,
        )


@dataclass(frozen=True)
class CompiledRule:
    index: int
    name: str
    team: str | None  # None: the territory's row names it
    node: Node | None
    zone: Zone | None = None
    # the match a team rule gives: one immutable object, shared by every lead it matches
    result: Match | None = field(default=None, repr=False, compare=False)
    by_team: dict[str, Match] = field(default_factory=dict, repr=False, compare=False)

    @property
    def fields(self) -> list[str]:
        out = fields_of(self.node.cond) if self.node is not None else []
        if self.zone is not None:
            out += [f for f in self.zone.territory.read if f not in out]
        return out

    def decide(self, v: Values) -> Match | None:
        if self.node is not None and not self.node.check(v):
            return None
        if self.zone is None:
            return self.result
        row = self.zone.row(v)
        if row is None:
            return None
        m = self.by_team.get(row.team)
        if m is None:
            m = self.by_team.setdefault(row.team, Match(row.team, self.index, self.name))
        return m

    def matches(self, fields: Mapping[str, object], now: datetime | None = None) -> bool:
        return self.decide(Values(fields, now, None)) is not None


class RuleSet(Sequence[CompiledRule]):
    """An org's rules, compiled: ``match`` finds the first one a lead satisfies."""

    def __init__(self, rules: Sequence[CompiledRule]) -> None:
        self.rules = tuple(rules)
        self.filed = RuleIndex([r.node.cond if r.node is not None else None for r in self.rules])
        # a rule with a relative date (`7 days ago`) matches by the instant as well
        self.timeless = not any(r.node is not None and _relative(r.node.cond) for r in self.rules)
        self.fields = sorted({f for r in self.rules for f in r.fields})

    def __len__(self) -> int:
        return len(self.rules)

    def __getitem__(self, i: Any) -> Any:
        return self.rules[i]

    def __iter__(self) -> Iterator[CompiledRule]:
        return iter(self.rules)

    def first(self, v: Values, start: int = 0) -> Match | None:
        """The first rule from ``start`` on that the lead satisfies, among the rules the
        index allows, in order."""
        rules = self.rules
        hits = self.filed.hits(v)
        ids = sorted(self.filed.always + hits) if hits else self.filed.always
        for i in ids:
            if i < start:
                continue
            r = rules[i]
            node = r.node
            if node is not None and not node.check(v):
                continue
            m = r.result if r.zone is None else r.decide(v)
            if m is not None:
                return m
        return None

    def allowed(self, v: Values) -> set[int]:
        """The rules the index lets a lead be tested against (the others cannot match)."""
        return {*self.filed.always, *self.filed.hits(v)}


def _label(rule: Rule, i: int, fields: Sequence[str]) -> str:
    if rule.name:
        return rule.name
    if rule.territory is not None:
        return f"rule {i}: territory {rule.territory}"
    return f"rule {i}: " + (" and ".join(fields) or "default")


def compile_rules(rules: Sequence[Rule], cfg: OrgConfig | None = None) -> RuleSet:
    """Compile once; ``cfg`` gives the territory tables (rules with a territory need it)."""
    compiled = []
    for i, rule in enumerate(rules):
        node = compile_condition(rule.condition) if rule.condition is not None else None
        zone = None
        if rule.territory is not None:
            if cfg is None:
                raise ValueError(f"rules[{i}] names territory {rule.territory!r}: pass the config")
            zone = Zone(rule.territory, cfg.territories[rule.territory])
        name = _label(rule, i, rule.fields)
        result = Match(rule.team, i, name) if rule.team is not None else None
        compiled.append(CompiledRule(i, name, rule.team, node, zone, result))
    return RuleSet(compiled)


def org_rules(cfg: OrgConfig) -> RuleSet:
    """The org's rules, compiled."""
    return compile_rules(cfg.rules, cfg)


def match(
    rules: RuleSet,
    fields: Mapping[str, object],
    now: datetime | None = None,
    unparsed: Unparsed | None = None,
) -> Match | None:
    """The first rule the lead's fields satisfy at ``now`` (relative dates are read from
    it; default: the clock), or None when no rule matches. Values that do not parse as their
    condition's type are added to ``unparsed``."""
    return rules.first(Values(fields, now, unparsed))
