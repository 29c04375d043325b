"""What travels between ``StoreClient`` and the store server: strict request and response bodies, and span
batches as Arrow IPC, because JSON would turn every token ID into text and back, while an Arrow IPC stream
is the columns' own bytes.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.ipc as ipc
from pydantic import AliasChoices, BaseModel, ConfigDict, Field

from spanlab.errors import InvalidSpanError
from spanlab.types import MAX_INT32, Attempt, FinishedAttemptStatus, ResourceKind, Rollout, RolloutMode, Span

ARROW_STREAM = "application/vnd.apache.arrow.stream"
_END_OF_STREAM = b"\xff\xff\xff\xff\x00\x00\x00\x00"  # continuation marker, then a 0-byte message


def table_to_bytes(tbl: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with ipc.new_stream(sink, tbl.schema) as writer:
        writer.write_table(tbl)
    return sink.getvalue().to_pybytes()


def bytes_to_table(data: bytes) -> pa.Table:
    try:
        return ipc.open_stream(pa.py_buffer(data)).read_all()
    except (pa.ArrowInvalid, pa.ArrowTypeError, OSError) as exc:
        raise InvalidSpanError(f"the body is not a valid Arrow IPC stream: {exc}") from exc


def reader_to_chunks(reader: pa.RecordBatchReader) -> Iterator[bytes]:
    """An Arrow IPC stream, one HTTP chunk per record batch, so big reads never sit whole in memory: the
    stream format is the schema's message, each batch's message, then the end-of-stream marker."""
    yield reader.schema.serialize().to_pybytes()
    for batch in reader:
        yield batch.serialize().to_pybytes()
    yield _END_OF_STREAM


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DequeueRequest(_Strict):
    worker_id: str | None = None
    mode: RolloutMode | None = None


class DequeueResponse(_Strict):
    rollout: Rollout
    attempt: Attempt


class FinishRequest(_Strict):
    status: FinishedAttemptStatus
    spans: list[Span] = Field(default_factory=list, description="the attempt's last spans, stored with the finish")


class ResourceRequest(_Strict):
    name: str = Field(min_length=1)
    payload: dict[str, Any] = Field(default_factory=dict)
    kind: ResourceKind = "other"


class SqlRequest(_Strict):
    # `sql` is what people try first (`spanlab sql`); `query` is the name the API documents
    query: str = Field(min_length=1, max_length=100_000, validation_alias=AliasChoices("query", "sql"))
    max_rows: int = Field(default=10_000, ge=1, le=1_000_000)


class LastAttemptsRequest(_Strict):
    rollout_ids: list[str]


class SummariesRequest(_Strict):
    rollout_ids: list[str] | None = None
    statuses: list[str] | None = None
    metadata: dict[str, str] | None = None


class MetricsRequest(_Strict):
    run_id: str = Field(min_length=1)
    algorithm: str
    step: int = Field(ge=0, le=MAX_INT32)
    metrics: dict[str, float | None]


class InsertedResponse(_Strict):
    inserted: int
    span_ids: list[str]
