"""The span journal: small span batches durable in a millisecond or two, inserted into DuckDB in groups.

A DuckDB insert has a fixed cost of ~5-15 ms on a small machine however few rows it carries, and a small
batch goes through DuckDB's WAL before the file. A runner that finishes each rollout with its spans, or a
gateway writing a call at a time, paid that on every call. Instead, a small batch (under
:data:`RECORD_MAX_BYTES`, ~400 spans of 2,500 token IDs) is appended to the store's journal ``<db>.journal``
(one framed record: length, CRC-32, then an Arrow IPC stream, or for typed ``Span`` objects their columns,
:mod:`spanlab.store.span_columns`; the queue's changes share the file, see :mod:`spanlab.store.journal_file`)
and fsync'd before the call returns: as durable as a commit, well under a millisecond for a rollout's 10 spans
of 2,500 token IDs. The batches stay in memory as they came (typed spans' columns become Arrow, all at once,
when a read or an insert needs them), and the store
inserts them into the ``spans`` table as one batch: once they reach a row group (2,048 rows, which DuckDB
writes straight into the file) or :data:`FLUSH_BYTES`, ``span_flush_s`` after the oldest (the store's
background writer, :mod:`spanlab.store.flusher`, sees to that when no call does), before SQL reads the
tables, and on close. Reading spans (``spans_reader``) sees the table and the buffered batches
together, so a trainer that reads a step's spans right after they were written waits for no insert.

After a crash the next open inserts what the journal holds, skipping span IDs already in the table (a
crash between an insert's commit and the emptying of the journal); see :mod:`spanlab.store.journal_file`.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence

import pyarrow as pa

from spanlab.errors import InvalidSpanError
from spanlab.store.append_file import AppendFile
from spanlab.store.connection import ROW_GROUP_SIZE
from spanlab.store.schema import JSON_SPAN_COLUMNS, SPAN_ARROW_SCHEMA
from spanlab.store.span_columns import RECORD_TAG, SpanBatch, SpanColumns, column, columns_to_arrow

logger = logging.getLogger(__name__)

FLUSH_ROWS = ROW_GROUP_SIZE  # a DuckDB row group of the store: inserted straight into the file
FLUSH_BYTES = 64 * 1024 * 1024  # bounds the memory buffered spans take, whatever their size
# Bigger batches go straight to the table: journaling costs ~0.05 ms per 2,500-ID span (copy, CRC, write,
# fsync) on top of the insert it defers, while what it saves is the insert's fixed ~5-15 ms per batch.
RECORD_MAX_BYTES = 4 * 1024 * 1024


class SpanJournal:
    """Span batches acknowledged but not in the table yet: in memory and, for a file store, in the journal
    file (which the store empties once everything in it is in the tables)."""

    def __init__(self, file: AppendFile) -> None:
        self.path = file.path
        self.tables: list[SpanBatch] = []  # Arrow tables, and typed spans' columns not converted yet
        self.rows = 0
        self.nbytes = 0
        self.unattributed_ids: set[str] = set()  # the dedupe of spans of no attempt asks the table and these
        self.since: float | None = None  # monotonic time of the oldest buffered batch
        self._joined: pa.Table | None = None
        self._sized: tuple[SpanBatch, int] | None = None  # the last batch asked about, and its size
        self.file = file

    def takes(self, batch: SpanBatch) -> bool:
        """Whether ``batch`` is small enough to wait here at all (else it goes straight to the table)."""
        return batch.num_rows < FLUSH_ROWS and self._size(batch) <= RECORD_MAX_BYTES

    def fits(self, batch: SpanBatch) -> bool:
        """Whether ``batch`` fits next to what waits, short of a row group (and of :data:`FLUSH_BYTES`)."""
        return self.rows + batch.num_rows < FLUSH_ROWS and self.nbytes + self._size(batch) < FLUSH_BYTES

    def _size(self, batch: SpanBatch) -> int:
        """The size of ``batch`` (:func:`_size` of a table, :attr:`SpanColumns.nbytes`), once per batch: a write
        asks three times (~50 us each for a table here)."""
        if self._sized is None or self._sized[0] is not batch:
            self._sized = (batch, batch.nbytes if isinstance(batch, SpanColumns) else _size(batch))
        return self._sized[1]

    def due(self, interval_s: float) -> bool:
        return self.since is not None and time.monotonic() - self.since >= interval_s

    def append(self, batch: SpanBatch, before: Sequence[bytes | memoryview] = ()) -> None:
        """Make ``batch`` durable (on return) and pending for the table. An Arrow ``batch`` has the span schema.

        ``before``: records written ahead of it in the same fsync'd append (a finish's queue change)."""
        if isinstance(batch, SpanColumns):  # its JSON text comes from json.dumps; record() checks UTF-8
            body = batch.record()
        else:
            check_insertable(batch)
            body = _ipc_stream(batch) if self.path is not None else b""
        if self.path is not None:
            self.file.append(*before, body)
        self.tables.append(batch)
        self.rows += batch.num_rows
        self.nbytes += self._size(batch)
        attempt_ids = column(batch, "attempt_id")
        if None in attempt_ids:
            self.unattributed_ids.update(s for s, a in zip(column(batch, "span_id"), attempt_ids, strict=True)
                                         if a is None)
        self.since = self.since if self.since is not None else time.monotonic()
        self._joined = None

    def table(self) -> pa.Table | None:
        """Every buffered span as one table (kept until the next append), or None."""
        if not self.tables:
            return None
        if self._joined is None:
            columns = [b for b in self.tables if isinstance(b, SpanColumns)]
            if columns:  # converted once, all together; kept converted
                self.tables = [b for b in self.tables if not isinstance(b, SpanColumns)] + [columns_to_arrow(columns)]
            self._joined = pa.concat_tables(self.tables) if len(self.tables) > 1 else self.tables[0]
        return self._joined

    def clear(self) -> None:
        """Forget the buffered batches: call only once they are committed to the table."""
        self.tables, self.rows, self.nbytes, self.since, self._joined, self._sized = [], 0, 0, None, None, None
        self.unattributed_ids = set()


def decode_spans(bodies: list[bytes]) -> pa.Table:
    """The span batches of journal records (Arrow IPC streams, and :class:`SpanColumns` records) as one table
    of the span schema."""
    columns = [SpanColumns.from_record(body) for body in bodies if body[:1] == RECORD_TAG]
    tables = [columns_to_arrow(columns)] if columns else []
    streams = [pa.ipc.open_stream(pa.BufferReader(body)) for body in bodies if body[:1] != RECORD_TAG]
    batches = [batch for stream in streams for batch in stream]
    if batches:
        tables.append(pa.Table.from_batches(batches).cast(SPAN_ARROW_SCHEMA))
    return pa.concat_tables(tables) if tables else SPAN_ARROW_SCHEMA.empty_table()


def _ipc_stream(tbl: pa.Table) -> pa.Buffer:
    """A span batch as a journal record's body: an Arrow IPC stream."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, SPAN_ARROW_SCHEMA) as writer:
        writer.write_table(tbl)
    return sink.getvalue()


def check_insertable(tbl: pa.Table) -> None:
    """What DuckDB would refuse at the insert: a buffered batch is acknowledged before that insert runs, so
    it must never fail there. JSON columns must parse (NaN and Infinity are not JSON) and strings be UTF-8."""
    try:
        tbl.validate(full=True)
    except pa.ArrowInvalid as exc:
        raise InvalidSpanError(f"span batch is malformed ({exc}); nothing of this batch was stored") from exc
    for col in JSON_SPAN_COLUMNS:
        for i, text in enumerate(tbl[col].to_pylist()):
            if text is None:
                continue
            try:
                json.loads(text, parse_constant=_no_constant)
            except ValueError as exc:
                span_id = tbl["span_id"][i].as_py()
                raise InvalidSpanError(
                    f"span #{i} ({span_id}): `{col}` is not valid JSON ({exc}); nothing of this batch was stored"
                ) from None


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not JSON")


def _size(tbl: pa.Table) -> int:
    """Bytes of the buffers ``tbl`` holds: an upper bound for slices, where ``nbytes`` is exact but walks
    every column's offsets (~20x slower here)."""
    return tbl.get_total_buffer_size()
