"""Loading org configuration: one YAML file per CRM org, validated into the models of
``connector.core.config``.

Secrets never live in the file: a value may be written as ``${ENV_NAME}`` and is resolved from
the environment when the file is loaded. Errors name the file, the key path and the problem.
"""

from __future__ import annotations

import csv
import io
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

import yaml
from pydantic import ValidationError

from connector.core.config import ConfigError, OrgConfig
from connector.core.crm_kinds import CRM_KINDS
from connector.core.rule_syntax import ConditionError, dotted

ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
# scheme://user[:password]@ at the start of a database URL
_URL_USERINFO = re.compile(r"[\w+.-]+://[^:/@]*(?::(?P<password>[^@]*))?@")


def _resolve_env(value: Any, env: Mapping[str, str], path: str, missing: list[str]) -> Any:
    if isinstance(value, str):

        def sub(m: re.Match[str]) -> str:
            name = m.group(1)
            if name not in env:
                missing.append(f"{path}: environment variable {name} is not set")
                return ""
            return env[name]

        return ENV_REF.sub(sub, value)
    if isinstance(value, dict):
        return {
            k: _resolve_env(v, env, f"{path}.{k}" if path else str(k), missing)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_resolve_env(v, env, f"{path}[{i}]", missing) for i, v in enumerate(value)]
    return value


_SECRET_KEYS = {
    "outbound_secrets",
    "client_secret",
    "password",
    "security_token",
    "private_key",
    "access_token",
    "webhook_secrets",
}


def _url_has_literal_password(url: str) -> bool:
    """True when a database URL carries a password that is not a ${ENV} reference.

    The whole URL may be a reference (``${DATABASE_URL}``); otherwise the password, in the
    userinfo (``user:${PGPASS}@host``) or a ``password=`` query parameter, must be one. The
    userinfo is split the way SQLAlchemy splits it (the password runs to the first ``@``).
    """
    text = url.strip()
    if ENV_REF.fullmatch(text):
        return False
    m = _URL_USERINFO.match(text)
    passwords = [m.group("password") or ""] if m else []
    rest = text[m.end() :] if m else text
    query = rest.partition("?")[2]
    passwords += [v for k, v in parse_qsl(query, keep_blank_values=True) if k == "password"]
    return any(pw and not ENV_REF.fullmatch(pw) for pw in passwords)


def _literal_secrets(value: Any, path: str = "") -> list[str]:
    """Key paths of secrets written into the file itself instead of as ${ENV} references."""
    found: list[str] = []
    if isinstance(value, dict):
        for k, v in value.items():
            sub = f"{path}.{k}" if path else str(k)
            if k == "database_url" and not path:
                if isinstance(v, str) and _url_has_literal_password(v):
                    found.append(sub)
            elif (
                k in _SECRET_KEYS and isinstance(v, str) and v and not ENV_REF.fullmatch(v.strip())
            ):
                found.append(sub)
            elif k in _SECRET_KEYS and isinstance(v, list):
                found.extend(
                    f"{sub}[{i}]"
                    for i, item in enumerate(v)
                    if isinstance(item, str) and not ENV_REF.fullmatch(item.strip())
                )
            else:
                found.extend(_literal_secrets(v, sub))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            found.extend(_literal_secrets(v, f"{path}[{i}]"))
    return found


def _format_validation(source: str, err: ValidationError, text: str = "") -> str:
    lines = [f"{source}: invalid configuration"]
    marks: dict[tuple[str | int, ...], int] | None = None
    for e in err.errors():
        parts = list(e["loc"])
        if parts[:1] == ["crm"] and len(parts) > 1 and parts[1] in CRM_KINDS:
            del parts[1]  # the union's tag, not a key written in the file
        problem = (e.get("ctx") or {}).get("error")
        if isinstance(problem, ConditionError):  # structured: one line each, with its line
            marks = key_lines(text) if marks is None else marks
            for sub, msg in problem.problems:
                path = (*parts, *sub)
                line = _line_of(marks, path)
                at = f"{source}:{line}" if line else source
                lines.append(f"  {at}: {dotted(path)}: {msg}")
            continue
        loc = ".".join(str(p) if not isinstance(p, int) else f"[{p}]" for p in parts)
        loc = loc.replace(".[", "[")
        msg = e["msg"].removeprefix("Value error, ")
        lines.append(f"  {loc or '(top level)'}: {msg}")
    return "\n".join(lines)


