"""One JSON-decoding policy for every HTTP surface (store server, gateway, OTLP, UI) and for JSON the store reads back.

Python's ``json`` accepts documents that break whatever handles them next, so each is refused here, once, with
a message that names it (422 on the HTTP surfaces):

* nesting deeper than :data:`MAX_DEPTH`: pydantic stops serializing at 255 levels and Python's recursion
  limit is near 1000, so a record stored 300 levels deep made every later read of its table fail;
* ``NaN`` and ``±Infinity`` (and ``1e999``, which is Infinity): not JSON (RFC 8259); stored, they read back as
  ``null`` or fail DuckDB's JSON functions;
* a lone UTF-16 surrogate (``"\\ud800"``) and invalid UTF-8: they decode to text that cannot be encoded again,
  so the write fails late, as a 500.

msgspec's decoder is strict RFC 8259 (it refuses the last two kinds itself) and runs in C; depth is checked
with an iterative walk over the containers, so no input can exhaust the stack.
"""

from __future__ import annotations

import json
import re
from typing import Any

import msgspec

from spanlab.errors import SpanlabError

MAX_DEPTH = 100  # far below pydantic's 255 and the recursion limit, far above any real payload
_DECODER = msgspec.json.Decoder()
_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


class JSONPolicyError(SpanlabError, json.JSONDecodeError):
    """A JSON document the policy refuses. A ``JSONDecodeError``, so FastAPI answers it 422 as invalid JSON.
    ``syntax``: not JSON at all (a surface may answer that as it always did, e.g. 400), rather than JSON the
    policy refuses (422 everywhere)."""

    def __init__(self, message: str, *, syntax: bool = False, reason: str = "") -> None:
        json.JSONDecodeError.__init__(self, message, "", 0)
        self.args, self.syntax, self.reason = (message,), syntax, reason or message

    def __str__(self) -> str:
        return self.msg


def decode(raw: bytes | str, *, what: str = "the body", max_depth: int = MAX_DEPTH) -> Any:
    """``raw`` as Python values; :class:`JSONPolicyError` naming ``what`` and the reason when the policy refuses it."""
    try:
        value = _DECODER.decode(raw)
    except RecursionError:
        raise JSONPolicyError(f"{what} is JSON nested deeper than {max_depth} levels") from None
    except msgspec.DecodeError as exc:
        reason, syntax = _reason(raw, exc)
        raise JSONPolicyError(f"{what} is {'not JSON' if syntax else 'not accepted JSON'}: {reason}",
                              syntax=syntax, reason=reason) from None
    if may_nest_deeper(raw, max_depth):
        check_depth(value, what=what, max_depth=max_depth)
    return value


def may_nest_deeper(text: bytes | str, max_depth: int = MAX_DEPTH) -> bool:
    """Whether the JSON ``text`` can be nested deeper than ``max_depth``. It cannot with no more opening brackets
    than that, and counting them runs in C: nearly every document is spared the walk of :func:`check_depth`."""
    if isinstance(text, str):
        return text.count("{") + text.count("[") > max_depth
    return text.count(b"{") + text.count(b"[") > max_depth


def check_depth(value: Any, *, what: str = "the value", max_depth: int = MAX_DEPTH) -> None:
    """Refuse ``value`` (decoded JSON, or what will be encoded as JSON) if nested deeper than ``max_depth``."""
    stack = [(value, 1)] if isinstance(value, (dict, list, tuple)) else []
    while stack:
        node, depth = stack.pop()
        if depth > max_depth:
            raise JSONPolicyError(f"{what} is JSON nested deeper than {max_depth} levels")
        for child in node.values() if isinstance(node, dict) else node:
            if isinstance(child, (dict, list, tuple)):
                stack.append((child, depth + 1))


def _refuse_constant(name: str) -> None:
    raise ValueError(f"{name} is not a JSON number (NaN and Infinity are refused)")


def _reason(raw: bytes | str, exc: msgspec.DecodeError) -> tuple[str, bool]:
    """Why msgspec refused ``raw``, in words, and whether it is a syntax error (Python's parser says where)."""
    data = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
    try:
        json.loads(data, parse_constant=_refuse_constant)
    except UnicodeDecodeError:
        return "it is not UTF-8", False
    except RecursionError:
        return "it is nested too deep", False
    except json.JSONDecodeError as err:
        return str(err), True
    except ValueError as err:  # NaN, Infinity
        return str(err), False
    if _SURROGATE.search(data):
        return "a string holds a lone UTF-16 surrogate (\\ud800-\\udfff without its pair)", False
    if isinstance(exc, msgspec.ValidationError):
        return f"a number is out of range (1e999 is Infinity): {exc}", False
    return str(exc), False
