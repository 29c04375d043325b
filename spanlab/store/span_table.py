"""The spans table of a store: checked ingest, the span journal in front of it, and reads of both.

Every span batch passes the same gate whatever its door (typed ``Span`` objects, Arrow from the store
server or a bulk producer): :func:`~spanlab.store.validate.validate_span_table`, the limits of
:func:`~spanlab.store.ingest.check_batch`, and the per-attempt dedupe of the :class:`AttemptIndex`. A batch
smaller than a row group then waits in the span journal (:mod:`spanlab.store.span_journal`); a bigger
one is inserted at once. :class:`~spanlab.store.duckdb_store.SpanStore` adds the rollout queue on top.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from spanlab.errors import InvalidSpanError, StoreError
from spanlab.store.append_file import AppendFile
from spanlab.store.connection import MEMORY
from spanlab.store.database import Database, as_model
from spanlab.store.ingest import AttemptIndex, check_batch
from spanlab.store.journal_file import SUFFIX, Leftovers, read_leftovers
from spanlab.store.schema import SPAN_COLUMNS
from spanlab.store.span_columns import SpanBatch, SpanColumns, as_table, column
from spanlab.store.span_journal import SpanJournal
from spanlab.store.span_reads import read_spans
from spanlab.store.validate import checked_span_table
from spanlab.types import Span

logger = logging.getLogger(__name__)

DEFAULT_MAX_TOKENS_PER_SPAN = 1_048_576
DEFAULT_MAX_JSON_BYTES = 16 * 1024 * 1024
MAX_ROLLOUTS_NOT_IN_TABLE = 100_000  # bounds the set below: forgetting one only costs a read its shortcut


class SpanTable(Database):
    """The ``spans`` table and the span journal in front of it; a leftover journal is inserted on open."""

    def __init__(
        self,
        path: str | Path = MEMORY,
        *,
        max_tokens_per_span: int = DEFAULT_MAX_TOKENS_PER_SPAN,
        max_json_bytes: int = DEFAULT_MAX_JSON_BYTES,
        span_flush_s: float = 1.0,
        compress: bool = True,
    ) -> None:
        super().__init__(path, compress=compress)
        self.max_tokens_per_span = max_tokens_per_span
        self.max_json_bytes = max_json_bytes
        self._span_flush_s = span_flush_s
        self._span_index = AttemptIndex()
        # Rollouts the spans table has no row of: their first attempt opened in this session, and none of their
        # spans inserted since. A read of them whose spans all wait in the journal then skips asking DuckDB
        # (~2.5 ms: a step's read-back right after its rollouts ended). Insertion order: oldest first.
        self._rollouts_not_in_table: dict[str, None] = {}
        try:
            self._replay_leftovers()
            self._journal_file = AppendFile(None if self.path == MEMORY else Path(self.path + SUFFIX))
        except BaseException:
            self._conn.close()
            raise
        self._spans = SpanJournal(self._journal_file)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            written = False
            try:
                self._flush_spans()
                written = True
            finally:
                self._journal_file.close(remove=written)  # kept, and replayed on the next open, if not written
                super().close()

    def _before_read(self) -> None:
        self._flush_spans()

    def _replay_leftovers(self) -> None:
        """Write what the journal files of the last run hold to the tables (see :mod:`.journal_file`)."""
        if self.path == MEMORY:
            return
        left = read_leftovers(self.path)
        if left.spans is not None and left.spans.num_rows:
            with self._registered("_journal_spans", left.spans), self._transaction() as cur:
                (n,) = cur.execute(
                    "INSERT INTO spans SELECT * FROM _journal_spans j WHERE NOT EXISTS (SELECT 1 FROM spans s "
                    "WHERE s.span_id = j.span_id AND s.attempt_id IS NOT DISTINCT FROM j.attempt_id)"
                ).fetchall()[0]
            logger.info("journal of %s: inserted %d spans left by the last run", self.path, n)
        self._replay_queue(left)
        for path in left.files:
            if path in left.unreadable:
                kept = path.with_name(f"{path.name}.unreadable-{int(time.time())}")
                path.rename(kept)
                logger.error("journal %s has an unreadable record before its end: kept as %s; what came before "
                             "it was written to the tables", path, kept)
            else:
                path.unlink()

    def _replay_queue(self, left: Leftovers) -> None:
        """Hook: write the queue changes of a leftover journal (:class:`SpanStore` has the queue)."""
        if left.entries or left.new_rollouts:
            raise StoreError(f"{self.path}: the journal holds queue changes and this store has no queue")

    def add_spans(self, spans: Sequence[Span]) -> int:
        spans = [as_model(Span, s, i) for i, s in enumerate(spans)]
        # pydantic already enforced every span rule, so the batch skips the column-wise checks; it stays
        # columns until something needs Arrow (see spanlab.store.span_columns)
        return len(self.ingest(SpanColumns.of(spans), validated=True)) if spans else 0

    def add_span_table(self, tbl: pa.Table) -> int:
        """Store a batch given as an Arrow table with the ``spans`` columns (any subset of the optional ones).

        The bulk and wire path: no Python object per span. Checked by the same rules as ``add_spans``.
        """
        return len(self.ingest(tbl))

    def ingest(self, batch: SpanBatch, *, validated: bool = False) -> list[str]:
        """``add_span_table`` that returns the span_ids it stored (the rest were already there).

        ``validated=True`` says ``batch`` already has the span schema and passed ``validate_span_table`` (a
        :class:`SpanColumns` always has: it is built from validated ``Span`` objects).
        """
        batch = self._checked(batch, validated)
        return self._store_fresh(batch) if batch.num_rows else []

    def _checked(self, batch: SpanBatch, validated: bool) -> SpanBatch:
        """Every check a span batch passes before anything of it is written."""
        if not validated:
            batch = checked_span_table(batch)
        if batch.num_rows:
            check_batch(batch, self.max_tokens_per_span, self.max_json_bytes)
        return batch

    def _store_fresh(self, batch: SpanBatch) -> list[str]:
        with self._lock:
            fresh = self._fresh_rows(batch)
            if fresh.num_rows == 0:
                return []
            self._insert_spans(fresh)
            self._span_index.mark_stored(fresh)
            self._maybe_flush_spans()
        return column(fresh, "span_id")

    def _fresh_rows(self, batch: SpanBatch) -> SpanBatch:
        """The rows of ``batch`` not stored yet (see ``AttemptIndex.new_rows``)."""
        if not self._span_index.knows(list(set(column(batch, "attempt_id")))):
            self._before_read()  # the index loads unknown attempts from the tables: they must be current
        return self._span_index.new_rows(self._conn, batch, self._spans.unattributed_ids)

    def _insert_spans(self, new_spans: SpanBatch, before: Sequence[bytes | memoryview] = ()) -> None:
        """Make new spans durable: a small batch in the span journal (inserted later with what waits there,
        as one batch), a big one straight into the table. ``before``: journal records that go into the same
        fsync'd append as the batch (only for a batch :meth:`_journals` says yes to)."""
        self._ensure_open()
        if not self._spans.takes(new_spans):
            assert not before, "records to journal with spans that go straight to the table"
            self._insert_into_table(as_table(new_spans))
            return
        if not self._spans.fits(new_spans):
            self._flush_spans()
        self._spans.append(new_spans, before)

    def _journals(self, batch: SpanBatch) -> bool:
        """Whether ``batch`` would wait in the journal file (so records can share its append)."""
        return self._journal_file.path is not None and self._spans.takes(batch)

    def _flush_spans(self) -> None:
        """Insert the waiting spans into the table, then empty the journal file."""
        with self._lock:
            self._insert_waiting_spans()
            self._journal_file.clear()

    def _insert_waiting_spans(self) -> None:
        """Insert the span journal's batches into the table as one batch, then forget them."""
        with self._lock:
            buffered = self._spans.table()
            if buffered is None:
                return
            try:
                self._insert_into_table(buffered)
            except InvalidSpanError as exc:  # checked before they were journaled, so this is not the caller's
                raise StoreError(f"span store {self.path}: DuckDB refused spans waiting in the span journal "
                                 f"({exc}); they stay in {self._spans.path or 'memory'}") from exc
            self._spans.clear()

    def _maybe_flush_spans(self) -> None:
        """The periodic flush after a write that already returned durable: a failure here loses nothing
        (the batches stay journaled) and surfaces at the next flush that must happen (a read, a full row
        group, close), so it is logged, not raised into the write that succeeded."""
        if self._spans.due(self._span_flush_s):
            try:
                self._flush_spans()
            except StoreError as exc:
                logger.error("span store %s: spans stay in the span journal for now: %s", self.path, exc)

    def _insert_into_table(self, new_spans: pa.Table) -> None:
        """One INSERT, atomic on its own. Columns go by position: ``SPAN_ARROW_SCHEMA`` follows the table's
        column order (a test checks it). ~1.5 ms cheaper per batch than register/INSERT/unregister."""
        self._ensure_open()
        if self._rollouts_not_in_table:  # before the insert: if it fails half-way, the table may have them
            for rollout_id in pc.unique(new_spans["rollout_id"]).to_pylist():
                self._rollouts_not_in_table.pop(rollout_id, None)
        try:
            self._conn.from_arrow(new_spans).insert_into("spans")
        except (duckdb.ConversionException, duckdb.ConstraintException) as exc:
            raise InvalidSpanError(f"rejected by DuckDB: {exc}; nothing of this batch was stored") from exc
        except duckdb.Error as exc:
            raise StoreError(f"span store {self.path}: {exc}") from exc

    def _note_rollout_not_in_table(self, rollout_id: str) -> None:
        """``rollout_id``'s first attempt was just opened: no span of it can be in the table (a span needs an
        attempt of its rollout)."""
        self._rollouts_not_in_table[rollout_id] = None
        if len(self._rollouts_not_in_table) > MAX_ROLLOUTS_NOT_IN_TABLE:
            del self._rollouts_not_in_table[next(iter(self._rollouts_not_in_table))]

    def query(self, sql: str, params: Sequence[Any] | None = None) -> pa.Table:
        self._rollouts_not_in_table.clear()  # any SQL may write spans
        return super().query(sql, params)

    def spans_reader(
        self,
        *,
        rollout_ids: Sequence[str] | None = None,
        attempt_ids: Sequence[str] | None = None,
        kinds: Sequence[str] | None = None,
        columns: Sequence[str] | None = None,
        batch_size: int = 1024,
    ) -> pa.RecordBatchReader:
        cols = list(columns) if columns else list(SPAN_COLUMNS)
        unknown = [c for c in cols if c not in SPAN_COLUMNS]
        if unknown:
            raise InvalidSpanError(f"unknown span columns {unknown}; known: {', '.join(SPAN_COLUMNS)}")
        lists = {"rollout_id": rollout_ids, "attempt_id": attempt_ids, "kind": kinds}
        with self._lock:  # the buffered batches and the table's snapshot are taken together
            table_may_have = rollout_ids is None or any(r not in self._rollouts_not_in_table for r in rollout_ids)
            try:
                return read_spans(self._cursor, self._spans.table(), lists, cols, batch_size, table_may_have)
            except duckdb.Error as exc:
                raise StoreError(f"cannot read spans: {exc}") from exc
