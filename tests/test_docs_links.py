"""The docs stay navigable: every relative link in README.md, BENCHMARKS.md and docs/*.md
points at a file that exists, and the README stays short and starts with the two commands."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs").glob("*.md"))]

# [text](target) and [text](target "title"); images too. Fenced code is dropped first.
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
EXTERNAL = ("http://", "https://", "mailto:")


def relative_links(path: Path) -> list[str]:
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    text = re.sub(r"`[^`\n]*`", "", text)  # inline code is not a link
    return [t for t in LINK.findall(text) if not t.startswith(EXTERNAL)]


def test_docs_exist() -> None:
    names = {p.name for p in DOCS}
    for wanted in (
        "salesforce.md",
        "hubspot.md",
        "configuration.md",
        "operations.md",
        "security.md",
        "architecture.md",
        "reliability.md",
        "tutorial.md",
    ):
        assert wanted in names, f"docs/{wanted} is missing"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(doc: Path) -> None:
    broken = []
    for target in relative_links(doc):
        path = target.split("#", 1)[0]
        if not path:  # a link to an anchor of the same page
            continue
        if not (doc.parent / path).exists():
            broken.append(target)
    assert not broken, f"{doc.relative_to(ROOT)}: links to missing files: {broken}"


def test_link_finder_sees_links() -> None:
    """The checker is not vacuous: the README links into docs/."""
    links = relative_links(ROOT / "README.md")
    assert "docs/tutorial.md" in links and "BENCHMARKS.md" in links


def test_readme_is_short_and_starts_with_the_two_commands() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines (at most 200)"
    body = [line for line in lines if line.strip()]
    assert body[0].startswith("# "), "README.md starts with its title"
    assert body[1:5] == ["```", "python3 dev.py demo", "python3 dev.py test", "```"], body[1:5]


def test_readme_commands_exist_in_dev_py() -> None:
    source = (ROOT / "dev.py").read_text(encoding="utf-8")
    assert 'argv[0] not in ("demo", "test", "lint")' in source


def test_every_connector_command_in_the_docs_exists() -> None:
    """`connector WORD` in README.md and docs/*.md names a real subcommand."""
    from connector.shell.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    commands = set(sub.choices)  # type: ignore[arg-type]
    unknown, seen = set(), set()
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        words = re.findall(r"`connector ([a-z][a-z-]*)", text)  # inline code
        for fence in FENCE.finditer(text):  # command lines in code blocks
            words += re.findall(r"^\s*(?:\$ )?connector ([a-z][a-z-]*)", fence.group(0), re.M)
        unknown |= {(doc.name, w) for w in words if w not in commands}
        seen |= set(words)
    assert {"run", "check-config", "sandbox", "ingest"} <= seen  # the checker sees commands
    assert not unknown, f"commands the CLI does not have: {sorted(unknown)}"
