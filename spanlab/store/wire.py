"""Arrow IPC on the wire: how span batches travel between store clients and the store server.

JSON would turn every token ID into text and back (~100 ns each in Python); an Arrow IPC stream is the
columns' own bytes, so a 2,500-token span costs a memcpy on each side.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pyarrow.ipc as ipc

from spanlab.errors import InvalidSpanError

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
