"""A store server's ``/sql`` answer read back: JSON rows checked to be a store's, then as text or as Arrow.

The server sends rows as strict JSON (:func:`spanlab.sql_surface.rows`): a non-finite float becomes the string
``"NaN"``, ``"Infinity"`` or ``"-Infinity"``, as JavaScript prints it, and as ``spanlab sql --db`` prints it.
So ``spanlab sql --url`` renders the rows as they came (:class:`SqlRows`), the same text as a file's query,
and never rebuilds types it cannot know: a stored ``-inf`` logprob beside finite ones is a list of a string and
numbers, which Arrow refuses to build. :meth:`SqlRows.to_arrow` (``StoreClient.query``) turns those strings
back into floats where they stand among numbers (a column or list of nothing but such strings stays text: the
JSON cannot tell it from a text column).

What no store server answers is refused in one line (:class:`~spanlab.errors.StoreError`), never a traceback:
rows that are not objects, a column header that is not a list of names, rows whose keys are not the columns, or
a column whose values are of different JSON kinds (numbers in one row, text in the next).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from spanlab.errors import StoreError

NON_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
_NOT_A_STORE = "is it a spanlab store server?"


@dataclass(frozen=True)
class SqlRows:
    """A query's answer as JSON values: the column names, then each row's values in their order."""

    columns: list[str]
    rows: list[list[Any]]

    def to_arrow(self) -> pa.Table:
        """The rows as an Arrow table (non-finite floats restored among numbers); one line if Arrow refuses."""
        if not self.rows:
            return pa.Table.from_arrays([pa.nulls(0) for _ in self.columns], names=self.columns)
        arrays = []
        for i, name in enumerate(self.columns):
            column = [row[i] for row in self.rows]
            numbers = any(_kind(v) == "number" for v in column)
            values = [NON_FINITE.get(v, v) if numbers and isinstance(v, str) else _restored(v) for v in column]
            try:
                arrays.append(pa.array(values))
            except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OverflowError) as exc:
                raise StoreError(f"column {name!r} of the answer has no Arrow type: {' '.join(str(exc).split())[:160]}"
                                 ) from None
        return pa.Table.from_arrays(arrays, names=self.columns)


def read_answer(url: str, body: bytes, header: str | None) -> SqlRows:
    """``/sql``'s body and column header (``x-spanlab-columns``) as :class:`SqlRows`, checked to be a store's."""
    try:
        rows = json.loads(body)
    except ValueError:
        raise StoreError(f"{url} answered /sql with a body that is not JSON ({_one_line(body[:80])}): "
                         f"{_NOT_A_STORE}") from None
    if not isinstance(rows, list) or not all(isinstance(row, dict) for row in rows):
        raise StoreError(f"{url} answered /sql with {_one_line(json.dumps(rows)[:80])}, not rows: {_NOT_A_STORE}")
    columns = _columns(url, header, rows)
    values = []
    for n, row in enumerate(rows):
        if list(row) != columns:
            raise StoreError(f"{url} answered /sql with row {n} of columns {_one_line(json.dumps(list(row))[:80])}, "
                             f"not {_one_line(json.dumps(columns)[:80])}: {_NOT_A_STORE}")
        values.append([row[c] for c in columns])
    for i, name in enumerate(columns):
        kinds = {_kind(row[i]) for row in values} - {"null", "non-finite"}  # "NaN" is a number or a text
        if len(kinds) > 1:
            raise StoreError(f"{url} answered /sql with column {name!r} holding {' and '.join(sorted(kinds))} "
                             f"values: {_NOT_A_STORE}")
    return SqlRows(columns, values)


def _columns(url: str, header: str | None, rows: list[dict[str, Any]]) -> list[str]:
    """The header's column names; a server without the header: the first row's keys (none for no rows)."""
    if header is None:
        return list(rows[0]) if rows else []
    try:
        columns = json.loads(header)
    except ValueError:
        columns = None
    if not isinstance(columns, list) or not all(isinstance(c, str) for c in columns) or \
            len(set(columns)) != len(columns):
        raise StoreError(f"{url} answered /sql with a column header that is not a list of distinct names "
                         f"({_one_line(header[:80])}): {_NOT_A_STORE}")
    return columns


def _kind(value: Any) -> str:
    """A JSON value's kind; "non-finite" for the strings a non-finite float is sent as (a text column may hold
    them too)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, str) and value in NON_FINITE:
        return "non-finite"
    if isinstance(value, int | float):
        return "number"
    return {str: "text", list: "list", dict: "object"}.get(type(value), type(value).__name__)


def _restored(value: Any) -> Any:
    """``value`` with "NaN"/"Infinity"/"-Infinity" read as floats where they stand among numbers: a list's
    items when it holds numbers too (a column of scalars: :meth:`SqlRows.to_arrow`)."""
    if isinstance(value, list):
        if any(isinstance(v, int | float) and not isinstance(v, bool) for v in value):
            return [NON_FINITE.get(v, v) if isinstance(v, str) else _restored(v) for v in value]
        return [_restored(v) if isinstance(v, list | dict) else v for v in value]
    if isinstance(value, dict):
        return {k: _restored(v) for k, v in value.items()}
    return value


def _one_line(text: str | bytes, limit: int = 300) -> str:
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
