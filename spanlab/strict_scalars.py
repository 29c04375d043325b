"""Strict booleans and integers in config files: what pydantic's lax mode would quietly convert.

Why not pydantic's own ``strict=True``: strict validation of Python input also refuses a YAML list for a tuple
field and a string for a ``Path``, which every config writes. Lax mode is right for those, and wrong for scalars:
it reads ``steps: true`` as 1, ``steps: "3"`` or ``steps: 3.0`` as 3, and ``tito: 1`` as true, so a slip in a
config trains something other than what it says. :func:`scalar_problem` walks the raw mapping beside the model's
field types before pydantic sees it and names the first such value: an ``int`` field takes only integers, a
``bool`` field only ``true``/``false``, a ``float`` field anything but a boolean (``lr: 1e-4``, which YAML reads
as a string, and ``temperature: 1`` stay valid). Everything else is left to pydantic.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal, get_args, get_origin

from pydantic import BaseModel

_OK = "ok"  # the value is of this type, scalars strictly
_NA = "n/a"  # not this type's shape: pydantic decides


def scalar_problem(model: type[BaseModel], data: Any) -> str | None:
    """``key.path: why`` for the first value of ``data`` (a config's raw mapping for ``model``) that lax
    validation would convert from a boolean, string or float into an integer, or into a boolean; None if none."""
    verdict = _model(model, data, "")
    return None if verdict in (_OK, _NA) else verdict


def _model(model: type[BaseModel], data: Any, where: str) -> str:
    if not isinstance(data, Mapping):
        return _NA
    for name, field in model.model_fields.items():
        key = field.validation_alias if isinstance(field.validation_alias, str) else field.alias or name
        if key not in data:
            continue
        verdict = _check(field.annotation, data[key], f"{where}{key}")
        if verdict not in (_OK, _NA):
            return verdict
    return _OK


def _check(annotation: Any, value: Any, where: str) -> str:
    """_OK, _NA, or the problem with ``value`` at ``where`` as a value of ``annotation``."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return _check(get_args(annotation)[0], value, where)
    if origin in (typing.Union, types.UnionType):
        verdicts = [_check(member, value, where) for member in get_args(annotation)]
        if _OK in verdicts:
            return _OK
        return next((v for v in verdicts if v != _NA), _NA)
    if annotation is bool:
        if isinstance(value, bool):
            return _OK
        return f"{where}: expects true or false, not {_shown(value)}" if isinstance(value, int | float | str) else _NA
    if annotation is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return _OK
        return f"{where}: expects an integer, not {_shown(value)}" if isinstance(value, bool | float | str) else _NA
    if annotation is float:
        if isinstance(value, bool):
            return f"{where}: expects a number, not {_shown(value)}"
        return _OK if isinstance(value, int | float) else _NA
    if origin is Literal or annotation is Any or (origin is None and not isinstance(annotation, type)):
        return _NA
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return _model(annotation, value, f"{where}.")
    return _container(origin, get_args(annotation), value, where)


def _container(origin: Any, args: tuple[Any, ...], value: Any, where: str) -> str:
    """Elements of a tuple, list, set or dict field, each checked against its element type."""
    if origin in (tuple, list, set, frozenset, Sequence) and isinstance(value, list | tuple) and args:
        if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
            pairs = list(zip(args, value, strict=False))
        else:
            pairs = [(args[0], item) for item in value]
        for i, (element_type, item) in enumerate(pairs):
            verdict = _check(element_type, item, f"{where}[{i}]")
            if verdict not in (_OK, _NA):
                return verdict
        return _OK
    if origin in (dict, Mapping) and isinstance(value, Mapping) and len(args) == 2:
        for key, item in value.items():
            verdict = _check(args[1], item, f"{where}.{key}")
            if verdict not in (_OK, _NA):
                return verdict
        return _OK
    return _NA


def _shown(value: Any) -> str:
    """A scalar as the YAML that gave it (``true``, not Python's ``True``); a string quoted."""
    return ("true" if value else "false") if isinstance(value, bool) else repr(value)[:60]
