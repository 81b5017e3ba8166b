"""Loading org configuration: one YAML file per CRM org, validated into the models of
``connector.core.config``.

Secrets never live in the file: a value may be written as ``${ENV_NAME}`` and is resolved from
the environment when the file is loaded. Errors name the file, the key path and the problem.
"""

from __future__ import annotations

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
    "bot_token",
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


def _format_validation(source: str, err: ValidationError) -> str:
    lines = [f"{source}: invalid configuration"]
    for e in err.errors():
        parts = list(e["loc"])
        if parts[:1] == ["crm"] and len(parts) > 1 and parts[1] in CRM_KINDS:
            del parts[1]  # the union's tag, not a key written in the file
        loc = ".".join(str(p) if not isinstance(p, int) else f"[{p}]" for p in parts)
        loc = loc.replace(".[", "[")
        msg = e["msg"].removeprefix("Value error, ")
        lines.append(f"  {loc or '(top level)'}: {msg}")
    return "\n".join(lines)


def parse_config(
    text: str, source: str = "<string>", env: Mapping[str, str] | None = None
) -> OrgConfig:
    """Parse one org's YAML text; ``source`` names it in error messages."""
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
    try:
        return OrgConfig.model_validate(resolved)
    except ValidationError as exc:
        raise ConfigError(_format_validation(source, exc)) from None


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
        cfg = parse_config(text, str(file), env)
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
