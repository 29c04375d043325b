"""Spans <-> Arrow record batches.

Ingest builds one Arrow table per batch of spans (DuckDB inserts it with one ``INSERT ... SELECT``,
~60x faster than ``executemany``). Read-back turns Arrow batches into typed ``Span`` objects only when
the caller asks for objects; training code should stay on the Arrow/NumPy path.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa

from spanlab.store.connection import loads as _loads
from spanlab.store.schema import JSON_SPAN_COLUMNS
from spanlab.store.span_columns import SpanColumns, columns_to_arrow, flatten, list_array
from spanlab.types import LLMCall, Reward, Span, Usage


def list_column(values: Sequence[Any], dtype: type, list_type: pa.DataType) -> pa.Array:
    """An Arrow list column from per-row lists/arrays (None = null): see :func:`flatten`."""
    return list_array(*flatten(values, dtype), list_type)


def spans_to_arrow(spans: Sequence[Span]) -> pa.Table:
    """Columnar copy of validated spans, ready for ``INSERT INTO spans SELECT * FROM tbl``."""
    return columns_to_arrow([SpanColumns.of(spans)])


def row_to_span(row: dict[str, Any]) -> Span:
    """One row of the ``spans`` table (as a Python dict) back into a typed ``Span``."""
    row = {k: (_loads(v) if k in JSON_SPAN_COLUMNS else v) for k, v in row.items()}
    llm = None
    if row["kind"] == "llm_call":
        usage = None
        if row.get("prompt_tokens") is not None:
            usage = Usage(
                prompt_tokens=row["prompt_tokens"],
                completion_tokens=row["completion_tokens"],
                total_tokens=row["total_tokens"],
            )
        llm = LLMCall.model_construct(
            model=row["model"],
            request_messages=row["request_messages"] or [],
            request_tools=row["request_tools"],
            response_message=row["response_message"],
            finish_reason=row["finish_reason"],
            prompt_token_ids=row["prompt_token_ids"] or [],
            response_token_ids=row["response_token_ids"] or [],
            response_logprobs=row["response_logprobs"],
            loss_mask=row["loss_mask"],
            usage=usage,
        )
    reward = None
    if row["kind"] == "reward":
        reward = Reward(name=row["reward_name"], value=row["reward_value"], call_span_id=row["reward_call_span_id"])
    # Rows were validated on write; model_construct skips re-validating thousands of token IDs.
    return Span.model_construct(
        rollout_id=row["rollout_id"],
        attempt_id=row["attempt_id"],
        sequence_id=row["sequence_id"],
        span_id=row["span_id"],
        parent_id=row["parent_id"],
        name=row["name"],
        kind=row["kind"],
        start_time=row["start_time"],
        end_time=row["end_time"],
        status=row["status"],
        attributes=row["attributes"] or {},
        llm=llm,
        reward=reward,
    )


def batches_to_spans(reader: Iterator[pa.RecordBatch]) -> Iterator[Span]:
    for batch in reader:
        for row in batch.to_pylist():
            yield row_to_span(row)
