"""Pydantic's validation errors as a config's reader needs them: ``section.key: what is wrong``, in plain words.

Why: pydantic writes ``Value error, ...`` before a validator's own message and ``(top level)`` has no place in a
sentence, and for a misspelt key it says only "Extra inputs are not permitted". A user who wrote
``datset:`` wants to read ``datset: unknown key; did you mean dataset?``: the section's own keys are found by
walking the model along the error's location, and ``difflib`` picks the close ones.
"""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, get_args, get_origin

from pydantic import BaseModel
from pydantic_core import ErrorDetails

_PREFIXES = ("Value error, ", "Assertion failed, ")


def did_you_mean(word: str, choices: Sequence[str], n: int = 3) -> str | None:
    """``did you mean a or b?`` for the choices close to a misspelt ``word``; None when none is close."""
    close = difflib.get_close_matches(word, list(choices), n=n, cutoff=0.6)
    return f"did you mean {' or '.join(close)}?" if close else None


def problem_line(model: type[BaseModel], err: ErrorDetails) -> str:
    """One error of ``model``'s validation as ``where: why`` (just ``why`` for a whole-config problem)."""
    loc = err["loc"]
    where = ".".join(str(part) for part in loc)
    why = _short(err["msg"])
    for prefix in _PREFIXES:
        why = why.removeprefix(prefix)
    if err["type"] == "extra_forbidden" and loc:
        keys = known_keys(model, loc[:-1])
        hint = did_you_mean(str(loc[-1]), keys)
        why = "unknown key" + (f"; {hint}" if hint else
                               f" (known: {', '.join(sorted(keys))})" if 0 < len(keys) <= 12 else "")
    return f"{_short(where)}: {why}" if where else why


def known_keys(model: type[BaseModel], loc: Sequence[int | str]) -> list[str]:
    """The keys the mapping at ``loc`` (a location in ``model``'s input) may hold; [] where that is not a model."""
    annotation: Any = model
    for part in loc:
        target = _model_of(annotation)
        if isinstance(part, str) and target is not None:
            field = next((f for name, f in target.model_fields.items() if part in (name, f.alias)), None)
            if field is None:
                return []
            annotation = field.annotation
        else:
            annotation = _element(annotation, part)
            if annotation is None:
                return []
    target = _model_of(annotation)
    if target is None:
        return []
    return [f.alias or name for name, f in target.model_fields.items()]


def _members(annotation: Any) -> list[Any]:
    """A union's members (an ``X | None`` field is a model when it is given); anything else alone."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return _members(get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return [m for arg in get_args(annotation) for m in _members(arg)]
    return [annotation]


def _model_of(annotation: Any) -> type[BaseModel] | None:
    models = [m for m in _members(annotation) if isinstance(m, type) and issubclass(m, BaseModel)]
    return models[0] if len(models) == 1 else None


def _element(annotation: Any, part: int | str) -> Any:
    """The type of item ``part`` of a list, tuple or dict annotation (None where it has none)."""
    for member in _members(annotation):
        origin, args = get_origin(member), get_args(member)
        if origin in (list, tuple, set, frozenset, Sequence) and args and isinstance(part, int):
            return args[0] if origin is not tuple or (len(args) == 2 and args[1] is Ellipsis) else \
                args[part] if part < len(args) else None
        if origin in (dict, Mapping) and len(args) == 2:
            return args[1]
    return None


def _short(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
