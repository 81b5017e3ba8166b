"""Which rules a lead can satisfy at all, before any rule is tested (pure).

Many conditions can only hold when the lead's value has a certain token: ``Country in [US,
CA]`` needs the text ``us`` or ``ca``; ``Email ends_with @acme.com`` needs the last three
characters ``com``; ``Title contains chief`` needs the three characters ``chi`` somewhere;
``Tags includes_any [a, b]`` needs the item ``a`` or ``b``. A rule is filed under the tokens of
one condition that must hold (of an ``all``: its most selective part; of an ``any``: every
part's, when every part has some), and a lead is tested only against the rules filed under
its own tokens and the rules that could not be filed (numbers, dates, ``not``, case-sensitive
text, texts shorter than three characters). Every token is read from the same normalised
text the tests compare, so a rule left out cannot match: the answer is the plain scan's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from connector.core.rule_syntax import Condition, Not, Test, norm_text

Token = tuple[str, str, str]  # (kind, field, token)
N = 3  # the length of a substring token, and the shortest prefix or suffix filed
LONGEST = 12  # a prefix or suffix is filed by at most this many characters
MAX_TEXT = 256  # a longer value is not split into substrings: its rules are all tested


class LeadValues(Protocol):
    def text(self, name: str) -> str | None: ...
    def multi(self, name: str) -> frozenset[str] | None: ...


def tokens_of(cond: Condition) -> set[Token] | None:
    """Tokens of which a lead must have one for ``cond`` to hold; None: no such set."""
    if isinstance(cond, Test):
        return _test_tokens(cond)
    if isinstance(cond, Not):
        return None
    parts = [tokens_of(c) for c in cond.items]
    if cond.kind == "any":
        if any(p is None for p in parts):
            return None
        return {t for p in parts if p is not None for t in p}
    known = [p for p in parts if p is not None]
    return min(known, key=len) if known else None


def _test_tokens(t: Test) -> set[Token] | None:
    f = t.field
    args = [norm_text(a) for a in t.args]
    if t.type == "multi":
        if t.op == "includes_any":
            return {("item", f, a) for a in args}
        if t.op == "includes_all":
            return {("item", f, args[0])}
        return None
    if t.type != "text" or t.case_sensitive:
        return None
    if t.op in ("equals", "in"):
        return {("eq", f, a) for a in args}
    if any(len(a) < N for a in args):
        return None
    if t.op == "starts_with":
        return {("pre", f, a[:LONGEST]) for a in args}
    if t.op == "ends_with":
        return {("suf", f, a[-LONGEST:]) for a in args}
    if t.op == "contains":
        return {("tri", f, a[:N]) for a in args}
    return None


def lead_tokens(
    kind: str, field: str, v: LeadValues, lengths: Sequence[int] = ()
) -> set[str] | frozenset[str] | None:
    """The lead's tokens of one kind for one field (prefixes and suffixes of the ``lengths``
    filed); None: too long to split (test them all)."""
    if kind == "item":
        return v.multi(field) or frozenset()
    s = v.text(field)
    if s is None:
        return frozenset()
    if kind == "eq":
        return {s}
    if len(s) < N:
        return frozenset()
    if kind == "pre":
        return {s[:n] for n in lengths if n <= len(s)}
    if kind == "suf":
        return {s[-n:] for n in lengths if n <= len(s)}
    if len(s) > MAX_TEXT:
        return None
    return {s[i : i + N] for i in range(len(s) - N + 1)}


class RuleIndex:
    """Rules by the tokens a lead must have; ``candidates`` lists, in rule order, the ones a
    lead's tokens allow (the rules that could not be filed come in every list)."""

    def __init__(self, conds: Sequence[Condition | None]) -> None:
        tables: dict[tuple[str, str], dict[str, list[int]]] = {}
        always: list[int] = []
        for i, cond in enumerate(conds):
            toks = tokens_of(cond) if cond is not None else None
            if not toks:
                always.append(i)
                continue
            for kind, field, tok in toks:
                tables.setdefault((kind, field), {}).setdefault(tok, []).append(i)
        self.tables = {k: {t: tuple(ix) for t, ix in tab.items()} for k, tab in tables.items()}
        self.always = tuple(always)
        # the token lengths of each prefix and suffix table
        self.lengths = {k: sorted({len(t) for t in tab}) for k, tab in self.tables.items()}

    def hits(self, v: LeadValues) -> tuple[int, ...]:
        """The filed rules the lead's tokens allow (without ``always``; each once)."""
        found: set[int] = set()
        for key, table in self.tables.items():
            toks = lead_tokens(key[0], key[1], v, self.lengths[key])
            if toks is None:
                for ids in table.values():
                    found.update(ids)
                continue
            for tok in toks:
                hit = table.get(tok)
                if hit:
                    found.update(hit)
        return tuple(found)
