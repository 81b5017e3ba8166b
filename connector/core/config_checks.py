"""Findings of the configuration's validators, each at a key path, and the checks between
entries (a rule's team, a team's overflow team) that also run on a file whose entries did not
all validate, so that every problem of a file is reported at once."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence

from connector.core.yaml_source import Loc, loc_text


class Invalid(ValueError):
    """What a validator found, each at a key path below the value it validated (``()`` for
    the value itself); ``connector.core.config_loading`` turns each into a line of its own."""

    def __init__(self, *found: tuple[Loc, str]) -> None:
        super().__init__("; ".join(f"{loc_text(loc)}: {m}" if loc else m for loc, m in found))
        self.found = list(found)


def did_you_mean(name: object, known: Iterable[str]) -> str:
    """What to write instead of ``name``: the closest of ``known``, else all of them."""
    names = sorted(set(known))
    close = difflib.get_close_matches(str(name), names, n=1, cutoff=0.6) if names else []
    if close:
        return f"did you mean `{close[0]}`?"
    if not names:
        return "there is none to refer to"
    shown = ", ".join(names[:12]) + (", ..." if len(names) > 12 else "")
    return f"write one of: {shown}"


def team_references(
    teams: Sequence[tuple[object, object]], rule_teams: Sequence[object]
) -> list[tuple[Loc, str]]:
    """Team names given twice, rules and overflow teams naming no team, overflow circles.

    ``teams`` holds each team's (name, overflow_team) and ``rule_teams`` each rule's team, as
    written: values that are not text are the field validation's to report, and skipped.
    """
    found: list[tuple[Loc, str]] = []
    names = [n if isinstance(n, str) else None for n, _ in teams]
    first: dict[str, int] = {}
    for i, name in enumerate(names):
        if name is None:
            continue
        if name in first:
            found.append(
                (
                    ("teams", i, "name"),
                    f"team `{name}` is already defined (teams[{first[name]}]); "
                    "give each team its own name",
                )
            )
        else:
            first[name] = i
    for i, team in enumerate(rule_teams):
        if isinstance(team, str) and team not in first:
            found.append(
                (("rules", i, "team"), f"unknown team `{team}`; {did_you_mean(team, first)}")
            )
    overflow = {
        name: o if isinstance(o, str) else None
        for name, (_, o) in zip(names, teams, strict=True)
        if name is not None
    }
    for i, (name, target) in enumerate(zip(names, (o for _, o in teams), strict=True)):
        if not isinstance(target, str):
            continue
        loc: Loc = ("teams", i, "overflow_team")
        if target not in first:
            found.append((loc, f"unknown team `{target}`; {did_you_mean(target, first)}"))
            continue
        chain: list[str | None] = [name]
        nxt: str | None = target
        while nxt is not None and nxt in first and nxt not in chain:
            chain.append(nxt)
            nxt = overflow.get(nxt)
        # a circle is reported once, at the first team of the file that is in it
        if nxt == name and name is not None and all(first[str(t)] >= i for t in chain):
            found.append(
                (
                    loc,
                    f"overflow goes round in a circle ({' -> '.join([*map(str, chain), name])}); "
                    "end the chain with a team that has no overflow_team",
                )
            )
    return found
