"""The SOQL subset the Salesforce simulator understands, as pure functions: statement and
WHERE parsing, literal parsing, comparison and ORDER BY keys. No state, no HTTP."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

from crm_sandboxes.salesforce.records import _is_id_field, _key

_SOQL_RE = re.compile(
    r"^\s*SELECT\s+(?P<fields>.+?)\s+FROM\s+(?P<obj>\w+)"
    r"(?:\s+WHERE\s+(?P<where>.+?))?(?:\s+ORDER\s+BY\s+(?P<order>.+?))?"
    r"(?:\s+LIMIT\s+(?P<limit>\d+))?\s*$",
    re.I | re.S,
)
_COND_RE = re.compile(r"^\s*(\w+)\s*(>=|<=|!=|=|>|<)\s*(.+?)\s*$", re.S)
_IN_RE = re.compile(r"^\s*(\w+)\s+(NOT\s+IN|IN)\s*\((.*)\)\s*$", re.I | re.S)


class _SoqlError(Exception):
    pass


class _FieldError(Exception):
    pass


def _parse_literal(raw: str) -> Any:
    v = raw.strip()
    if len(v) >= 2 and v[0] == "'" and v[-1] == "'":
        return v[1:-1].replace("\\'", "'")
    low = v.lower()
    if low in ("true", "false"):
        return low == "true"
    if low == "null":
        return None
    if re.match(r"^\d{4}-\d{2}-\d{2}T", v):
        s = v[:-1] + "+00:00" if v.endswith("Z") else v
        if re.search(r"[+-]\d{4}$", s):
            s = s[:-2] + ":" + s[-2:]
        return datetime.fromisoformat(s)
    try:
        return float(v)
    except ValueError as exc:
        raise _SoqlError(f"unexpected token: '{v}'") from exc


def _cmp(a: Any, op: str, b: Any) -> bool:
    if op == "=":
        return bool(a == b)
    if op == "!=":
        return bool(a != b)
    if a is None or b is None:
        return False
    try:
        if op == ">":
            return bool(a > b)
        if op == ">=":
            return bool(a >= b)
        if op == "<":
            return bool(a < b)
        return bool(a <= b)
    except TypeError:
        return False


def _parse_where(where: str | None) -> list[tuple[str, str, Any]]:
    """ANDed conditions as (field, operator, value); ids normalised to 18 characters."""
    if not where:
        return []
    out: list[tuple[str, str, Any]] = []
    for part in re.split(r"\s+AND\s+", where, flags=re.I):
        im = _IN_RE.match(part)
        if im:
            name = im.group(1)
            vals = [_parse_literal(v) for v in im.group(3).split(",") if v.strip()]
            if _is_id_field(name):  # an id matches in either form
                vals = [_key(v) for v in vals]
            out.append((name, " ".join(im.group(2).upper().split()), vals))
            continue
        cm = _COND_RE.match(part)
        if not cm:
            raise _SoqlError(f"unexpected token: '{part.strip()}'")
        name, value = cm.group(1), _parse_literal(cm.group(3))
        out.append((name, cm.group(2), _key(value) if _is_id_field(name) else value))
    return out


def _sort_key(v: Any) -> tuple[int, Any]:
    if v is None:
        return (0, "")
    if isinstance(v, datetime):
        return (1, v.timestamp())
    if isinstance(v, bool | int | float):
        return (1, float(v))
    return (2, str(v))