def key_lines(text: str) -> dict[tuple[str | int, ...], int]:
    """The line (1-based) of every key path of a YAML text (a mapping key's line, a list
    item's first line), from the YAML nodes' marks."""
    out: dict[tuple[str | int, ...], int] = {}
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return out

    def walk(node: yaml.Node, path: tuple[str | int, ...]) -> None:
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                sub = (*path, str(k.value))
                out.setdefault(sub, k.start_mark.line + 1)
                walk(v, sub)
        elif isinstance(node, yaml.SequenceNode):
            for i, v in enumerate(node.value):
                out.setdefault((*path, i), v.start_mark.line + 1)
                walk(v, (*path, i))

    if root is not None:
        walk(root, ())
    return out


def _line_of(marks: Mapping[tuple[str | int, ...], int], path: tuple[str | int, ...]) -> int:
    """The line of the longest prefix of ``path`` the file has (0: none)."""
    for n in range(len(path), 0, -1):
        line = marks.get(path[:n])
        if line:
            return line
    return 0


MAX_TERRITORY_BYTES = 50 * 1024 * 1024


def _read_territory_files(raw: dict[str, Any], base_dir: Path | None, source: str) -> None:
    """Read each territory's CSV ``file`` (a name in the config's folder) into its ``rows``."""
    territories = raw.get("territories")
    if not isinstance(territories, dict):
        return
    for name, spec in territories.items():
        if not isinstance(spec, dict) or spec.get("file") is None:
            continue
        where = f"{source}: territories.{name}.file"
        file = spec["file"]
        if "rows" in spec:
            raise ConfigError(f"{where}: write `rows` or `file`, not both")
        if not isinstance(file, str) or not file.strip():
            raise ConfigError(f"{where}: expected a file name")
        rel = Path(file)
        if rel.is_absolute() or ".." in rel.parts:
            raise ConfigError(f"{where}: {file!r} must be a name in the config's folder")
        if base_dir is None:
            raise ConfigError(f"{where}: a territory file is read next to a config file")
        path = base_dir / rel
        try:
            if path.stat().st_size > MAX_TERRITORY_BYTES:
                raise ConfigError(f"{where}: {file} is over {MAX_TERRITORY_BYTES} bytes")
            content = path.read_text(encoding="utf-8-sig")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{where}: cannot read {file}: {exc}") from None
        reader = csv.DictReader(io.StringIO(content, newline=""))
        header = reader.fieldnames or []
        if "country" not in header or "team" not in header:
            raise ConfigError(f"{source}: {file}:1: the header needs country and team columns")
        rows: list[dict[str, str | None]] = []
        try:
            for i, row in enumerate(reader):
                if reader.line_num != i + 2 or None in row:
                    raise ConfigError(
                        f"{source}: {file}:{i + 2}: one row a line, as many cells as the header"
                    )
                rows.append({k: (v if v != "" else None) for k, v in row.items()})
        except csv.Error as exc:
            raise ConfigError(f"{source}: {file}:{reader.line_num}: {exc}") from None
        spec["rows"] = rows


def parse_config(
    text: str,
    source: str = "<string>",
    env: Mapping[str, str] | None = None,
    base_dir: Path | None = None,
) -> OrgConfig:
    """Parse one org's YAML text; ``source`` names it in error messages, ``base_dir`` is the
    folder its territory files are read from."""
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "not valid YAML"
        raise ConfigError(f"{source}: {problem}{where}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level")
    literal = _literal_secrets(raw)
    if literal:
        raise ConfigError(
            f"{source}: secrets must be ${{ENV_NAME}} references, not literal values: "
            + ", ".join(literal)
        )
    missing: list[str] = []
    resolved = _resolve_env(raw, os.environ if env is None else env, "", missing)
    if missing:
        raise ConfigError(f"{source}: " + "; ".join(missing))
    _read_territory_files(resolved, base_dir, source)
    try:
        return OrgConfig.model_validate(resolved)
    except ValidationError as exc:
        raise ConfigError(_format_validation(source, exc, text)) from None


def _config_files(path: Path) -> list[Path]:
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix in (".yaml", ".yml") and p.is_file())
        if not files:
            raise ConfigError(f"{path}: folder holds no .yaml or .yml file")
        return files
    if path.is_file():
        return [path]
    raise ConfigError(f"{path}: no such file or folder")


def load_configs(path: str | Path, env: Mapping[str, str] | None = None) -> dict[str, OrgConfig]:
    """Load a YAML file or every YAML file in a folder, keyed by org name."""
    configs: dict[str, OrgConfig] = {}
    for file in _config_files(Path(path)):
        try:
            text = file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{file}: cannot read: {exc}") from None
        cfg = parse_config(text, str(file), env, file.parent)
        if cfg.org in configs:
            raise ConfigError(f"{file}: org {cfg.org!r} is already defined by another file")
        configs[cfg.org] = cfg
    return configs


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
