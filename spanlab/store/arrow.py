"""Spans <-> Arrow tables with the ``spans`` table's columns, and the one gate every span passes.

Every span is checked by the pydantic models of ``spanlab/types.py`` (the one place the span rules are
written): typed spans when they are built, an Arrow batch (the store server's wire format, bulk producers)
by :func:`table_to_spans`, which validates each row as a ``Span`` with its token columns as NumPy views (no
Python int per token). Ingest then builds one Arrow table per batch (:func:`spans_to_arrow`; DuckDB inserts it
with one statement, ~60x faster than ``executemany``). Read-back turns rows into typed ``Span`` objects through
the same :func:`row_to_span`, only when the caller asks for objects; training code stays on Arrow/NumPy.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
from pydantic import ValidationError

from spanlab.errors import InvalidSpanError
from spanlab.store.connection import dumps, loads
from spanlab.store.schema import JSON_SPAN_COLUMNS, SPAN_ARROW_SCHEMA
from spanlab.types import Span
from spanlab.vectors import to_numpy

_LIST_TYPES: dict[str, type] = {"prompt_token_ids": np.int32, "response_token_ids": np.int32,
                                "response_logprobs": np.float32, "loss_mask": np.uint8}


def list_column(values: Sequence[Any], dtype: type, list_type: pa.DataType) -> pa.Array:
    """An Arrow list column from per-row lists or arrays (None: a null row), through one NumPy concatenation."""
    arrays = [None if v is None else to_numpy(v, dtype) for v in values]
    if all(a is None for a in arrays):
        return pa.nulls(len(values), list_type)
    present = [a for a in arrays if a is not None and len(a)]
    flat = np.concatenate(present) if present else np.empty(0, dtype)
    offsets = np.zeros(len(arrays) + 1, dtype=np.int32)
    np.cumsum([0 if a is None else len(a) for a in arrays], out=offsets[1:])
    mask = pa.array([a is None for a in arrays]) if any(a is None for a in arrays) else None
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat), type=list_type, mask=mask)


_REQUIRED = ("span_id", "name", "kind", "start_time", "status")
_LLM_COLUMNS = ("model", "request_messages", "request_tools", "response_message", "finish_reason",
                *_LIST_TYPES, "prompt_tokens")


def as_model(model: type, value: Any, index: int) -> Any:
    """Accept a model instance or a dict; turn pydantic's error into one line that names the item."""
    if isinstance(value, model):
        return value
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        key = "span_id" if model is Span else "rollout_id"
        ident = value.get(key) if isinstance(value, dict) else None
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'span'}: {e['msg']}" for e in exc.errors())
        named = f" ({ident})" if ident is not None else ""
        raise InvalidSpanError(f"{model.__name__.lower()} #{index}{named} is invalid: {problems}; "
                               "nothing of this batch was stored") from None


def conform(tbl: pa.Table) -> pa.Table:
    """Reorder and cast ``tbl`` to the span schema; absent optional columns become nulls."""
    if tbl.schema.equals(SPAN_ARROW_SCHEMA):  # what spans_to_arrow and StoreClient send: nothing to do
        return tbl
    names = set(tbl.column_names)
    if unknown := names - set(SPAN_ARROW_SCHEMA.names):
        raise InvalidSpanError(f"unknown span columns {sorted(unknown)}; nothing stored")
    if missing := [c for c in _REQUIRED if c not in names]:
        raise InvalidSpanError(f"span batch lacks required columns {missing}; nothing stored")
    arrays = []
    for field in SPAN_ARROW_SCHEMA:
        col = tbl[field.name] if field.name in names else pa.nulls(tbl.num_rows, field.type)
        try:
            arrays.append(col.cast(field.type) if col.type != field.type else col)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise InvalidSpanError(f"span column `{field.name}` has type {col.type}, expected {field.type}: "
                                   f"{exc}; nothing stored") from exc
    return pa.Table.from_arrays(arrays, schema=SPAN_ARROW_SCHEMA)


def table_to_spans(tbl: pa.Table) -> list[Span]:
    """Each row of an Arrow span batch (any subset of the optional columns) validated as a ``Span``."""
    tbl = conform(tbl)
    rows = tbl.drop_columns(list(_LIST_TYPES)).to_pylist()
    lists = {name: _row_arrays(tbl[name]) for name in _LIST_TYPES}
    return [row_to_span(row | {k: v[i] for k, v in lists.items()}, i) for i, row in enumerate(rows)]


