"""Schema migrations, server functions and named SQL, loaded from the .sql files beside this
module.

The schema is ``migrations/`` (versioned: tables, indexes, constraints; the first is the
baseline, ``BASELINE``) plus ``functions/`` (functions, views and triggers as ``CREATE OR
REPLACE``, applied in file-name order on every migrate: connector/shell/migrations.py).

A query file holds blocks that start with ``-- name: some_name``; code refers to queries by
name, so every statement the connector runs can be read (and reviewed) in one place.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

HERE = Path(__file__).parent
_NAME = re.compile(r"^--\s*name:\s*([a-z_][a-z0-9_]*)\s*$", re.MULTILINE)
_COMMENT_LINE = re.compile(r"^[ \t]*--.*(?:\n|\Z)", re.MULTILINE)
_MIGRATION = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


def parse_named(text: str) -> dict[str, str]:
    """Split a file into its ``-- name:`` blocks, without their comment lines.

    The comments are for the reader of the file; the driver is better off without them:
    psycopg converts the placeholders of a statement of at most 4,096 bytes once and
    caches the result, and a longer one's again on every execution (record_assignments, sent
    for every batch, is 5,706 characters with its comments and 3,761 without). A line is a
    comment line when it starts with ``--`` after its indentation; in the query files no
    string literal or dollar-quoted body holds such a line, so none can be cut.
    """
    parts = _NAME.split(text)
    queries: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in queries:
            raise ValueError(f"query {name!r} is defined twice")
        queries[name] = _COMMENT_LINE.sub("", body).strip()
    return queries


@cache
def queries(concern: str) -> dict[str, str]:
    """The named queries of one concern, e.g. ``queries("routing")["insert_leads"]``."""
    return parse_named((HERE / f"{concern}.sql").read_text(encoding="utf-8"))


_BIND = re.compile(r"(?<![:\w]):([a-z_][a-z0-9_]*)")


def pyformat(sql: str) -> str:
    """A named query's ``:name`` parameters as the driver's ``%(name)s`` (``%`` doubled), for
    code that runs it on a bare psycopg connection. ``::`` casts are left alone; the query
    files use ``CAST`` and have no colons inside string literals."""
    return _BIND.sub(r"%(\1)s", sql.replace("%", "%%"))


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str


#: The first versioned migration: the whole schema's tables at once. A database recorded at
#: an earlier version was built by a migration history that no release shipped.
BASELINE = 27


def migrations() -> list[Migration]:
    found = []
    for path in sorted((HERE / "migrations").glob("*.sql")):
        m = _MIGRATION.match(path.name)
        if not m:
            raise ValueError(f"migration file name must look like 0001_name.sql: {path.name}")
        found.append(Migration(int(m.group(1)), m.group(2), path.read_text(encoding="utf-8")))
    versions = [m.version for m in found]
    # Unique and increasing from the baseline. Gaps are allowed: branches reserve numbers, and
    # a database records each version it applied.
    if len(set(versions)) != len(versions) or not versions or versions[0] != BASELINE:
        raise ValueError(
            f"migration versions must be unique and start at the baseline {BASELINE}: {versions}"
        )
    return found


@dataclass(frozen=True)
class Functions:
    name: str
    sql: str


def functions_digest(files: list[Functions]) -> str:
    """One digest of the files' names and texts, in their order."""
    h = hashlib.sha256()
    for f in files:
        h.update(f"{f.name}\0{f.sql}\0".encode())
    return h.hexdigest()


def functions() -> list[Functions]:
    """The files of ``functions/`` in the order they are applied (by file name: a file whose
    SQL functions read another file's must sort after it)."""
    return [
        Functions(path.stem, path.read_text(encoding="utf-8"))
        for path in sorted((HERE / "functions").glob("*.sql"))
    ]
