"""What travels between ``StoreClient`` and the store server: strict request and response bodies, and span
batches as Arrow IPC, because JSON would turn every token ID into text and back, while an Arrow IPC stream
is the columns' own bytes.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.ipc as ipc
from pydantic import AliasChoices, BaseModel, ConfigDict, Field

from spanlab.errors import InvalidSpanError
from spanlab.types import MAX_INT32, Attempt, FinishedAttemptStatus, ResourceKind, Rollout, RolloutMode, Span

ARROW_STREAM = "application/vnd.apache.arrow.stream"
SQL_COLUMNS_HEADER = "x-spanlab-columns"  # /sql: the result's column names (JSON), so an empty result keeps them
_END_OF_STREAM = b"\xff\xff\xff\xff\x00\x00\x00\x00"  # continuation marker, then a 0-byte message


def table_to_bytes(tbl: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with ipc.new_stream(sink, tbl.schema) as writer:
        writer.write_table(tbl)
    return sink.getvalue().to_pybytes()


def bytes_to_table(data: bytes, max_bytes: int) -> pa.Table:
    """The table of an Arrow IPC stream, read batch by batch; a stream whose batches would unpack (decompress)
    to more than ``max_bytes`` is refused before the batch that passes it is unpacked: a few KB of zstd can
    hold gigabytes of zeros, and the body limit counts only the bytes sent. The server passes its body limit
    (``--max-body-mb``), so a compressed batch may unpack to no more than the same batch could be sent as."""
    try:
        reader = ipc.MessageReader.open_stream(pa.py_buffer(data))
        schema = ipc.read_schema(reader.read_next_message())
        batches, unpacked = [], 0
        for message in reader:
            if message.type != "record batch":
                raise InvalidSpanError(f"the Arrow stream holds a {message.type} message; send plain record batches")
            unpacked += _unpacked_size(message)
            if unpacked > max_bytes:
                raise InvalidSpanError(f"the Arrow stream unpacks to more than {max_bytes} bytes (compressed "
                                       f"batches count as decompressed); send smaller batches")
            batches.append(ipc.read_record_batch(message, schema))
        return pa.Table.from_batches(batches, schema)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OSError, IndexError, ValueError, StopIteration, struct.error) as exc:
        if isinstance(exc, InvalidSpanError):
            raise
        raise InvalidSpanError(f"the body is not a valid Arrow IPC stream: {exc}") from exc


def _unpacked_size(message: ipc.Message) -> int:
    """A record batch's body size once decompressed, read from the message's own metadata (a flatbuffer:
    ``Message.header`` -> ``RecordBatch.buffers`` and ``.compression``) and the 8-byte uncompressed length that
    begins each compressed buffer (Arrow IPC format), without decompressing anything."""
    meta, body = message.metadata.to_pybytes(), message.body
    batch = _field_table(meta, _root(meta), 2)  # Message.header: the RecordBatch table
    if batch is None or _field(meta, batch, 3) is None:  # RecordBatch.compression unset: the body as sent
        return body.size
    buffers = _field(meta, batch, 2)  # RecordBatch.buffers: [Buffer {offset: int64, length: int64}]
    if buffers is None:
        return 0
    vector = buffers + _u32(meta, buffers)
    total = 0
    for i in range(_u32(meta, vector)):
        offset, length = struct.unpack_from("<qq", meta, vector + 4 + 16 * i)
        if length >= 8:
            (size,) = struct.unpack_from("<q", body, offset)
            total += length - 8 if size == -1 else size
    return total


def _u32(buf: bytes, at: int) -> int:
    return struct.unpack_from("<I", buf, at)[0]


def _root(buf: bytes) -> int:
    return _u32(buf, 0)


def _field(buf: bytes, table: int, index: int) -> int | None:
    """Where field ``index`` of the flatbuffer table at ``table`` is stored (None: not set)."""
    vtable = table - struct.unpack_from("<i", buf, table)[0]
    entry = 4 + 2 * index
    if entry >= struct.unpack_from("<H", buf, vtable)[0]:
        return None
    offset = struct.unpack_from("<H", buf, vtable + entry)[0]
    return table + offset if offset else None


def _field_table(buf: bytes, table: int, index: int) -> int | None:
    at = _field(buf, table, index)
    return None if at is None else at + _u32(buf, at)


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
