"""YAML text read with the line of every key and list item and the tag each value was written
with, so that configuration messages can point at a line and secrets can refuse tags.

The values are those of ``yaml.safe_load`` (dates, numbers, merges and aliases alike). A key
given twice, a value no safe constructor knows, and a document that expands past
``MAX_VALUES`` are problems of their path; reading goes on, so every one is reported. A
syntax error stops the reading: it is reported with the key path that leads to it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

Loc = tuple[str | int, ...]
MAX_VALUES = 100_000  # keys and values, aliases counted each time they are used

_MAP_TAG = "tag:yaml.org,2002:map"
_SEQ_TAG = "tag:yaml.org,2002:seq"

# What to write, for the parser's problems that a slip of the hand causes.
_SYNTAX_HINTS = (
    (
        "mapping values are not allowed here",
        "a `key: value` where the YAML expected a plain value: indent this line like the keys "
        "of its mapping, or quote a value that holds ': '",
    ),
    (
        "expected <block end>",
        "this line is indented differently from the keys before it: line it up with its "
        "mapping's keys (spaces only)",
    ),
    ("could not find expected ':'", "write `key: value` (a colon and a space), or quote the text"),
    (
        "cannot start any token",
        "indent with spaces, not tabs; quote a value that starts with @ or `",
    ),
    ("expected ',' or ']'", "close the [list] on the line it starts, or quote the value"),
    ("expected ',' or '}'", "close the {mapping} on the line it starts, or quote the value"),
    ("found unexpected end of stream", "close the quote that this value opens"),
    ("found undefined alias", "define the &anchor before the *alias that uses it"),
    ("expected a single document", "keep one document per file: remove the `---` line"),
)


def loc_text(loc: Loc) -> str:
    """``teams[0].members[1].weight``: a key path as the messages write it."""
    text = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc)
    return text.removeprefix(".")


@dataclass(frozen=True)
class Found:
    """One problem: the key path (``()`` for the file as a whole) and what is wrong; what to
    write. ``line`` is set when the problem points at a line of its own (a syntax error)."""

    loc: Loc
    message: str
    line: int | None = None

    @property
    def where(self) -> str:
        return loc_text(self.loc)


class YamlSyntaxError(Exception):
    """The text is not YAML; ``found`` says where and what to write."""

    def __init__(self, found: Found) -> None:
        super().__init__(found.message)
        self.found = found


@dataclass
class Document:
    """What a YAML text holds, and where each key path is written."""

    data: Any = None
    lines: dict[Loc, int] = field(default_factory=dict)
    # the tag written before a value (`!!binary`, `!!str`, `!foo`), by key path
    tags: dict[Loc, str] = field(default_factory=dict)
    problems: list[Found] = field(default_factory=list)

    def line_of(self, loc: Loc) -> int:
        """The line of ``loc``, else of the nearest key path above it that is written."""
        for n in range(len(loc), -1, -1):
            if loc[:n] in self.lines:
                return self.lines[loc[:n]]
        return 1


class _Loader(yaml.SafeLoader):
    """The safe loader, remembering the tag each node was written with."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.written_tags: dict[int, str] = {}

    def _written_tag(self) -> str | None:
        tag: str | None = getattr(self.peek_event(), "tag", None)  # type: ignore[no-untyped-call]
        return tag

    def compose_scalar_node(self, anchor: Any) -> ScalarNode:
        tag = self._written_tag()
        node: ScalarNode = super().compose_scalar_node(anchor)
        if tag is not None:
            self.written_tags[id(node)] = tag
        return node

    def compose_sequence_node(self, anchor: Any) -> SequenceNode:
        tag = self._written_tag()
        node: SequenceNode = super().compose_sequence_node(anchor)
        if tag is not None:
            self.written_tags[id(node)] = tag
        return node

    def compose_mapping_node(self, anchor: Any) -> MappingNode:
        tag = self._written_tag()
        node: MappingNode = super().compose_mapping_node(anchor)
        if tag is not None:
            self.written_tags[id(node)] = tag
        return node


