"""Secrets in a configuration file: every secret field (``SecretStr`` in the models) must be
written as a plain ``${ENV_NAME}`` reference, and every reference must name a variable that
is set and not empty. Problems name the key path and the variable, never a value."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qsl

from pydantic import BaseModel, SecretStr

from connector.core.config import SecretUrl
from connector.core.config_errors import narrow, step
from connector.core.database import database_url_problem
from connector.core.yaml_source import Document, Found, Loc

ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
# scheme://user[:password]@ at the start of a database URL
_URL_USERINFO = re.compile(r"[\w+.-]+://[^:/@]*(?::(?P<password>[^@]*))?@")
_WRITE = "write a `${ENV_NAME}` reference and set that variable"
_SHORT_TAGS = {"tag:yaml.org,2002:": "!!"}


def secret_fields(root: type[BaseModel], data: object, loc: Loc = ()) -> dict[Loc, type]:
    """The key paths in ``data`` that hold secrets (each with its secret type), found by
    walking ``data`` along the models' field types."""
    found: dict[Loc, type] = {}
    types_ = [root]

    def walk(value: object, at: Loc, types_: list[Any]) -> None:
        secret = next((t for t in types_ if isinstance(t, type) and issubclass(t, SecretStr)), None)
        if secret is not None:
            found[at] = secret
            return
        types_ = narrow(types_, value)
        if isinstance(value, dict):
            for key, item in value.items():
                if isinstance(key, str):
                    walk(item, (*at, key), step(types_, key))
        elif isinstance(value, list):
            for i, item in enumerate(value):
                walk(item, (*at, i), step(types_, i))

    walk(data, loc, types_)
    return found


def _tag_text(tag: str) -> str:
    for long, short in _SHORT_TAGS.items():
        if tag.startswith(long):
            return short + tag.removeprefix(long)
    return tag


def written_secret_problems(doc: Document, secrets: Mapping[Loc, type]) -> list[Found]:
    """Secrets written with a tag, as something other than text, or as literal values."""
    out: list[Found] = []
    for loc, kind in secrets.items():
        value = _at(doc.data, loc)
        if loc in doc.tags:
            out.append(Found(loc, f"a YAML tag ({_tag_text(doc.tags[loc])}) on a secret; {_WRITE}"))
        elif value is None:
            continue  # absent: the models say whether it is needed
        elif not isinstance(value, str):
            kind_text = (
                "true/false"
                if isinstance(value, bool)
                else "a number"
                if isinstance(value, int | float)
                else type(value).__name__
            )
            out.append(Found(loc, f"a secret must be text, not {kind_text}; {_WRITE}"))
        elif issubclass(kind, SecretUrl):
            out += _url_problems(loc, value)
        elif not ENV_REF.fullmatch(value.strip()):
            out.append(Found(loc, f"a literal secret; {_WRITE}"))
    return out


def _url_problems(loc: Loc, url: str) -> list[Found]:
    text = url.strip()
    if ENV_REF.fullmatch(text):
        return []
    if "://" not in text:
        problem = database_url_problem(text) or "not a URL"
        return [Found(loc, problem.replace("PASSWORD", "${PGPASSWORD}"))]
    if _url_has_literal_password(text):
        return [
            Found(
                loc,
                "a literal password; write it as a `${ENV_NAME}` reference "
                "(postgresql://USER:${PGPASSWORD}@HOST/DBNAME) or the whole URL as one",
            )
        ]
    return []


def _url_has_literal_password(url: str) -> bool:
    """True when a database URL carries a password that is not a ${ENV} reference, in the
    userinfo (``user:${PGPASS}@host``; the password runs to the first ``@``, as SQLAlchemy
    splits it) or a ``password=`` query parameter."""
    m = _URL_USERINFO.match(url)
    passwords = [m.group("password") or ""] if m else []
    rest = url[m.end() :] if m else url
    query = rest.partition("?")[2]
    passwords += [v for k, v in parse_qsl(query, keep_blank_values=True) if k == "password"]
    return any(pw and not ENV_REF.fullmatch(pw) for pw in passwords)


def _at(data: object, loc: Loc) -> object:
    for part in loc:
        if isinstance(data, dict):
            data = data.get(part)
        elif isinstance(data, list) and isinstance(part, int) and part < len(data):
            data = data[part]
        else:
            return None
    return data


def resolve_env(
    value: Any, env: Mapping[str, str], loc: Loc, problems: list[Found], used: set[Loc]
) -> Any:
    """``value`` with every ``${NAME}`` replaced from ``env``; a variable that is not set or
    is empty is a problem at its key path. ``used`` gets the key paths that held one."""
    if isinstance(value, str):

        def sub(m: re.Match[str]) -> str:
            name = m.group(1)
            used.add(loc)
            if name not in env:
                problems.append(
                    Found(
                        loc,
                        f"environment variable {name} is not set; set it where the connector runs",
                    )
                )
                return ""
            if not env[name].strip():
                problems.append(
                    Found(loc, f"environment variable {name} is empty; set it to the value")
                )
            return env[name]

        return ENV_REF.sub(sub, value)
    if isinstance(value, dict):
        return {k: resolve_env(v, env, (*loc, k), problems, used) for k, v in value.items()}
    if isinstance(value, list):
        return [resolve_env(v, env, (*loc, i), problems, used) for i, v in enumerate(value)]
    return value


def resolved_url_problems(
    written: object, resolved: object, secrets: Mapping[Loc, type]
) -> list[Found]:
    """URL secrets whose value, once resolved, is not a database URL (the variable named,
    its value never quoted)."""
    out: list[Found] = []
    for loc, kind in secrets.items():
        value, text = _at(resolved, loc), _at(written, loc)
        if not (issubclass(kind, SecretUrl) and isinstance(value, str) and value.strip()):
            continue
        problem = database_url_problem(value)
        if problem and isinstance(text, str):
            names = ", ".join(ENV_REF.findall(text)) or "the environment"
            out.append(Found(loc, f"the value of {names}: {problem}"))
    return out
