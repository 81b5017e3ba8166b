"""Loading org configuration: one YAML file per CRM org, validated into the models of
``connector.core.config``.

Secrets never live in the file: a value may be written as ``${ENV_NAME}`` and is resolved from
the environment when the file is loaded. Every problem of a file is reported at once, one line
each: ``file:line: key.path: what is wrong; what to write``.
"""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from connector.core.config import ConfigError, ConfigWarning, OrgConfig
from connector.core.config_checks import team_references
from connector.core.config_errors import problems as validation_problems
from connector.core.config_secrets import (
    ENV_REF,
    resolve_env,
    resolved_url_problems,
    secret_fields,
    written_secret_problems,
)
from connector.core.crm_kinds import CRM_KINDS
from connector.core.yaml_source import Document, Found, YamlSyntaxError, read_yaml

__all__ = ["ENV_REF", "ConfigProblems", "load_configs", "load_sources", "parse_config"]


class ConfigProblems(ConfigError):
    """Every problem of one or more files, one line each:
    ``file:line: key.path: what is wrong; what to write``."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__("\n".join(lines))
        self.lines = lines


@dataclass
class Source:
    """One loaded file: its config and the line of each key path (for warnings)."""

    file: str
    config: OrgConfig
    doc: Document = field(repr=False)

    def located(self, warning: ConfigWarning) -> str:
        """``file:line: warning: key.path: ...`` for one of the config's warnings."""
        return f"{self.file}:{self.doc.line_of(warning.loc)}: warning: {warning}"


def _line(source: str, doc: Document, found: Found) -> str:
    line = found.line if found.line is not None else doc.line_of(found.loc)
    where = f"{found.where}: " if found.loc else ""
    return f"{source}:{line}: {where}{found.message}"


def _problems(
    doc: Document, env: Mapping[str, str], base_dir: Path | None = None
) -> tuple[OrgConfig | None, list[Found]]:
    """The config of a read document, or every problem found in it."""
    if not isinstance(doc.data, dict):
        if doc.problems:
            return None, doc.problems
        return None, [Found((), "expected `key: value` lines at the top level (org:, crm:, ...)")]
    secrets = secret_fields(OrgConfig, doc.data)
    found = [*doc.problems, *written_secret_problems(doc, secrets)]
    from_env: set[tuple[str | int, ...]] = set()
    resolved = resolve_env(doc.data, env, (), found, from_env)
    said = {f.loc for f in found if f.loc}
    found += [f for f in resolved_url_problems(doc.data, resolved, secrets) if f.loc not in said]
    unread = _read_territory_files(resolved, base_dir)
    found += unread
    _canonical_ids(resolved)
    try:
        cfg = OrgConfig.model_validate(resolved)
    except ValidationError as exc:
        said = {f.loc for f in found if f.loc}  # a value found wrong is not judged again
        found += [
            f
            for f in validation_problems(OrgConfig, exc, hidden=[*secrets, *from_env])
            if not any(f.loc[: len(loc)] == loc for loc in said)
            # a territory whose file was not read has no rows to judge
            and not any(u.loc[: len(f.loc)] == f.loc for u in unread)
        ]
        if not any(f.loc[:1] == ("teams",) and f.loc[2:3] in ((), ("name",)) for f in found):
            found += _references(resolved)  # (with a team's name wrong, they would mislead)
        cfg = None
    if found:
        return None, _unique(found)
    return cfg, []


def _canonical_ids(data: dict[Any, Any]) -> None:
    """Write the CRM user ids the file names (members, intake owners, notified reps) in the
    one form their CRM kind stores and compares ids in (``CrmKind.id_key``: a Salesforce id
    becomes its 18 characters); a value that is no id of that kind stays as written, for
    validation to judge."""
    crm = data.get("crm")
    name = crm.get("kind") if isinstance(crm, dict) else None
    kind = CRM_KINDS.get(name) if isinstance(name, str) else None
    if kind is None:
        return

    def key(value: object) -> object:
        return kind.id_key(value) if isinstance(value, str) else value

    owners = data.get("intake_owner_ids")
    if isinstance(owners, list):
        data["intake_owner_ids"] = [key(o) for o in owners]
    teams = data.get("teams")
    notifications = data.get("notifications")
    holders = [
        *(m for t in _dicts(teams) for m in _dicts(t.get("members"))),
        *(_dicts(notifications.get("reps")) if isinstance(notifications, dict) else ()),
    ]
    for holder in holders:
        if "crm_user_id" in holder:
            holder["crm_user_id"] = key(holder["crm_user_id"])


def _dicts(value: object) -> list[dict[Any, Any]]:
    """The mappings of a list as written (anything else is validation's to report)."""
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _references(data: dict[Any, Any]) -> list[Found]:
    """The checks between entries, on the entries as written (the model's own run of them
    is skipped by pydantic when any field failed)."""
    teams, rules = data.get("teams"), data.get("rules")
    if not isinstance(teams, list) or not isinstance(rules, list):
        return []
    entries = [(t.get("name"), t.get("overflow_team")) for t in teams if isinstance(t, dict)]
    if len(entries) < len(teams):
        return []  # indexes would not match the file
    rule_teams = [r.get("team") if isinstance(r, dict) else None for r in rules]
    return [Found(loc, message) for loc, message in team_references(entries, rule_teams)]


def _unique(found: list[Found]) -> list[Found]:
    seen: set[tuple[object, ...]] = set()
    out: list[Found] = []
    for f in found:
        if (f.loc, f.message) not in seen:
            seen.add((f.loc, f.message))
            out.append(f)
    return out


