"""A batch of typed spans as plain columns: journaled as they are, turned into Arrow only when needed.

Building the 26-column Arrow table of a rollout's 10 spans, and its IPC stream for the journal, cost ~1 ms per
call here (fixed costs per column and per array, and 100 KB of token IDs copied twice through cold caches):
half of a durable finish. A :class:`SpanColumns` is what that conversion starts from: the scalar columns as
Python lists and each token column as its rows' lengths plus one flat NumPy array (one copy of the IDs). It is
checked and deduplicated like an Arrow batch (the helpers below take either), journaled as one record (its
scalar columns as JSON, then the flat arrays' raw bytes: :meth:`SpanColumns.record`), and kept as it is. The
Arrow table is built when something needs it (a read of waiting spans, an insert into the table, a replay),
for all waiting batches at once (:func:`columns_to_arrow`), so the per-column costs are paid per flush, not
per call.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spanlab.errors import InvalidSpanError
from spanlab.store.connection import dumps
from spanlab.store.schema import SPAN_ARROW_SCHEMA
from spanlab.types import Span
from spanlab.vectors import to_numpy

LIST_COLUMNS: dict[str, type] = {
    "prompt_token_ids": np.int32,
    "response_token_ids": np.int32,
    "response_logprobs": np.float32,
    "loss_mask": np.uint8,
}
RECORD_TAG = b"C"  # a journal record of SpanColumns (an Arrow IPC stream starts with 0xFF, a queue change with {)
_META_LEN = struct.Struct("<I")


@dataclass
class SpanColumns:
    """Spans as columns. ``values``: each scalar column's values (JSON columns as JSON text). ``lengths``: each
    token column's row lengths (None: a null row). ``flats``: each token column's rows end to end."""

    values: dict[str, list[Any]]
    lengths: dict[str, list[int | None]]
    flats: dict[str, np.ndarray]

    @classmethod
    def of(cls, spans: Sequence[Span]) -> SpanColumns:
        """Columns of validated spans; the token IDs are copied here, so later changes to the spans do not
        reach what is stored."""
        llms = [s.llm for s in spans]
        usages = [llm.usage if llm else None for llm in llms]
        rewards = [s.reward for s in spans]
        values: dict[str, list[Any]] = {
            "span_id": [s.span_id for s in spans],
            "rollout_id": [s.rollout_id for s in spans],
            "attempt_id": [s.attempt_id for s in spans],
            "sequence_id": [s.sequence_id for s in spans],
            "parent_id": [s.parent_id for s in spans],
            "name": [s.name for s in spans],
            "kind": [s.kind for s in spans],
            "start_time": [s.start_time for s in spans],
            "end_time": [s.end_time for s in spans],
            "status": [s.status for s in spans],
            "attributes": _json_column(spans, "attributes", [s.attributes or None for s in spans]),
            "model": _of(llms, "model"),
            "request_messages": _json_column(spans, "request_messages",
                                             [x.request_messages or None if x else None for x in llms]),
            "request_tools": _json_column(spans, "request_tools", _of(llms, "request_tools")),
            "response_message": _json_column(spans, "response_message", _of(llms, "response_message")),
            "finish_reason": _of(llms, "finish_reason"),
            "prompt_tokens": _of(usages, "prompt_tokens"),
            "completion_tokens": _of(usages, "completion_tokens"),
            "total_tokens": _of(usages, "total_tokens"),
            "reward_name": _of(rewards, "name"),
            "reward_value": _of(rewards, "value"),
            "reward_call_span_id": _of(rewards, "call_span_id"),
        }
        lengths, flats = {}, {}
        for name, dtype in LIST_COLUMNS.items():
            lengths[name], flats[name] = flatten(_of(llms, name), dtype)
        return cls(values, lengths, flats)

    @property
    def num_rows(self) -> int:
        return len(self.values["span_id"])

    @property
    def nbytes(self) -> int:
        """About what the batch takes as Arrow: the token arrays, the strings, 8 bytes per other value."""
        strings = sum(len(v) for col in self.values.values() for v in col if isinstance(v, str))
        return sum(f.nbytes for f in self.flats.values()) + strings + 8 * len(self.values) * self.num_rows

    def take(self, rows: list[int]) -> SpanColumns:
        values = {k: [col[i] for i in rows] for k, col in self.values.items()}
        lengths, flats = {}, {}
        for name, col_lengths in self.lengths.items():
            ends = np.cumsum([n or 0 for n in col_lengths])
            flat = self.flats[name]
            lengths[name] = [col_lengths[i] for i in rows]
            parts = [flat[ends[i] - (col_lengths[i] or 0):ends[i]] for i in rows]
            flats[name] = np.concatenate(parts) if parts else flat[:0]
        return SpanColumns(values, lengths, flats)

    def record(self) -> list[bytes | memoryview]:
        """The journal record's body, in parts: tag, JSON of the scalar columns and the lengths, then the token
        columns' raw arrays in the machine's byte order (little-endian on every platform spanlab runs on)."""
        meta = json.dumps({"values": self.values, "lengths": self.lengths}, ensure_ascii=False)
        try:
            encoded = meta.encode()
        except UnicodeEncodeError:
            raise _not_utf8(self) from None
        return [RECORD_TAG + _META_LEN.pack(len(encoded)), encoded,
                *(memoryview(np.ascontiguousarray(self.flats[name]).view(np.uint8)) for name in LIST_COLUMNS)]

    @classmethod
    def from_record(cls, body: bytes) -> SpanColumns:
        (size,) = _META_LEN.unpack_from(body, 1)
        start = 1 + _META_LEN.size
        meta = json.loads(body[start:start + size])
        pos, flats = start + size, {}
        for name, dtype in LIST_COLUMNS.items():
            count = sum(n or 0 for n in meta["lengths"][name])
            flats[name] = np.frombuffer(body, dtype=dtype, count=count, offset=pos)
            pos += flats[name].nbytes
        return cls(meta["values"], meta["lengths"], flats)


def flatten(rows: Sequence[Any], dtype: type) -> tuple[list[int | None], np.ndarray]:
    """(each row's length, None for a null row; the rows end to end) of per-row lists or arrays.

    ``pa.array(list_of_lists)`` walks every Python int (~120 ns each); concatenating NumPy arrays is a memcpy,
    which is what keeps ingest of 2,500-token spans above 10,000 spans/s."""
    arrays = [None if r is None else to_numpy(r, dtype) for r in rows]
    present = [a for a in arrays if a is not None and len(a)]
    return [None if a is None else len(a) for a in arrays], (np.concatenate(present) if present else np.empty(0, dtype))


def _of(items: list[Any], attr: str) -> list[Any]:
    return [getattr(x, attr) if x is not None else None for x in items]


def _json_column(spans: Sequence[Span], name: str, values: list[Any]) -> list[str | None]:
    """JSON text of each value (None stays NULL). NaN and Infinity are not JSON: DuckDB would refuse them."""
    out: list[str | None] = []
    for i, value in enumerate(values):
        try:
            out.append(dumps(value, allow_nan=False))
        except ValueError as exc:
            raise InvalidSpanError(f"span #{i} ({spans[i].span_id}): `{name}` is not valid JSON ({exc}); "
                                   "nothing of this batch was stored") from None
    return out


def _not_utf8(batch: SpanColumns) -> InvalidSpanError:
    for name, col in batch.values.items():
        for i, value in enumerate(col):
            if isinstance(value, str):
                try:
                    value.encode()
                except UnicodeEncodeError as exc:
                    return InvalidSpanError(f"span #{i} ({batch.values['span_id'][i]!r}): `{name}` is not valid "
                                            f"UTF-8 ({exc}); nothing of this batch was stored")
    return InvalidSpanError("a span batch is not valid UTF-8; nothing of this batch was stored")


# --- either kind of batch: what ingest asks of a batch ----------------------------------------------------
SpanBatch = pa.Table | SpanColumns


def column(batch: SpanBatch, name: str) -> list[Any]:
    return batch.values[name] if isinstance(batch, SpanColumns) else batch[name].to_pylist()


def take_rows(batch: SpanBatch, rows: list[int]) -> SpanBatch:
    return batch.take(rows) if isinstance(batch, SpanColumns) else batch.take(pa.array(rows, pa.int64()))


def with_sequence_ids(batch: SpanBatch, seqs: list[int]) -> SpanBatch:
    if isinstance(batch, SpanColumns):
        return SpanColumns({**batch.values, "sequence_id": seqs}, batch.lengths, batch.flats)
    idx = batch.schema.get_field_index("sequence_id")
    return batch.set_column(idx, batch.schema.field(idx), pa.array(seqs, pa.int32()))


def token_counts(batch: SpanBatch) -> np.ndarray:
    """Prompt plus response token IDs per row."""
    if isinstance(batch, SpanColumns):
        return np.array([(p or 0) + (r or 0) for p, r in zip(batch.lengths["prompt_token_ids"],
                                                                batch.lengths["response_token_ids"], strict=True)],
                        dtype=np.int64)
    return list_lengths(batch["prompt_token_ids"]) + list_lengths(batch["response_token_ids"])


def byte_lengths(batch: SpanBatch, name: str) -> np.ndarray | None:
    """UTF-8 bytes of each value of a string column (-1 for NULL); None when every value is NULL."""
    if isinstance(batch, SpanColumns):
        col = batch.values[name]
        if all(v is None for v in col):
            return None
        return np.array([-1 if v is None else len(v.encode(errors="surrogatepass")) for v in col], dtype=np.int64)
    if batch[name].null_count == batch.num_rows:
        return None
    return pc.binary_length(batch[name]).fill_null(-1).to_numpy()


def list_lengths(col: pa.ChunkedArray) -> np.ndarray:
    """Each row's list length (0 for null) from the offsets: ~10 us, where compute calls cost ~0.1 ms."""
    parts = []
    for chunk in col.chunks:
        lengths = np.diff(np.asarray(chunk.offsets))
        if chunk.null_count:  # Arrow lets a null row's offsets span values: they are not its tokens
            lengths[np.asarray(chunk.is_null())] = 0
        parts.append(lengths)
    return np.concatenate(parts) if parts else np.zeros(0, np.int32)


def as_table(batch: SpanBatch) -> pa.Table:
    return columns_to_arrow([batch]) if isinstance(batch, SpanColumns) else batch


def columns_to_arrow(batches: Sequence[SpanColumns]) -> pa.Table:
    """One Arrow table (the span schema) of several batches: one conversion per column for all of them."""
    arrays = []
    for field in SPAN_ARROW_SCHEMA:
        if field.name in LIST_COLUMNS:
            lengths = [n for b in batches for n in b.lengths[field.name]]
            flats = [b.flats[field.name] for b in batches]
            flat = np.concatenate(flats) if flats else np.empty(0, LIST_COLUMNS[field.name])
            arrays.append(list_array(lengths, flat, field.type))
        else:
            arrays.append(scalar_array([v for b in batches for v in b.values[field.name]], field))
    return pa.Table.from_arrays(arrays, schema=SPAN_ARROW_SCHEMA)


def list_array(lengths: list[int | None], flat: np.ndarray, list_type: pa.DataType) -> pa.Array:
    """An Arrow list column from its rows' lengths (None: a null row) and their values end to end (``flat``
    already of the list's value type)."""
    n = len(lengths)
    if all(x is None for x in lengths):
        return pa.nulls(n, list_type)
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum([x or 0 for x in lengths], out=offsets[1:])
    mask = pa.array([x is None for x in lengths], type=pa.bool_()) if None in lengths else None
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat), type=list_type, mask=mask)


def scalar_array(values: list[Any], field: pa.Field) -> pa.Array:
    """A scalar column; an all-null one (most optional fields of most spans) without converting its values."""
    if all(v is None for v in values):
        return pa.nulls(len(values), field.type)
    return pa.array(values, type=field.type)

