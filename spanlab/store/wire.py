"""Arrow IPC on the wire: how span batches travel between store clients and the store server.

JSON would turn every token ID into text and back (~100 ns each in Python); an Arrow IPC stream is the
columns' own bytes, so a 2,500-token span costs a memcpy on each side.
"""

from __future__ import annotations

import io
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.ipc as ipc

from spanlab.errors import InvalidSpanError

ARROW_STREAM = "application/vnd.apache.arrow.stream"


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
    """An Arrow IPC stream, one HTTP chunk per record batch, so big reads never sit whole in memory."""
    buf = io.BytesIO()
    writer = ipc.new_stream(buf, reader.schema)

    def drain() -> bytes:
        data = buf.getvalue()
        buf.seek(0)
        buf.truncate()
        return data

    if first := drain():
        yield first
    for batch in reader:
        writer.write_batch(batch)
        yield drain()
    writer.close()
    if last := drain():
        yield last


def open_chunked_stream(chunks: Iterator[bytes]) -> pa.RecordBatchReader:
    """A reader over an Arrow IPC stream arriving in chunks (the client side of reader_to_chunks).

    Buffered because a raw reader returns at most one chunk per read, and pyarrow takes a short read of a
    message body as a truncated stream: a record batch bigger than one HTTP chunk would fail to read.
    """
    return ipc.open_stream(io.BufferedReader(_ChunkReader(chunks)))


class _ChunkReader(io.RawIOBase):
    """A read-only file over an iterator of byte chunks (what pyarrow's stream reader wants)."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._pending = b""

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:  # type: ignore[override]
        while not self._pending:
            try:
                self._pending = next(self._chunks)
            except StopIteration:
                return 0
        n = min(len(b), len(self._pending))
        b[:n] = self._pending[:n]
        self._pending = self._pending[n:]
        return n