class _Builder:
    """Builds the values of a composed document, path by path."""

    def __init__(self, loader: _Loader, doc: Document) -> None:
        self.loader = loader
        self.doc = doc
        self.count = 0
        self.open: set[int] = set()  # the nodes being built (an alias inside itself)

    def build(self, node: Node, loc: Loc) -> Any:
        self.count += 1
        if self.count > MAX_VALUES:
            raise _TooBig
        if id(node) in self.open:
            self.doc.problems.append(
                Found(loc, "this alias refers to the value it is inside of; write the value out")
            )
            return None
        tag = self.loader.written_tags.get(id(node))
        if tag is not None:
            self.doc.tags[loc] = tag
        self.open.add(id(node))
        try:
            if isinstance(node, MappingNode) and node.tag == _MAP_TAG:
                return self._mapping(node, loc)
            if isinstance(node, SequenceNode) and node.tag == _SEQ_TAG:
                return [self.build(item, (*loc, i)) for i, item in enumerate(node.value)]
            return self.loader.construct_object(node, deep=True)
        except yaml.YAMLError as exc:
            problem = getattr(exc, "problem", None) or "cannot be read"
            self.doc.problems.append(Found(loc, f"{problem}; write a plain value without a tag"))
            return None
        finally:
            self.open.discard(id(node))

    def _mapping(self, node: MappingNode, loc: Loc) -> dict[Any, Any]:
        own = {id(k) for k, _ in node.value}
        self.loader.flatten_mapping(node)  # `<<: *base` merges first, as safe_load does
        out: dict[Any, Any] = {}
        written: dict[Any, int] = {}  # the keys written in this mapping itself, by line
        for key_node, value_node in node.value:
            line = key_node.start_mark.line + 1
            key = (
                self.loader.construct_object(key_node, deep=True)
                if isinstance(key_node, ScalarNode)
                else None
            )
            if not isinstance(key, str | int | float | bool):
                self.doc.problems.append(
                    Found(loc, "a key that is not plain text; write `name: value`", line)
                )
                continue
            if isinstance(key, bool | float):
                key = str(key).lower() if isinstance(key, bool) else str(key)
            key_loc = (*loc, key)
            if id(key_node) in own:
                if key in written:
                    self.doc.problems.append(
                        Found(key_loc, f"given twice (also on line {written[key]}); keep one", line)
                    )
                    continue
                written[key] = line
            if id(key_node) in own or key_loc not in self.doc.lines:
                self.doc.lines[key_loc] = line
            out[key] = self.build(value_node, key_loc)  # a later key wins, as in safe_load
        return out


class _TooBig(Exception):
    pass


def read_yaml(text: str) -> Document:
    """The document in ``text``; raises YamlSyntaxError when it is not YAML."""
    loader = _Loader(text)
    doc = Document()
    try:
        try:
            node = loader.get_single_node()
        except yaml.MarkedYAMLError as exc:
            raise YamlSyntaxError(_syntax_problem(text, exc)) from None
        except yaml.YAMLError as exc:  # a reader error: bytes that are not text
            raise YamlSyntaxError(Found((), f"not YAML text: {exc}", 1)) from None
        if node is None:
            return doc
        doc.lines[()] = node.start_mark.line + 1
        try:
            doc.data = _Builder(loader, doc).build(node, ())
        except _TooBig:
            doc.problems = [
                Found((), f"holds more than {MAX_VALUES} values (aliases counted where used)")
            ]
            doc.data = None
        return doc
    finally:
        loader.dispose()


def _syntax_problem(text: str, exc: yaml.MarkedYAMLError) -> Found:
    problem = exc.problem or exc.context or "not valid YAML"
    mark = exc.problem_mark or exc.context_mark
    if "end of stream" in problem and exc.context_mark is not None:
        mark = exc.context_mark  # where the unclosed quote or bracket starts
    hint = next((h for p, h in _SYNTAX_HINTS if p in problem), "fix the YAML syntax here")
    if mark is None:
        return Found((), f"YAML syntax: {problem}; {hint}", 1)
    loc = _path_before(text, mark.index)
    return Found(
        loc,
        f"YAML syntax: {problem} (column {mark.column + 1}); {hint}",
        mark.line + 1,
    )


def _path_before(text: str, index: int) -> Loc:
    """The key path of the last value that starts before ``index``, from the parser's events
    (those before a syntax error are all produced)."""
    stack: list[list[Any]] = []  # ["map", expecting a key, key] or ["seq", index]
    try:
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            if event.start_mark is not None and event.start_mark.index >= index:
                break
            if isinstance(event, yaml.NodeEvent) and stack:
                top = stack[-1]
                if top[0] == "map":
                    if top[1]:
                        top[2] = getattr(event, "value", "?")
                    top[1] = not top[1]
                else:
                    top[1] += 1
            if isinstance(event, yaml.MappingStartEvent):
                stack.append(["map", True, None])
            elif isinstance(event, yaml.SequenceStartEvent):
                stack.append(["seq", -1])
            elif isinstance(event, yaml.MappingEndEvent | yaml.SequenceEndEvent):
                stack.pop()
    except yaml.YAMLError:
        pass
    loc: list[str | int] = []
    for top in stack:
        if top[0] == "map" and top[2] is not None:
            loc.append(str(top[2]))
        elif top[0] == "seq" and top[1] >= 0:
            loc.append(top[1])
    return tuple(loc)
