"""The DuckDB span store: rollout queue, spans with exact token IDs, versioned resources.

One ``SpanStore`` owns one DuckDB file (DuckDB lets a single process write it). All mutations run under one
lock, so the queue is atomic across threads; reads use their own cursor and stream Arrow batches. A write that
returns is durable: resources are committed to DuckDB; queue changes (:mod:`spanlab.store.journal`) and span
batches smaller than a row group (:mod:`spanlab.store.span_journal`) are appended to one journal file
(:mod:`spanlab.store.journal_file`), so a finish and its spans are one fsync; bigger span batches go to DuckDB.
The journal reaches the tables in groups, by a background thread (:mod:`.flusher`) when due. The exception to
"on disk when it returns" is handing work out: a dequeue or a first heartbeat is written but not fsync'd; the
next fsync'd write or the thread's next tick (within a second) syncs it. A power cut in between hands the
rollout out again, as after a worker's crash; no result is lost.

    store = SpanStore("runs/spans.duckdb")
    rollout, attempt = store.dequeue(worker_id="w0")
    store.add_spans([...]); store.finish_attempt(attempt.attempt_id, "succeeded")
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path

from spanlab.errors import InvalidSpanError, StoreError
from spanlab.store import queue
from spanlab.store.base import StoreAPI
from spanlab.store.connection import MEMORY
from spanlab.store.database import as_model
from spanlab.store.flusher import BackgroundFlusher
from spanlab.store.journal import QueueJournal, effective_states
from spanlab.store.journal_file import Leftovers
from spanlab.store.queue_index import QueueIndex
from spanlab.store.span_columns import SpanBatch, SpanColumns, column
from spanlab.store.span_table import DEFAULT_MAX_JSON_BYTES, DEFAULT_MAX_TOKENS_PER_SPAN, SpanTable
from spanlab.types import Attempt, FinishedAttemptStatus, Rollout, Span

logger = logging.getLogger(__name__)

class SpanStore(SpanTable, StoreAPI):
    """DuckDB-backed store. ``path=":memory:"`` gives a throwaway store for tests and notebooks."""

    def __init__(
        self,
        path: str | Path = MEMORY,
        *,
        max_tokens_per_span: int = DEFAULT_MAX_TOKENS_PER_SPAN,
        max_json_bytes: int = DEFAULT_MAX_JSON_BYTES,
        stale_check_interval_s: float = 1.0,
        timeout_grace_s: float = 2.0,
        queue_flush_s: float = 1.0,
        span_flush_s: float = 1.0,
        compress: bool = True,
    ) -> None:
        """``compress=False`` stores columns uncompressed: ~1.35x faster bulk ingest (DuckDB alone:
        ~9.2k -> ~12.5k spans/s of 2,500 token IDs here) for ~1.6x the file size.

        ``queue_flush_s`` / ``span_flush_s``: how long queue changes (:mod:`spanlab.store.journal`) / small span
        batches (:mod:`spanlab.store.span_journal`) may wait in the journal before they are written to the
        tables. Reads never see them late: SQL and reads of the queue tables write them first, and
        ``spans_reader`` reads waiting spans where they are."""
        super().__init__(path, max_tokens_per_span=max_tokens_per_span, max_json_bytes=max_json_bytes,
                         span_flush_s=span_flush_s, compress=compress)
        self._stale_check_interval_s = stale_check_interval_s
        self.timeout_grace_s = timeout_grace_s
        self._last_stale_check = 0.0
        self._queue_flush_s = queue_flush_s
        self._queue = QueueIndex(QueueJournal(self._journal_file))  # leftovers: replayed by SpanTable's init
        try:
            self._load_queue()
        except BaseException:
            self._journal_file.close(remove=False)
            self._conn.close()
            raise
        poll_s = min(max(min(span_flush_s, queue_flush_s) / 4, 0.05), 1.0)
        self._flusher = BackgroundFlusher(self, SpanStore._flush_due, poll_s, f"spanlab-flush {Path(self.path).name}")

    def _flush_due(self) -> None:
        """The background flusher's tick: write what the journals hold once it is due (see :mod:`.flusher`)."""
        journal = self._journal_file
        if not (journal.dirty or self._spans.due(self._span_flush_s) or self._queue.due(self._queue_flush_s)):
            return
        with self._lock:
            if self._closed:
                return
            journal.sync()  # a dequeue's line is on disk within one tick of this thread
            self._maybe_flush_spans()
            self._maybe_write_queue()

    def close(self) -> None:
        self._flusher.stop()  # before the lock: a flush in progress holds it
        super().close()  # writes both journals (_flush_spans), then closes the file and DuckDB

    def _before_read(self) -> None:
        self._write_journals()

    # --- rollout queue -------------------------------------------------------------------------
    def _load_queue(self) -> None:
        for rollout in queue.waiting_rollouts(self._conn):
            self._queue.push(rollout)
        for rollout, attempt in queue.active_attempts(self._conn):
            self._queue.active[attempt.attempt_id] = (rollout, attempt)

    def _replay_queue(self, left: Leftovers) -> None:
        """Write the queue changes of a leftover journal (its spans are in the table by now) to the tables."""
        required = sorted({s for _, _, req in left.entries for s in req})
        stored = {r[0] for r in self._conn.execute(
            "SELECT span_id FROM spans WHERE span_id IN (SELECT unnest(?::VARCHAR[]))", [required]).fetchall()}
        rollouts, attempts = effective_states(left.entries, stored)
        if attempts or left.new_rollouts:
            logger.info("journal of %s: writing %d enqueued rollouts and %d transitions left by the last run",
                        self.path, len(left.new_rollouts), len(left.entries))
            with self._transaction() as cur:
                queue.write_states(cur, left.new_rollouts, rollouts, attempts)

    def _flush_spans(self) -> None:
        self._write_journals()

    def _write_journals(self) -> None:
        """Write everything the journal file holds to the tables (the waiting spans, then the pending queue
        changes and heartbeat times, each in one transaction), then empty the file. The file is synced first:
        the tables must never hold a change the file on disk lacks (a dequeue is written without fsync), or a
        power cut before the emptied file reaches the disk would leave an older prefix, whose replay would put
        an older state over the tables."""
        with self._lock:
            self._journal_file.sync()
            self._insert_waiting_spans()
            pending = self._queue.pending()
            if pending is not None:
                with self._transaction() as cur:
                    queue.write_states(cur, *pending)
                self._queue.written()
            self._journal_file.clear()

    def _maybe_write_queue(self) -> None:
        """The periodic write after a change that is already durable in the journal: a failure is logged, not
        raised into that call (nothing is lost: the file keeps it all, and the next write retries)."""
        if self._queue.due(self._queue_flush_s):
            try:
                self._write_journals()
            except StoreError as exc:
                logger.error("span store %s: the journal stays unwritten to the tables for now: %s", self.path, exc)

    def _record(self, rollout: Rollout, attempt: Attempt, requires: list[str] | None = None, *,
                sync: bool = True, written: bool = False) -> None:
        self._ensure_open()
        self._queue.record(rollout, attempt, requires, sync=sync, written=written)

    def enqueue(self, rollouts: Sequence[Rollout]) -> list[Rollout]:
        """Add rollouts to the queue: made durable by one journal append, inserted with the next write.
        A rollout_id already enqueued (in the table or waiting in the journal) is refused."""
        rollouts = [as_model(Rollout, r, i) for i, r in enumerate(rollouts)]
        if not rollouts:
            return []
        ids = [r.rollout_id for r in rollouts]
        if len(set(ids)) != len(ids):
            raise InvalidSpanError("enqueue: the batch repeats a rollout_id")
        with self._lock:
            self._ensure_open()
            dup = next((i for i in ids if i in self._queue.journal.new_rollouts), None)
            if dup is not None or (dup := queue.first_stored_rollout(self._conn, ids)) is not None:
                raise InvalidSpanError(f"enqueue: rollout_id {dup!r} already exists")
            self._queue.enqueued(rollouts)
            self._maybe_write_queue()
        return rollouts

    def dequeue(self, worker_id: str | None = None, mode: str | None = None) -> tuple[Rollout, Attempt] | None:
        """Take the oldest waiting rollout: decided in memory, made durable by one journal append (no SQL)."""
        self._maybe_expire(time.time())
        with self._lock:
            now = time.time()  # read under the lock: attempt times then order like the operations do
            waiting = self._queue.pop(mode)
            if waiting is None:
                return None
            rollout, attempt = queue.opened(waiting, worker_id, now, self._resources_ref())
            try:
                self._record(rollout, attempt, sync=False)  # handing work out: see the module docstring
            except BaseException:
                self._queue.push(waiting)  # nothing changed: it still waits
                raise
            self._span_index.add_attempt(attempt.attempt_id, rollout.rollout_id)
            if attempt.sequence_id == 1:
                self._note_rollout_not_in_table(rollout.rollout_id)
            self._maybe_write_queue()
        return rollout, attempt

    def heartbeat(self, attempt_id: str) -> Attempt:
        """Mark a live attempt alive. The first beat (preparing -> running) is a journaled transition; later
        beats only move the time in memory (what timeout detection reads), written with the next write of the
        queue tables. A beat costs microseconds; a crash loses at most ``queue_flush_s`` of beat times."""
        with self._lock:
            live = self._queue.active.get(attempt_id)
            if live is None:  # unknown, or already ended: the stored state says which
                return self.get_attempt(attempt_id)
            rollout, attempt = live
            now = time.time()
            if attempt.status == "preparing":
                rollout, attempt = queue.started(rollout, attempt, now)
                self._record(rollout, attempt, sync=False)
            else:
                attempt = self._queue.beat(attempt_id, now)
            self._maybe_write_queue()
            return attempt

    def finish_attempt(self, attempt_id: str, status: FinishedAttemptStatus, spans: Sequence[Span] = ()) -> Rollout:
        spans = [as_model(Span, s, i) for i, s in enumerate(spans)]
        return self.finish_attempt_table(attempt_id, status, SpanColumns.of(spans) if spans else None, validated=True)

    def finish_attempt_table(
        self, attempt_id: str, status: FinishedAttemptStatus, tbl: SpanBatch | None, *, validated: bool = False
    ) -> Rollout:
        """``finish_attempt`` with the last spans as a batch: an Arrow table (the store server's wire path) or
        typed spans' :class:`~spanlab.store.span_columns.SpanColumns`.

        The finish is journaled naming its spans, then the spans are inserted (one DuckDB statement):
        after a crash either both count or neither does (see :mod:`spanlab.store.journal`).
        """
        if status not in ("failed", "succeeded", "timeout", "unresponsive"):
            raise InvalidSpanError(
                f"finish_attempt: status must be failed|succeeded|timeout|unresponsive, not {status!r}"
            )
        if tbl is not None:
            tbl = self._checked(tbl, validated)
            foreign = set(column(tbl, "attempt_id")) - {attempt_id}
            if foreign:
                raise InvalidSpanError(
                    f"finish_attempt({attempt_id!r}) got spans of attempt {sorted(map(str, foreign))[0]!r}; "
                    "nothing stored, the attempt is still open"
                )
        with self._lock:
            live = self._queue.active.get(attempt_id)
            if live is None:  # already ended (timed out, cancelled, finished twice) or unknown
                rollout_id = self.get_attempt(attempt_id).rollout_id
                if tbl is not None and tbl.num_rows:
                    self._store_fresh(tbl)  # as add_spans would: a late reward still counts for the record
                return self.get_rollout(rollout_id)
            rollout, attempt = queue.closed(*live, status, time.time())
            fresh = self._fresh_rows(tbl) if tbl is not None and tbl.num_rows else None
            if fresh is None or fresh.num_rows == 0:
                self._record(rollout, attempt)
            elif self._journals(fresh):  # the finish and its spans: one append, one fsync
                change = self._queue.journal.record_body(rollout, attempt, column(fresh, "span_id"))
                self._insert_spans(fresh, before=(change,))  # nothing written if it fails: still open
                self._record(rollout, attempt, written=True)
                self._span_index.mark_stored(fresh)
                self._maybe_flush_spans()
            else:  # spans too big for the journal: the finish first, naming them, then their insert
                self._record(rollout, attempt, requires=column(fresh, "span_id"))
                try:
                    self._insert_spans(fresh)
                except BaseException:
                    self._queue.discard(rollout.rollout_id)
                    self._record(*live)  # the finish did not happen: the attempt's live state again
                    raise
                self._span_index.mark_stored(fresh)
                self._maybe_flush_spans()
            self._maybe_write_queue()
            return rollout

    def expire_stale_attempts(self) -> list[Attempt]:
        with self._lock:
            overdue = self._queue.overdue(time.time(), self.timeout_grace_s)
            for attempt_id, verdict in overdue:
                _, attempt = self._queue.active[attempt_id]
                logger.warning("attempt %s of rollout %s ended %s", attempt_id, attempt.rollout_id, verdict)
                self.finish_attempt(attempt_id, verdict)
            return [self.get_attempt(a) for a, _ in overdue]

    def _maybe_expire(self, now: float) -> None:
        if now - self._last_stale_check >= self._stale_check_interval_s:
            self._last_stale_check = now
            self.expire_stale_attempts()

    def cancel_rollout(self, rollout_id: str) -> Rollout:
        with self._lock:
            self._write_journals()
            with self._transaction() as cur:
                rollout = queue.cancel_rollout(cur, rollout_id, time.time())
            self._queue.discard(rollout_id)
            for attempt_id in [a for a, (r, _) in self._queue.active.items() if r.rollout_id == rollout_id]:
                del self._queue.active[attempt_id]
            return rollout

    def get_rollout(self, rollout_id: str) -> Rollout:
        self._write_journals()
        return queue.get_rollout(self._cursor(), rollout_id)

    def get_attempt(self, attempt_id: str) -> Attempt:
        self._write_journals()
        return queue.get_attempt(self._cursor(), attempt_id)

    def list_rollouts(
        self, *, status: str | None = None, mode: str | None = None, limit: int = 1000, offset: int = 0
    ) -> list[Rollout]:
        self._write_journals()
        return queue.list_rollouts(self._cursor(), {"status": status, "mode": mode}, limit, offset)

    def list_attempts(self, rollout_id: str) -> list[Attempt]:
        self._write_journals()
        return queue.list_attempts(self._cursor(), rollout_id)
