"""The YAML form of a rule's ``when``: conditions, groups and field types, parsed into a tree.

A ``when`` is a mapping whose entries must all hold. An entry is either a group (``all:`` or
``any:`` with a list of conditions, ``not:`` with one) or a field test: ``Field: value`` or
``Field: [values]`` (equals one of them, the original form), or ``Field: {operator: argument,
...}`` (every operator given must hold). A field's type is the rule's ``types`` entry, else
what the operator says (``gt`` of a number compares numbers, of a date compares dates,
``includes_any`` reads a multi-value field), else text.

Parsing is pure; every problem comes back as a (path, message) item, the path relative to the
rule (``("when", "any", 1, "Employees", "gte")``), so the loader can name the file's line.
Matching is ``connector.routing.rules``'s. Adding an operator: its name and argument kind in
``OPERATORS`` here, its test in ``connector.routing.rules``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import Any, Literal

from connector.core.config_checks import Invalid

# A CRM field or property name: what a rule may test and what is read from the CRM.
FIELD_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,99}$")
FieldType = Literal["text", "number", "date", "multi"]
FIELD_TYPES: tuple[FieldType, ...] = ("text", "number", "date", "multi")
Scalar = str | int | float | bool
Path = tuple[str | int, ...]
Problem = tuple[Path, str]

# operator -> (argument kind, the types it applies to; the first is the one it implies)
#   one: one value; some: one value or a non-empty list; two: [low, high]; flag: `true`
OPERATORS: dict[str, tuple[str, tuple[FieldType, ...]]] = {
    "equals": ("one", ("text", "number", "date")),
    "in": ("some", ("text", "number", "date")),
    "not_equals": ("one", ("text", "number", "date")),
    "not_in": ("some", ("text", "number", "date")),
    "contains": ("some", ("text",)),
    "starts_with": ("some", ("text",)),
    "ends_with": ("some", ("text",)),
    "is_empty": ("flag", ("text", "number", "date", "multi")),
    "is_not_empty": ("flag", ("text", "number", "date", "multi")),
    "gt": ("one", ("number", "date")),
    "gte": ("one", ("number", "date")),
    "lt": ("one", ("number", "date")),
    "lte": ("one", ("number", "date")),
    "between": ("two", ("number", "date")),
    "includes_any": ("some", ("multi",)),
    "includes_all": ("some", ("multi",)),
}
GROUPS = ("all", "any", "not")
_EQUALITY = ("equals", "in", "not_equals", "not_in")
# keys of an operator mapping that are options, not operators
OPTIONS = ("case_sensitive",)
UNITS = {"minute": 60, "hour": 3600, "day": 86400, "week": 604800}


class ConditionError(Invalid):
    """A rule's conditions are invalid; ``problems`` are (path, message) items, each reported
    as a line of its own at its key path (``Invalid``'s findings)."""

    def __init__(self, problems: Sequence[Problem]) -> None:
        self.problems = list(problems)
        super().__init__(*self.problems)


def norm_text(value: object) -> str:
    """A value as text compares: trimmed and case-folded (CRM picklists and form fills
    disagree on case: "us" vs "US"); ``True`` is ``true``, ``2.0`` is ``2``."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value).strip().casefold()


def dotted(path: Path) -> str:
    """``("when", "any", 1, "Employees")`` -> ``when.any[1].Employees``."""
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else p)
    return out


@dataclass(frozen=True)
class Relative:
    """A moment relative to the instant a lead is matched: ``seconds`` before it (< 0: after)."""

    seconds: int
    text: str


# A date bound: a calendar day (compared day by day, in UTC), an instant, or a Relative.
DateBound = date | datetime | Relative


@dataclass(frozen=True)
class Test:
    """One test of one field: ``op`` with ``args`` (as written), read as ``type``."""

    field: str
    op: str
    args: tuple[Any, ...]
    type: FieldType = "text"
    case_sensitive: bool = False
    # written as `Field: value` or `Field: [values]` (the original form)
    plain: bool = False


@dataclass(frozen=True)
class Group:
    kind: Literal["all", "any"]
    items: tuple[Condition, ...]


@dataclass(frozen=True)
class Not:
    item: Condition


Condition = Test | Group | Not


def parse_date(text: str) -> date | datetime | None:
    """An ISO date (a calendar day) or date-time (an instant; no offset means UTC), as CRMs
    send them (Salesforce ``2026-12-05T10:00:00.000+0000``, HubSpot ``...Z``); else None."""
    s = text.strip()
    if len(s) == 10:
        try:
            return date.fromisoformat(s)
        except ValueError:
            return None
    if len(s) < 11 or not s[:4].isdigit():
        return None
    try:
        dt = datetime.fromisoformat(s)
    except ValueError:
        return None
    return dt if dt.tzinfo is not None else dt.replace(tzinfo=UTC)


def parse_relative(text: str) -> Relative | None:
    """``now``, ``N minutes|hours|days|weeks ago`` or ``in N ...`` (singular or plural)."""
    words = text.strip().casefold().split()
    if words == ["now"]:
        return Relative(0, "now")
    sign = 1
    if len(words) == 3 and words[2] == "ago":
        n, unit = words[0], words[1]
    elif len(words) == 3 and words[0] == "in":
        n, unit, sign = words[1], words[2], -1
    else:
        return None
    unit = unit.removesuffix("s")
    if not n.isdigit() or unit not in UNITS or len(n) > 6:
        return None
    canon = f"{int(n)} {unit}{'' if int(n) == 1 else 's'}"
    return Relative(sign * int(n) * UNITS[unit], f"{canon} ago" if sign > 0 else f"in {canon}")


def date_bound(value: object) -> DateBound | None:
    """A date argument as written in YAML (an unquoted date is a date already)."""
    if isinstance(value, datetime):
        return value if value.tzinfo is not None else value.replace(tzinfo=UTC)
    if isinstance(value, date):
        return value
    if isinstance(value, str):
        return parse_date(value) or parse_relative(value)
    return None


def number(value: object) -> float | None:
    """A number as written or as a CRM sends it (``1000``, ``"1000"``, ``" 1e3 "``); not a
    bool, not NaN or infinite, no ``_`` or ``,`` separators."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        f = float(value)
    elif isinstance(value, str) and "_" not in value:
        try:
            f = float(value)
        except ValueError:
            return None
    else:
        return None
    return f if f - f == 0 else None  # NaN and the infinities fail this


def _scalar(value: object) -> bool:
    return isinstance(value, str | int | float | bool | date) and value is not None


class _Parser:
    def __init__(self, types: Mapping[str, FieldType], rule: str) -> None:
        self.types = types
        self.rule = rule
        self.problems: list[Problem] = []

    def bad(self, path: Path, field: str | None, op: str | None, message: str) -> None:
        where = [self.rule] if self.rule else []
        if field is not None:
            where.append(f"field {field}")
        if op is not None:
            where.append(f"operator {op}")
        self.problems.append((path, ", ".join([*where, message]) if where else message))

    def mapping(self, raw: object, path: Path) -> Condition | None:
        if not isinstance(raw, Mapping) or not raw:
            self.bad(path, None, None, "expected a mapping of fields and groups (all, any, not)")
            return None
        items: list[Condition] = []
        for key, value in raw.items():
            sub = (*path, str(key))
            if key in ("all", "any"):
                item = self.group(key, value, sub)
            elif key == "not":
                inner = self.mapping(value, sub)
                item = Not(inner) if inner is not None else None
            else:
                item = self.field(str(key), value, sub)
            if item is not None:
                items.append(item)
        if len(items) != len(raw):
            return None
        return items[0] if len(items) == 1 else Group("all", tuple(items))

    def group(self, kind: Literal["all", "any"], raw: object, path: Path) -> Condition | None:
        if not isinstance(raw, list) or not raw:
            self.bad(path, None, None, f"`{kind}` needs a non-empty list of conditions")
            return None
        items = [self.mapping(v, (*path, i)) for i, v in enumerate(raw)]
        if any(i is None for i in items):
            return None
        return Group(kind, tuple(i for i in items if i is not None))

    def field(self, name: str, raw: object, path: Path) -> Condition | None:
        if not FIELD_NAME.match(name):
            self.bad(path, name, None, "not a CRM field name (letters, digits and _ only)")
            return None
        if not isinstance(raw, Mapping):
            values = raw if isinstance(raw, list) else [raw]
            if not values:
                self.bad(path, name, None, "lists no values")
                return None
            if not all(map(_scalar, values)):
                self.bad(path, name, None, "expected a value, a list of values or operators")
                return None
            return self.test(name, "in", values, False, path, plain=True)
        if not raw:
            self.bad(path, name, None, "names no operator")
            return None
        case = raw.get("case_sensitive", False)
        if not isinstance(case, bool):
            self.bad((*path, "case_sensitive"), name, None, "expected true or false")
            return None
        tests: list[Condition] = []
        ok = True
        for op, arg in raw.items():
            if op in OPTIONS:
                continue
            sub = (*path, str(op))
            if op not in OPERATORS:
                self.bad(sub, name, str(op), "unknown operator; " + _known())
                ok = False
                continue
            args = _arguments(op, arg)
            test = None
            if isinstance(args, str):
                self.bad(sub, name, op, args)
            else:
                test = self.test(name, str(op), args, case, sub)
            if test is None:
                ok = False
            else:
                tests.append(test)
        if not ok:
            return None
        if not tests:
            self.bad(path, name, None, "names no operator")
            return None
        return tests[0] if len(tests) == 1 else Group("all", tuple(tests))

    def test(
        self, name: str, op: str, args: list[object], case: bool, path: Path, plain: bool = False
    ) -> Test | None:
        shown = None if plain else op
        applies = OPERATORS[op][1]
        declared = self.types.get(name)
        if declared is not None:
            ftype = declared
        elif applies[0] in ("number", "date") and applies != ("text",):
            if op in _EQUALITY:
                ftype = "text"
            elif all(number(a) is not None for a in args):
                ftype = "number"
            elif all(date_bound(a) is not None for a in args):
                ftype = "date"
            else:
                self.bad(path, name, shown, f"{_shown(args)}: expected a number or a date")
                return None
        else:
            ftype = applies[0]
        if ftype not in applies:
            self.bad(path, name, shown, f"does not apply to a {ftype} field")
            return None
        if case and ftype != "text":
            self.bad(path, name, shown, f"case_sensitive applies to text, not to a {ftype} field")
            return None
        for a in args:
            if ftype == "number" and number(a) is None:
                self.bad(path, name, shown, f"{_shown([a])}: not a number")
                return None
            if ftype == "date" and date_bound(a) is None:
                self.bad(
                    path,
                    name,
                    shown,
                    f"{_shown([a])}: not a date (2026-01-31, 2026-01-31T09:00:00Z, "
                    "`7 days ago`, `in 2 hours`, `now`)",
                )
                return None
            if ftype in ("text", "multi") and op not in _EQUALITY and not str(a).strip():
                self.bad(path, name, shown, "an empty value matches everything; remove it")
                return None
        if op == "between" and not _ordered(ftype, args):
            self.bad(path, name, shown, f"{_shown(args)}: low is above high")
            return None
        return Test(name, op, tuple(args), ftype, case, plain)


def _arguments(op: str, arg: object) -> list[object] | str:
    """An operator's arguments as a list, or what is wrong with them."""
    kind = OPERATORS[op][0]
    if kind == "flag":
        if arg is not True:
            other = "is_not_empty" if op == "is_empty" else "is_empty"
            return f"write `{op}: true` (for the opposite, `{other}`)"
        return []
    if kind == "one":
        return [arg] if _scalar(arg) else "expected one value"
    if kind == "two":
        if isinstance(arg, list) and len(arg) == 2 and all(map(_scalar, arg)):
            return list(arg)
        return "expected [low, high]"
    args = arg if isinstance(arg, list) else [arg]
    if not args or not all(map(_scalar, args)):
        return "expected a value or a non-empty list of values"
    return list(args)


def _shown(args: Sequence[object]) -> str:
    return ", ".join(repr(a) if isinstance(a, str) else str(a) for a in args)


def _known() -> str:
    return "known: " + ", ".join(OPERATORS)


def _ordered(ftype: FieldType, args: Sequence[object]) -> bool:
    if ftype == "number":
        lo, hi = number(args[0]), number(args[1])
        return lo is not None and hi is not None and lo <= hi
    lo_b, hi_b = date_bound(args[0]), date_bound(args[1])
    if isinstance(lo_b, Relative) and isinstance(hi_b, Relative):
        return lo_b.seconds >= hi_b.seconds  # 7 days ago is before 1 day ago
    if isinstance(lo_b, Relative | None) or isinstance(hi_b, Relative | None):
        return True  # depends on when the lead is matched
    return as_instant(lo_b) <= as_instant(hi_b)


def as_instant(value: date | datetime) -> datetime:
    """A calendar day as its first instant (00:00 UTC); an instant as it is."""
    if isinstance(value, datetime):
        return value
    return datetime(value.year, value.month, value.day, tzinfo=UTC)


def parse_types(raw: object) -> tuple[dict[str, FieldType], list[Problem]]:
    """A rule's ``types: {Field: text|number|date|multi}``."""
    if raw is None:
        return {}, []
    if not isinstance(raw, Mapping):
        return {}, [(("types",), "expected a mapping of field names to types")]
    out: dict[str, FieldType] = {}
    problems: list[Problem] = []
    for k, v in raw.items():
        if v not in FIELD_TYPES:
            problems.append(
                ((("types", str(k))), f"{v!r}: expected one of {', '.join(FIELD_TYPES)}")
            )
        else:
            out[str(k)] = v
    return out, problems


def parse_when(raw: object, types: Mapping[str, FieldType], rule: str) -> Condition:
    """A rule's ``when`` as a tree; ConditionError with every problem found."""
    p = _Parser(types, rule)
    cond = p.mapping(raw, ("when",))
    if p.problems or cond is None:
        raise ConditionError(p.problems or [(("when",), f"{rule}: invalid")])
    return cond


def fields_of(cond: Condition) -> list[str]:
    """Every field a condition reads, in the order written (each once)."""
    out: dict[str, None] = {}

    def walk(c: Condition) -> None:
        if isinstance(c, Test):
            out.setdefault(c.field)
        elif isinstance(c, Not):
            walk(c.item)
        else:
            for i in c.items:
                walk(i)

    walk(cond)
    return list(out)


def to_yaml(cond: Condition) -> dict[str, Any]:
    """A condition in its YAML form (``parse_when`` of it matches the same leads)."""
    if isinstance(cond, Not):
        return {"not": to_yaml(cond.item)}
    if isinstance(cond, Group):
        return {cond.kind: [to_yaml(i) for i in cond.items]}
    if cond.plain:
        return {cond.field: list(cond.args)}
    kind = OPERATORS[cond.op][0]
    arg: Any
    if kind == "flag":
        arg = True
    elif kind == "one":
        arg = cond.args[0]
    else:
        arg = list(cond.args)
    spec: dict[str, Any] = {cond.op: arg}
    if cond.case_sensitive:
        spec["case_sensitive"] = True
    return {cond.field: spec}
