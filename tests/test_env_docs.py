"""Every CONNECTOR_* environment variable the product reads is documented in
docs/configuration.md, and the docs and the Docker files name no variable the code does not
read."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("connector", "crm_adapters", "crm_sandboxes", "db")
NAME = re.compile(r"\bCONNECTOR_[A-Z0-9_]*[A-Z0-9]\b")


def names_in_code() -> dict[str, list[str]]:
    """Each CONNECTOR_ name in the product's Python files, with the files naming it."""
    found: dict[str, list[str]] = {}
    for package in PRODUCT:
        for path in sorted((ROOT / package).rglob("*.py")):
            for name in set(NAME.findall(path.read_text(encoding="utf-8"))):
                found.setdefault(name, []).append(str(path.relative_to(ROOT)))
    return found


def documented() -> set[str]:
    """The names in the first column of the "Environment variables" table."""
    text = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    section = text.split("## Environment variables", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    return {row.split("`")[1] for row in rows}


def test_the_code_reads_connector_variables() -> None:
    # the scan finds what it is meant to (a broken pattern would pass the test below)
    assert {"CONNECTOR_CONFIG", "CONNECTOR_ADMIN_TOKEN", "CONNECTOR_DB_POOL_SIZE"} <= set(
        names_in_code()
    )


def test_every_variable_the_code_reads_is_documented() -> None:
    missing = {n: files for n, files in names_in_code().items() if n not in documented()}
    assert not missing, f"add these to docs/configuration.md, Environment variables: {missing}"


def test_the_docs_and_docker_files_name_only_variables_the_code_reads() -> None:
    read = set(names_in_code())
    stale = {n for n in documented() if n.startswith("CONNECTOR_")} - read
    assert not stale, f"documented but read nowhere: {sorted(stale)}"
    for name in ("Dockerfile", "compose.yaml", "connector.env.example"):
        unknown = set(NAME.findall((ROOT / "docker" / name).read_text())) - read
        assert not unknown, f"docker/{name} sets variables nothing reads: {sorted(unknown)}"