def row_to_span(row: dict[str, Any], index: int = 0) -> Span:
    """One row of the ``spans`` table (token columns as lists or NumPy arrays) as a validated ``Span``: the
    inverse of :func:`spans_to_arrow`, for rows arriving (``table_to_spans``) and rows read back alike."""
    for name in JSON_SPAN_COLUMNS:
        try:
            row[name] = loads(row[name])
        except ValueError:
            raise InvalidSpanError(f"span #{index} ({row['span_id']}): `{name}` is not valid JSON; nothing of "
                                   "this batch was stored") from None
    span: dict[str, Any] = {k: row[k] for k in ("rollout_id", "attempt_id", "sequence_id", "span_id",
                                                "parent_id", "name", "kind", "start_time", "end_time", "status")}
    span["attributes"] = row["attributes"] or {}
    llm = {k: row[k] for k in _LLM_COLUMNS}
    if row["kind"] == "llm_call" or any(v is not None for v in llm.values()):
        usage = [row[k] for k in ("prompt_tokens", "completion_tokens", "total_tokens")]
        span["llm"] = {k: v for k, v in llm.items() if v is not None and k != "prompt_tokens"}
        span["llm"]["model"] = row["model"]
        if any(u is not None for u in usage):
            span["llm"]["usage"] = dict(zip(("prompt_tokens", "completion_tokens", "total_tokens"), usage,
                                            strict=True))
    if row["kind"] == "reward" or row["reward_value"] is not None or row["reward_call_span_id"] is not None:
        span["reward"] = {"name": row["reward_name"] or "reward", "value": row["reward_value"],
                          "call_span_id": row["reward_call_span_id"]}
    return as_model(Span, span, index)


def _row_arrays(col: pa.ChunkedArray) -> list[np.ndarray | None]:
    """Each row of a list column as a NumPy view of its values (None for a null row)."""
    arr = col.combine_chunks()
    if arr.null_count == len(arr):
        return [None] * len(arr)
    offsets, values = np.asarray(arr.offsets), np.asarray(arr.values)
    valid = np.asarray(arr.is_valid())
    return [values[offsets[i]:offsets[i + 1]] if valid[i] else None for i in range(len(arr))]


def spans_to_arrow(spans: Sequence[Span]) -> pa.Table:
    """Validated spans as one Arrow table with the span schema (the token IDs copied once)."""
    llms = [s.llm for s in spans]
    usages = [x.usage if x else None for x in llms]
    rewards = [s.reward for s in spans]
    columns: dict[str, list[Any]] = {
        "span_id": [s.span_id for s in spans], "rollout_id": [s.rollout_id for s in spans],
        "attempt_id": [s.attempt_id for s in spans], "sequence_id": [s.sequence_id for s in spans],
        "parent_id": [s.parent_id for s in spans], "name": [s.name for s in spans], "kind": [s.kind for s in spans],
        "start_time": [s.start_time for s in spans], "end_time": [s.end_time for s in spans],
        "status": [s.status for s in spans], "attributes": [s.attributes or None for s in spans],
        "model": _of(llms, "model"), "request_messages": [x.request_messages or None if x else None for x in llms],
        "request_tools": _of(llms, "request_tools"), "response_message": _of(llms, "response_message"),
        "finish_reason": _of(llms, "finish_reason"), "prompt_tokens": _of(usages, "prompt_tokens"),
        "completion_tokens": _of(usages, "completion_tokens"), "total_tokens": _of(usages, "total_tokens"),
        "reward_name": _of(rewards, "name"), "reward_value": _of(rewards, "value"),
        "reward_call_span_id": _of(rewards, "call_span_id"),
    }
    for name in JSON_SPAN_COLUMNS:
        columns[name] = [_json(spans, i, name, v) for i, v in enumerate(columns[name])]
    arrays = []
    for field in SPAN_ARROW_SCHEMA:
        if field.name in _LIST_TYPES:
            arrays.append(list_column(_of(llms, field.name), _LIST_TYPES[field.name], field.type))
        elif all(v is None for v in columns[field.name]):
            arrays.append(pa.nulls(len(spans), field.type))
        else:
            arrays.append(pa.array(columns[field.name], type=field.type))
    return pa.Table.from_arrays(arrays, schema=SPAN_ARROW_SCHEMA)


def _of(items: list[Any], attr: str) -> list[Any]:
    return [None if x is None else getattr(x, attr) for x in items]


def _json(spans: Sequence[Span], i: int, name: str, value: Any) -> str | None:
    """JSON text of a JSON column; NaN and Infinity are not JSON (DuckDB would refuse the whole batch)."""
    try:
        text = dumps(value, allow_nan=False)
        if text is not None:
            text.encode()  # lone surrogates: not UTF-8, which Arrow and DuckDB need
        return text
    except (ValueError, UnicodeEncodeError) as exc:
        raise InvalidSpanError(f"span #{i} ({spans[i].span_id}): `{name}` is not valid JSON ({exc}); "
                               "nothing of this batch was stored") from None


def batches_to_spans(reader: Iterator[pa.RecordBatch]) -> Iterator[Span]:
    for batch in reader:
        for row in batch.to_pylist():
            yield row_to_span(row)
