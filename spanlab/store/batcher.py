"""Group commit for the store server: many small span writes become few big DuckDB inserts.

Request handlers hand their (already checked) Arrow batch to :class:`SpanBatcher` and wait on a
future. One writer thread takes whatever is queued, up to ``max_rows`` or ``max_wait_s`` after the
first arrival, inserts it as one batch (one commit, and row-group sized batches go straight to the
file), then resolves every future. A request is answered only after its spans are committed, so
batching never weakens durability. If the combined batch is rejected, each request is retried
alone, so the error reaches the request that caused it.
"""

from __future__ import annotations

import atexit
import logging
import queue
import threading
import time
from concurrent.futures import Future

import pyarrow as pa

from spanlab.errors import InvalidSpanError, StoreError
from spanlab.store.duckdb_store import SpanStore

logger = logging.getLogger(__name__)


class SpanBatcher:
    def __init__(self, store: SpanStore, *, max_rows: int = 4096, max_wait_s: float = 0.005) -> None:
        self.store = store
        self.max_rows = max_rows
        self.max_wait_s = max_wait_s
        self._queue: queue.Queue[tuple[pa.Table, Future[list[str]]] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="span-batcher", daemon=True)
        self._thread.start()
        atexit.register(self.close)  # a daemon thread inside DuckDB at interpreter exit aborts the process

    def submit(self, tbl: pa.Table) -> Future[list[str]]:
        """Queue a conformed, validated span table; the future resolves to the span_ids that were new."""
        fut: Future[list[str]] = Future()
        if not self._thread.is_alive():
            fut.set_exception(StoreError("the span batcher is stopped"))
        else:
            self._queue.put((tbl, fut))
        return fut

    def close(self) -> None:
        """Drain what is queued, then stop."""
        atexit.unregister(self.close)
        self._queue.put(None)
        self._thread.join()

    def _run(self) -> None:
        stopping = False
        while not stopping:
            item = self._queue.get()
            if item is None:
                break
            pending = [item]
            rows = item[0].num_rows
            deadline = time.monotonic() + self.max_wait_s
            while rows < self.max_rows:
                try:
                    nxt = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if nxt is None:
                    stopping = True
                    break
                pending.append(nxt)
                rows += nxt[0].num_rows
            self._write(pending)

    def _write(self, pending: list[tuple[pa.Table, Future[list[str]]]]) -> None:
        if len(pending) > 1:
            try:
                new_ids = set(self.store.ingest(pa.concat_tables([t for t, _ in pending]), validated=True))
            except InvalidSpanError:
                logger.debug("combined batch of %d requests rejected; writing them one by one", len(pending))
            except Exception as exc:  # the store failed as a whole: every waiter must hear it
                for _, fut in pending:
                    fut.set_exception(exc)
                return
            else:
                for tbl, fut in pending:
                    fut.set_result([s for s in tbl["span_id"].to_pylist() if s in new_ids])
                return
        for tbl, fut in pending:
            try:
                fut.set_result(self.store.ingest(tbl, validated=True))
            except Exception as exc:
                fut.set_exception(exc)