def _read(
    text: str, source: str, env: Mapping[str, str] | None, base_dir: Path | None = None
) -> Source | list[str]:
    """The loaded file, or its problem lines in the order of the file."""
    try:
        doc = read_yaml(text)
    except YamlSyntaxError as exc:
        return [_line(source, Document(), exc.found)]
    cfg, found = _problems(doc, os.environ if env is None else env, base_dir)
    if cfg is None:
        ordered = sorted(found, key=lambda f: f.line if f.line is not None else doc.line_of(f.loc))
        return [_line(source, doc, f) for f in ordered]
    return Source(source, cfg, doc)


MAX_TERRITORY_BYTES = 50 * 1024 * 1024


def _read_territory_files(raw: dict[str, Any], base_dir: Path | None) -> list[Found]:
    """Read each territory's CSV ``file`` (a name in the config's folder) into its ``rows``;
    the problems are the ``file`` key's (a CSV's rows named by ``file:line``)."""
    territories = raw.get("territories")
    if not isinstance(territories, dict):
        return []
    found: list[Found] = []
    for name, spec in territories.items():
        if not isinstance(spec, dict) or spec.get("file") is None:
            continue
        loc = ("territories", str(name), "file")
        file = spec["file"]
        problem = _territory_rows(spec, file, base_dir)
        if problem is not None:
            found.append(Found(loc, problem))
    return found


def _territory_rows(spec: dict[str, Any], file: object, base_dir: Path | None) -> str | None:
    if "rows" in spec:
        return "write `rows` or `file`, not both"
    if not isinstance(file, str) or not file.strip():
        return "expected a file name"
    rel = Path(file)
    if rel.is_absolute() or ".." in rel.parts:
        return f"`{file}` must be a name in the config's folder"
    if base_dir is None:
        return "a territory file is read next to a config file"
    path = base_dir / rel
    try:
        if path.stat().st_size > MAX_TERRITORY_BYTES:
            return f"{file} is over {MAX_TERRITORY_BYTES} bytes"
        content = path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        return f"cannot read {file}: {exc}"
    reader = csv.DictReader(io.StringIO(content, newline=""))
    header = reader.fieldnames or []
    if "country" not in header or "team" not in header:
        return f"{file}:1: the header needs country and team columns"
    rows: list[dict[str, str | None]] = []
    try:
        for i, row in enumerate(reader):
            if reader.line_num != i + 2 or None in row:
                return f"{file}:{i + 2}: one row a line, as many cells as the header"
            rows.append({k: (v if v != "" else None) for k, v in row.items()})
    except csv.Error as exc:
        return f"{file}:{reader.line_num}: {exc}"
    spec["rows"] = rows
    return None


def parse_config(
    text: str,
    source: str = "<string>",
    env: Mapping[str, str] | None = None,
    base_dir: Path | None = None,
) -> OrgConfig:
    """Parse one org's YAML text; ``source`` names it in error messages, ``base_dir`` is the
    folder its territory files are read from."""
    read = _read(text, source, env, base_dir)
    if isinstance(read, list):
        raise ConfigProblems(read)
    return read.config


def _config_files(path: Path) -> list[Path]:
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix in (".yaml", ".yml") and p.is_file())
        if not files:
            raise ConfigError(f"{path}: folder holds no .yaml or .yml file")
        return files
    if path.is_file():
        return [path]
    raise ConfigError(f"{path}: no such file or folder")


def load_sources(path: str | Path, env: Mapping[str, str] | None = None) -> list[Source]:
    """Load a YAML file or every YAML file in a folder; the problems of all of them are
    raised at once (ConfigProblems)."""
    sources: list[Source] = []
    lines: list[str] = []
    orgs: dict[str, str] = {}
    for file in _config_files(Path(path)):
        try:
            text = file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            lines.append(f"{file}:1: cannot read: {exc}")
            continue
        read = _read(text, str(file), env, file.parent)
        if isinstance(read, list):
            lines += read
            continue
        org = read.config.org
        if org in orgs:
            line = read.doc.line_of(("org",))
            lines.append(
                f"{file}:{line}: org: `{org}` is already defined by {orgs[org]}; "
                "give each file its own org"
            )
            continue
        orgs[org] = str(file)
        sources.append(read)
    if lines:
        raise ConfigProblems(lines)
    return sources


def load_configs(path: str | Path, env: Mapping[str, str] | None = None) -> dict[str, OrgConfig]:
    """Load a YAML file or every YAML file in a folder, keyed by org name."""
    return {s.config.org: s.config for s in load_sources(path, env)}


def config_path_from(arg: str | None, env: Mapping[str, str] | None = None) -> str:
    """The --config argument, else $CONNECTOR_CONFIG; a clear error when neither is set."""
    value = arg or (os.environ if env is None else env).get("CONNECTOR_CONFIG")
    if not value:
        raise ConfigError("no configuration: pass --config FILE_OR_FOLDER or set CONNECTOR_CONFIG")
    return value


def pick_org(configs: Mapping[str, OrgConfig], org: str | None) -> OrgConfig:
    if org is None:
        if len(configs) == 1:
            return next(iter(configs.values()))
        raise ConfigError(f"several orgs configured ({', '.join(sorted(configs))}): pass --org")
    try:
        return configs[org]
    except KeyError:
        raise ConfigError(
            f"org {org!r} is not configured (known: {', '.join(sorted(configs))})"
        ) from None


def all_orgs(configs: Mapping[str, OrgConfig]) -> Iterable[OrgConfig]:
    return (configs[k] for k in sorted(configs))
