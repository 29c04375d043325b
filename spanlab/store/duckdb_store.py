"""The DuckDB span store: rollout queue, spans with exact token IDs, versioned resources, training metrics.

One ``SpanStore`` owns one DuckDB file (DuckDB lets a single process write it) and its hot store (SQLite,
``hot.py``). Every write is checked here, in the caller's thread, then committed to the hot store by the
store's :class:`~spanlab.store.hot.Writer` before the call returns; it never waits for a copy into DuckDB,
which a background thread makes every ``_COPY_EVERY`` writes or ``copy_interval_s`` (``copier.py``). A read
first copies what DuckDB still lacks (:meth:`SpanStore._sync`), then runs on a DuckDB cursor of its own, so it
sees every write that returned.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, get_args

import duckdb
import pyarrow as pa

from spanlab.errors import InvalidSpanError, StoreError
from spanlab.sql_surface import QueryLimits
from spanlab.store import hot, queue, schema
from spanlab.store import spans as spans_sql
from spanlab.store.base import Metric, RolloutSummary, StoreAPI
from spanlab.store.copier import Copier
from spanlab.store.schema import MEMORY, SAFE_QUERY_CONFIG, SPAN_COLUMNS, connect, where
from spanlab.store.spans import as_model, spans_to_arrow, table_to_spans
from spanlab.store.sql import fetch_user_query
from spanlab.types import Attempt, FinishedAttemptStatus, Resource, ResourceKind, Rollout, Span

logger = logging.getLogger(__name__)

_FINISHED = get_args(FinishedAttemptStatus)
_COPY_EVERY = 256


class SpanStore(StoreAPI):
    """DuckDB-backed store. ``path=":memory:"`` gives a throwaway store for tests and notebooks."""

    def __init__(self, path: str | Path = MEMORY, *, max_tokens_per_span: int = 1_048_576,
                 max_json_bytes: int = schema.MAX_JSON_BYTES, stale_check_interval_s: float = 1.0,
                 timeout_grace_s: float = 2.0, compress: bool = True, copy_interval_s: float = 1.0) -> None:
        """``compress=False`` stores columns uncompressed: faster bulk ingest for a bigger file.
        ``copy_interval_s``: how long a write may wait in the hot store alone when fewer than ``_COPY_EVERY``
        follow it (a read never waits for it: it copies what is left)."""
        self.path = str(path)
        self.max_tokens_per_span = max_tokens_per_span
        self.max_json_bytes = max_json_bytes
        self.timeout_grace_s = timeout_grace_s
        self._stale_check_interval_s = stale_check_interval_s
        self._last_stale_check = 0.0
        hot.check_readable(self.path)  # before DuckDB is opened: a failed open must leave both files as they were
        self._conn = conn = connect(self.path)
        try:
            if not compress:
                conn.execute("SET force_compression = 'uncompressed'")
            conn.execute("BEGIN TRANSACTION")
            schema.init(conn, self.path)
            conn.execute("COMMIT")
            self._synced = int(conn.execute("SELECT value FROM spanlab_meta WHERE key = 'hot_seq'").fetchone()[0])
            self._lite = hot.open_hot(self.path, conn)
        except BaseException as exc:
            conn.close()
            if isinstance(exc, (duckdb.Error, sqlite3.Error)):
                raise StoreError(f"cannot open span store {self.path}: {exc}") from exc
            raise
        self._read_root = conn.cursor()
        self._lock = threading.Lock()  # DuckDB's side: copies, new cursors, closing
        self._closed = False
        self._writer = hot.Writer(self._lite, Path(self.path).name, max(self._synced, hot.last_stamp(self._lite)))
        self._sync()  # what a process that was killed committed to the hot store only
        self._copier = Copier(self._sync, name=Path(self.path).name, every=_COPY_EVERY, interval_s=copy_interval_s)

    def close(self) -> None:
        self._copier.stop()  # before the lock: a copy under way holds it
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._writer.close()  # a write under way finishes first
            try:
                self._copy(hot.read_changes(self._lite, self._synced, self._writer.last_stamp))
                if self.path != MEMORY:
                    self._conn.execute("CHECKPOINT")
            finally:
                self._read_root.close()
                self._conn.close()
                self._lite.close()

    def _sync(self) -> None:
        """Copy into DuckDB what the hot store committed before this call. One copy at a time (the lock); one
        that ran while this call waited for the lock may have copied it already, and then nothing is done."""
        upto = self._writer.last_stamp
        if self._synced >= upto:
            return
        with self._lock:
            if self._synced >= upto:
                return
            if self._closed:
                raise StoreError("the span store is closed")
            since = self._synced
            self._copy(self._writer.call(lambda lite: hot.read_changes(lite, since, self._writer.last_stamp)))

    def _copy(self, changes: hot.Changes) -> None:
        if changes.upto != self._synced:
            try:
                hot.apply_changes(self._conn, changes)
            except duckdb.Error as exc:
                raise StoreError(f"span store {self.path}: cannot copy the hot store into DuckDB: {exc}") from exc
            self._synced = changes.upto

    def _write(self, fn: Callable[[sqlite3.Connection], hot.T]) -> hot.T:
        """A write, committed; the background copier counts it (it copies, never this thread)."""
        result = self._writer.call(fn)
        self._copier.wrote()
        return result

    def _cursor(self) -> duckdb.DuckDBPyConnection:
        """A cursor for one read, on its own connection to the database, once DuckDB holds every write."""
        self._sync()
        with self._lock:
            if self._closed:
                raise StoreError("the span store is closed")
            return self._read_root.cursor()

    def _read(self, fn: Any, *args: Any) -> Any:
        cur = self._cursor()
        try:
            return fn(cur, *args)
        except duckdb.Error as exc:
            raise StoreError(f"span store {self.path}: {exc}") from exc
        finally:
            cur.close()

    def restrict_to_store(self) -> None:
        """Turn off DuckDB's access to other files, the network and extensions (for a process that serves
        user SQL, the store server). Irreversible."""
        settings = "; ".join(f"SET {key} = {value!r}" if isinstance(value, str) else f"SET {key} = {str(value).lower()}"
                             for key, value in SAFE_QUERY_CONFIG.items())
        with self._lock:
            self._conn.execute(settings)

    def enqueue(self, rollouts: Sequence[Rollout]) -> list[Rollout]:
        rollouts = [as_model(Rollout, r, i) for i, r in enumerate(rollouts)]
        if len({r.rollout_id for r in rollouts}) != len(rollouts):
            raise InvalidSpanError("enqueue: the batch repeats a rollout_id")
        return self._write(lambda cur: queue.enqueue(cur, rollouts)) if rollouts else []

    def dequeue(self, worker_id: str | None = None, mode: str | None = None) -> tuple[Rollout, Attempt] | None:
        if expire := time.time() - self._last_stale_check >= self._stale_check_interval_s:
            self._last_stale_check = time.time()

        def write(cur: sqlite3.Connection) -> tuple[Rollout, Attempt] | None:
            if expire:
                queue.expire(cur, time.time(), self.timeout_grace_s)
            return queue.dequeue(cur, worker_id, mode, time.time())
        return self._write(write)

    def heartbeat(self, attempt_id: str) -> Attempt:
        return self._write(lambda cur: queue.heartbeat(cur, attempt_id, time.time()))

    def finish_attempt(self, attempt_id: str, status: FinishedAttemptStatus, spans: Sequence[Span] = ()) -> Rollout:
        if status not in _FINISHED:
            raise InvalidSpanError(f"finish_attempt: status must be {'|'.join(_FINISHED)}, not {status!r}")
        tbl = self._checked(spans)
        if foreign := set(tbl["attempt_id"].to_pylist()) - {attempt_id}:
            raise InvalidSpanError(f"finish_attempt({attempt_id!r}) got spans of attempt "
                                   f"{sorted(map(str, foreign))[0]!r}; nothing stored, the attempt is still open")

        def write(cur: sqlite3.Connection) -> Rollout:
            # the spans first, while the attempt is still open: a reward is late only if the attempt had ended
            # before this call (timed out by the store), and then it is kept for the record, marked late
            if tbl.num_rows:
                spans_sql.insert(cur, tbl)
            return queue.finish(cur, attempt_id, status, time.time())
        return self._write(write)

    def expire_stale_attempts(self) -> list[Attempt]:
        return self._write(lambda cur: queue.expire(cur, time.time(), self.timeout_grace_s))

    def cancel_rollout(self, rollout_id: str) -> Rollout:
        return self._write(lambda cur: queue.cancel(cur, rollout_id, time.time()))

    def get_rollout(self, rollout_id: str) -> Rollout:
        return self._read(queue.get_rollout, rollout_id)

    def get_attempt(self, attempt_id: str) -> Attempt:
        return self._read(queue.get_attempt, attempt_id)

    def list_rollouts(self, *, status: str | None = None, mode: str | None = None, limit: int = 1000,
                      offset: int = 0) -> list[Rollout]:
        return self._read(queue.list_rollouts, {"status": status, "mode": mode}, limit, offset)

    def list_attempts(self, rollout_id: str) -> list[Attempt]:
        return self._read(queue.list_attempts, rollout_id)

    def last_attempts(self, rollout_ids: Sequence[str]) -> list[tuple[Rollout, Attempt]]:
        return self._read(queue.last_attempts, list(rollout_ids)) if rollout_ids else []

    def count_rollouts(self, statuses: Sequence[str] | None = None) -> int:
        return self._read(queue.count_rollouts, statuses)

    def rollout_summaries(self, rollout_ids: Sequence[str] | None = None, *, statuses: Sequence[str] | None = None,
                          metadata: dict[str, str] | None = None) -> list[RolloutSummary]:
        return self._read(queue.rollout_summaries, rollout_ids, statuses, metadata)

    def add_spans(self, spans: Sequence[Span]) -> int:
        return len(self.ingest(spans))

    def add_span_table(self, tbl: pa.Table) -> int:
        return len(self.ingest(table_to_spans(tbl)))

    def ingest(self, spans: Sequence[Span]) -> list[str]:
        """``add_spans`` that returns the span_ids it stored (the rest were stored already)."""
        tbl = self._checked(spans)
        return self._write(lambda cur: spans_sql.insert(cur, tbl)) if tbl.num_rows else []

    def _checked(self, spans: Sequence[Span]) -> pa.Table:
        """The batch as one Arrow table, every span validated (dicts too) and within the store's limits."""
        tbl = spans_to_arrow(spans)
        spans_sql.check_limits(tbl, self.max_tokens_per_span, self.max_json_bytes)
        return tbl

    def spans_reader(self, *, rollout_ids: Sequence[str] | None = None, attempt_ids: Sequence[str] | None = None,
                     kinds: Sequence[str] | None = None, columns: Sequence[str] | None = None,
                     batch_size: int = 1024, span_ids: Sequence[str] | None = None) -> pa.RecordBatchReader:
        cols = list(columns) if columns else list(SPAN_COLUMNS)
        if unknown := [c for c in cols if c not in SPAN_COLUMNS]:
            raise InvalidSpanError(f"unknown span columns {unknown}; known: {', '.join(SPAN_COLUMNS)}")
        filters = {"rollout_id": rollout_ids, "attempt_id": attempt_ids, "kind": kinds, "span_id": span_ids}
        clause, params = where(filters)
        sql = f"SELECT {', '.join(cols)} FROM spans {clause} ORDER BY rollout_id, attempt_id, sequence_id"
        try:  # the reader keeps its cursor alive while it streams
            return self._cursor().sql(sql, params=params).to_arrow_reader(batch_size)
        except duckdb.Error as exc:
            raise StoreError(f"cannot read spans: {exc}") from exc

    def add_resource(self, name: str, payload: dict[str, Any], kind: ResourceKind = "other") -> Resource:
        res = as_model(Resource, {"name": name, "payload": payload, "kind": kind}, 0)
        return self._write(lambda cur: queue.add_resource(cur, res))

    def get_resource(self, name: str, version: int | None = None) -> Resource:
        return self._read(queue.get_resource, name, version)

    def list_resources(self, name: str | None = None) -> list[Resource]:
        return self._read(queue.list_resources, name)

    def add_metrics(self, run_id: str, algorithm: str, step: int, metrics: dict[str, float]) -> None:
        if bad := self._write(lambda cur: queue.add_metrics(cur, run_id, algorithm, step, metrics)):
            logger.warning("run %s step %d: non-finite metrics %s", run_id, step, bad)

    def metrics(self, run_id: str | None = None) -> list[Metric]:
        return self._read(queue.metrics, run_id)

    def query(self, sql: str, max_rows: int | None = None, *, limits: QueryLimits | None = None) -> pa.Table:
        """:func:`~spanlab.store.sql.fetch_user_query` refuses anything that could write and applies ``limits``
        (the store server's, for its ``/sql``)."""
        return self._read(lambda cur: fetch_user_query(cur, sql, max_rows, limits=limits))
