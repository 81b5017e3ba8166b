"""pydantic's validation errors as configuration problems: the key path as written in the
file, what is wrong and what to write, with "did you mean" for misspelt keys and values.

Generic over the models: the expected keys and values are read from the model classes
(``model_fields``, ``Literal`` arguments), so a new field or model needs nothing here.
"""

from __future__ import annotations

import types
from collections.abc import Iterable
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError

from connector.core.config_checks import Invalid, did_you_mean
from connector.core.yaml_source import Found, Loc

_SHOWN_INPUT = 60  # longer inputs are not quoted back
_BOUNDS = {
    "greater_than_equal": ("ge", "at least"),
    "less_than_equal": ("le", "at most"),
    "greater_than": ("gt", "more than"),
    "less_than": ("lt", "less than"),
}


def alternatives(tp: Any) -> list[Any]:
    """The types a value of ``tp`` may have: Annotated unwrapped, unions flattened, None out."""
    origin = get_origin(tp)
    if origin is Annotated:
        return alternatives(get_args(tp)[0])
    if origin in (Union, types.UnionType):
        return [alt for arg in get_args(tp) for alt in alternatives(arg)]
    return [] if tp is type(None) else [tp]


def _models(types_: Iterable[Any]) -> list[type[BaseModel]]:
    return [t for t in types_ if isinstance(t, type) and issubclass(t, BaseModel)]


def keys_of(model: type[BaseModel]) -> dict[str, Any]:
    """The keys a model takes as written in YAML (aliases), each with its type."""
    return {(f.alias or name): f.annotation for name, f in model.model_fields.items()}


def step(types_: Iterable[Any], part: str | int) -> list[Any]:
    """The types found one key (or list index) below values of ``types_``."""
    out: list[Any] = []
    for t in types_:
        if isinstance(t, type) and issubclass(t, BaseModel):
            if isinstance(part, str) and part in keys_of(t):
                out += alternatives(keys_of(t)[part])
        elif get_origin(t) is list and isinstance(part, int):
            out += alternatives(get_args(t)[0])
        elif get_origin(t) is dict and isinstance(part, str):
            out += alternatives(get_args(t)[1])
    return out


def _tag_values(model: type[BaseModel]) -> set[str]:
    """The values of the model's single-value Literal fields (a union's tags: `kind`)."""
    return {
        str(args[0])
        for tp in keys_of(model).values()
        if get_origin(tp) is Literal and len(args := get_args(tp)) == 1
    }


def narrow(types_: list[Any], data: object) -> list[Any]:
    """The members of a union of models that ``data`` selects by its tag fields."""
    models = _models(types_)
    if len(models) < 2 or not isinstance(data, dict):
        return types_
    chosen = [
        m
        for m in models
        if all(
            data.get(k) in get_args(tp)
            for k, tp in keys_of(m).items()
            if get_origin(tp) is Literal and len(get_args(tp)) == 1 and k in data
        )
    ]
    return chosen or types_


def written_loc(root: type[BaseModel], loc: Iterable[str | int]) -> tuple[Loc, list[Any]]:
    """The key path of a pydantic error location as written in the file (a union member's
    label left out), and the types expected at its end."""
    types_: list[Any] = [root]
    out: list[str | int] = []
    for part in loc:
        below = step(types_, part)
        if below:
            types_ = below
            out.append(part)
            continue
        if isinstance(part, int):  # an index into something that is not a list
            out.append(part)
            types_ = []
            continue
        # a union member's label: a tag (`salesforce`), a class name, or a type's name
        chosen = [m for m in _models(types_) if part in _tag_values(m) or part == m.__name__]
        if chosen:
            types_ = list(chosen)
        elif len(types_) < 2:
            out.append(part)  # a key no model knows (extra_forbidden)
            types_ = []
    return tuple(out), types_


def _literals(types_: Iterable[Any]) -> list[str]:
    return [str(a) for t in types_ if get_origin(t) is Literal for a in get_args(t)]


def _shown(value: object, hidden: bool) -> str | None:
    if hidden or not isinstance(value, str | int | float | bool) or value is None:
        return None
    text = str(value)
    return text if len(text) <= _SHOWN_INPUT and "\n" not in text else None


def _kind_of(value: object) -> str:
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return "text" if isinstance(value, str) else "an empty value"


def problems(
    root: type[BaseModel], err: ValidationError, hidden: Iterable[Loc] = ()
) -> list[Found]:
    """One problem for each error (each finding of an ``Invalid``); the inputs at ``hidden``
    key paths (secrets, values from the environment) are never quoted."""
    secret = set(hidden)
    out: list[Found] = []
    for e in err.errors(include_url=False):
        loc, types_ = written_loc(root, e["loc"])
        error = (e.get("ctx") or {}).get("error")
        if isinstance(error, Invalid):
            out += [Found((*loc, *sub), message) for sub, message in error.found]
            continue
        shown = _shown(e.get("input"), any(loc[: len(s)] == s for s in secret))
        out.append(_one(e, loc, types_, shown, written_loc(root, e["loc"][:-1])[1]))
    return out


def _one(e: Any, loc: Loc, types_: list[Any], shown: str | None, parent: list[Any]) -> Found:
    """The problem of one error; ``types_`` are the types expected at it, ``parent`` those
    one step up."""
    kind: str = e["type"]
    message: str = e["msg"].removeprefix("Value error, ")
    if kind == "extra_forbidden":
        known = [k for m in _models(parent) for k in keys_of(m)]
        return Found(loc, f"unknown key; {did_you_mean(loc[-1], known)}")
    if kind == "missing":
        return Found(loc, f"missing; add `{loc[-1]}:`")
    if kind in ("union_tag_invalid", "union_tag_not_found"):
        key = str(e["ctx"]["discriminator"]).strip("'")
        tags = sorted({t for m in _models(types_) for t in _tag_values(m)})
        if kind == "union_tag_not_found":
            return Found((*loc, key), f"missing; add `{key}:` ({', '.join(tags)})")
        tag = e["ctx"]["tag"]
        return Found((*loc, key), f"`{tag}` is not a {key}; {did_you_mean(tag, tags)}")
    if kind == "literal_error":
        values = _literals(types_)
        said = f"`{shown}` is not allowed" if shown is not None else "not allowed"
        return Found(loc, f"{said}; {did_you_mean(shown or '', values)}")
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        return Found(loc, f"expected a mapping (`key: value` lines), not {_kind_of(e['input'])}")
    if kind == "list_type":
        return Found(
            loc, f"expected a list (`- item` lines or `[a, b]`), not {_kind_of(e['input'])}"
        )
    if kind == "string_type" and isinstance(e["input"], int | float | bool) and shown:
        return Found(
            loc, f'expected text, not {_kind_of(e["input"])}; write it in quotes: "{shown}"'
        )
    bound = _BOUNDS.get(kind)
    if bound is not None:
        limit = e["ctx"][bound[0]]
        return Found(loc, f"must be {bound[1]} {limit}" + (f", not {shown}" if shown else ""))
    if kind == "string_pattern_mismatch":
        hint = _description(parent, loc)
        said = f"`{shown}` is not of the form expected" if shown else "not of the form expected"
        return Found(loc, f"{said}; write {hint}" if hint else message)
    return Found(loc, message)


def _description(parent: list[Any], loc: Loc) -> str | None:
    """The ``description`` of the field at ``loc``: what to write there, in words."""
    for model in _models(parent):
        for name, f in model.model_fields.items():
            if loc and loc[-1] in (name, f.alias) and f.description:
                return f.description
    return None
