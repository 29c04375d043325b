"""The rules for span batches that arrive as Arrow (the store server's wire path, bulk producers).

Typed ``Span`` objects are checked by pydantic (``spanlab/types.py``, the one place the span rules are
written for Python callers). An Arrow batch never becomes Python objects (that is what keeps token-heavy
ingest fast), so the same rules are checked here column by column: token IDs are non-negative int32,
logprobs match the response length and are finite, the loss mask is 0/1 over prompt+response, kinds and
statuses are known, an ``llm_call`` names its model and a ``reward`` its value. Errors name the row and
its span_id; nothing of the batch is stored.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import get_args

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spanlab.errors import InvalidSpanError
from spanlab.store.schema import JSON_SPAN_COLUMNS, SPAN_ARROW_SCHEMA
from spanlab.types import SpanKind, SpanStatus

_REQUIRED = ("span_id", "name", "kind", "start_time", "status")


def conform(tbl: pa.Table) -> pa.Table:
    """Reorder and cast ``tbl`` to the span schema; absent optional columns become nulls."""
    if tbl.schema.equals(SPAN_ARROW_SCHEMA):  # what spans_to_arrow and StoreClient send: nothing to do
        return tbl
    names = set(tbl.column_names)
    unknown = names - set(SPAN_ARROW_SCHEMA.names)
    if unknown:
        raise InvalidSpanError(f"unknown span columns {sorted(unknown)}; nothing stored")
    missing = [c for c in _REQUIRED if c not in names]
    if missing:
        raise InvalidSpanError(f"span batch lacks required columns {missing}; nothing stored")
    arrays = []
    for field in SPAN_ARROW_SCHEMA:
        if field.name not in names:
            arrays.append(pa.nulls(tbl.num_rows, field.type))
            continue
        col = tbl[field.name]
        try:
            arrays.append(col.cast(field.type) if col.type != field.type else col)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise InvalidSpanError(
                f"span column `{field.name}` has type {col.type}, expected {field.type}: {exc}; nothing stored"
            ) from exc
    return pa.Table.from_arrays(arrays, schema=SPAN_ARROW_SCHEMA)


def checked_span_table(tbl: pa.Table) -> pa.Table:
    """``tbl`` conformed to the span schema, with every rule of :func:`validate_span_table` checked."""
    tbl = conform(tbl)
    validate_span_table(tbl)
    return tbl


def _fail_at(tbl: pa.Table, bad: pa.Array | pa.ChunkedArray, message: str) -> None:
    """Raise for the first row where ``bad`` is true (nulls count as not bad)."""
    bad = pc.fill_null(bad, False)
    if pc.any(bad).as_py():
        i = pc.index(bad, True).as_py()
        span_id = tbl["span_id"][i].as_py()
        raise InvalidSpanError(f"span #{i} ({span_id}): {message}; nothing of this batch was stored")


def _list_lengths(col: pa.ChunkedArray) -> pa.ChunkedArray:
    return pc.fill_null(pc.list_value_length(col), 0)


_ELEMENT_RULES: tuple[tuple[str, Callable[[np.ndarray], np.ndarray], str], ...] = (
    ("prompt_token_ids", lambda v: v < 0, "token IDs must be >= 0"),
    ("response_token_ids", lambda v: v < 0, "token IDs must be >= 0"),
    ("loss_mask", lambda v: v > 1, "loss_mask values must be 0 or 1"),
    ("response_logprobs", lambda v: np.isnan(v) | (v == np.inf), "response_logprobs must be finite (or -inf)"),
)


def validate_span_table(tbl: pa.Table) -> None:
    """All span rules, column by column; ``tbl`` must already be :func:`conform`-ed. Raises naming the first
    bad row."""
    for name in _REQUIRED:
        _fail_at(tbl, pc.is_null(tbl[name]), f"`{name}` is missing")
    _fail_at(tbl, pc.equal(pc.binary_length(tbl["span_id"]), 0), "`span_id` is empty")
    kinds, statuses = pa.array(get_args(SpanKind)), pa.array(get_args(SpanStatus))
    _fail_at(tbl, pc.invert(pc.is_in(tbl["kind"], value_set=kinds)), f"`kind` must be one of {kinds.to_pylist()}")
    _fail_at(
        tbl, pc.invert(pc.is_in(tbl["status"], value_set=statuses)), f"`status` must be one of {statuses.to_pylist()}"
    )
    _fail_at(
        tbl,
        pc.not_equal(pc.is_null(tbl["rollout_id"]), pc.is_null(tbl["attempt_id"])),
        "rollout_id and attempt_id must both be set or both be None",
    )
    _fail_at(tbl, pc.less(tbl["sequence_id"], 0), "`sequence_id` must be >= 0")
    is_llm, is_reward = pc.equal(tbl["kind"], "llm_call"), pc.equal(tbl["kind"], "reward")
    _fail_at(tbl, pc.and_(is_llm, pc.is_null(tbl["model"])), "an llm_call span needs its `model`")
    _fail_at(tbl, pc.and_(pc.invert(is_llm), pc.is_valid(tbl["model"])), "only llm_call spans carry LLM fields")
    _fail_at(tbl, pc.and_(is_reward, pc.is_null(tbl["reward_value"])), "a reward span needs its `reward` value")
    _fail_at(tbl, pc.and_(pc.invert(is_reward), pc.is_valid(tbl["reward_value"])), "only reward spans carry a reward")
    _fail_at(tbl, pc.invert(pc.is_finite(tbl["reward_value"])), "reward value must be finite")
    for rule in _ELEMENT_RULES[:2]:
        _check_values(tbl, *rule)
    n_resp = _list_lengths(tbl["response_token_ids"])
    n_all = pc.add(_list_lengths(tbl["prompt_token_ids"]), n_resp)
    lp = tbl["response_logprobs"]
    _fail_at(
        tbl,
        pc.and_(pc.is_valid(lp), pc.not_equal(pc.list_value_length(lp), n_resp)),
        "response_logprobs must have one entry per response token",
    )
    mask = tbl["loss_mask"]
    _fail_at(
        tbl,
        pc.and_(pc.is_valid(mask), pc.not_equal(pc.list_value_length(mask), n_all)),
        "loss_mask must have one entry per prompt+response token",
    )
    for rule in _ELEMENT_RULES[2:]:
        _check_values(tbl, *rule)
    for name in JSON_SPAN_COLUMNS:  # DuckDB would refuse the whole batch without naming the span
        for i, text in enumerate(tbl[name].to_pylist() if tbl[name].null_count < tbl.num_rows else ()):
            try:
                json.loads(text) if text is not None else None
            except ValueError:
                _fail_at(tbl, pa.array([j == i for j in range(tbl.num_rows)]), f"`{name}` is not valid JSON")


def _check_values(tbl: pa.Table, col: str, is_bad: Callable[[np.ndarray], np.ndarray], message: str) -> None:
    """Find the row of the first bad element of list column ``col`` with NumPy (no per-row Python)."""
    column = tbl[col].combine_chunks()
    values = np.asarray(pc.list_flatten(column))
    if not len(values):
        return
    bad = is_bad(values)
    if bad.any():
        row = pc.list_parent_indices(column)[int(np.argmax(bad))].as_py()
        raise InvalidSpanError(
            f"span #{row} ({tbl['span_id'][row].as_py()}): {message}; nothing of this batch was stored"
        )

