"""Stored records that no read can answer with (JSON the policy refuses, values the model refuses) are quarantined:
left out of every list, a 404 that says why when asked for by name, and taken out of the queue by the next
dequeue (marked ``failed``). Each is logged once per process, so one bad record neither stops the store nor
floods its log.

Writes refuse such records (:func:`spanlab.store.schema.dumps`, the models' bounds); what this guards against is
a store written before a rule existed, or by hand.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from pydantic import ValidationError

from spanlab.errors import NotFoundError
from spanlab.jsonpolicy import JSONPolicyError

logger = logging.getLogger(__name__)
T = TypeVar("T")
BAD_RECORD = (JSONPolicyError, ValidationError)
_MAX_REMEMBERED = 100_000  # keys remembered for "logged once"; past that, a record may be logged again


class QuarantinedError(NotFoundError):
    """A record exists but cannot be read (its JSON or values break the rules); it is left out of answers."""


class _Logged:
    """Which quarantined records were logged already (per process: a restart logs each once more)."""

    def __init__(self) -> None:
        self._keys: set[str] = set()
        self._lock = threading.Lock()

    def first_time(self, key: str) -> bool:
        with self._lock:
            if key in self._keys:
                return False
            if len(self._keys) >= _MAX_REMEMBERED:
                self._keys.clear()
            self._keys.add(key)
            return True


_LOGGED = _Logged()


def reason(exc: Exception) -> str:
    """A one-line reason: pydantic's first error, or the policy's message."""
    if isinstance(exc, ValidationError):
        err = exc.errors()[0]
        return f"{'.'.join(map(str, err['loc'])) or 'value'}: {err['msg']}"
    return str(exc)


def note(what: str, exc: Exception) -> None:
    """Log ``what`` (e.g. ``rollout 'ro-1'``) as quarantined, the first time only."""
    if _LOGGED.first_time(what):
        logger.error("quarantined %s: it cannot be read (%s); it is left out of every answer", what, reason(exc))


def one(row: dict[str, Any], convert: Callable[[dict[str, Any]], T], what: str) -> T:
    """``convert(row)``, or :class:`QuarantinedError` (404) naming ``what`` and why."""
    try:
        return convert(dict(row))
    except BAD_RECORD as exc:
        note(what, exc)
        raise QuarantinedError(f"{what} is quarantined: it cannot be read ({reason(exc)})") from None


def kept(rows: Iterable[dict[str, Any]], convert: Callable[[dict[str, Any]], T],
         name: Callable[[dict[str, Any]], str]) -> list[T]:
    """Each row converted; a row that cannot be is left out (and logged once, as ``name(row)``)."""
    out = []
    for row in rows:
        try:
            out.append(convert(dict(row)))
        except BAD_RECORD as exc:
            note(name(row), exc)
    return out
