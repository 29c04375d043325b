"""The store's one writer: a thread that owns the hot store's SQLite connection and commits writes in groups.

Why one thread: a COMMIT (an fsync) costs about the same for one row as for a thousand. Every write is a
function of the connection; the thread runs what queued up while it was busy in one transaction, COMMITs,
and only then answers each caller. So a write that returns is committed, writes that arrive together share
a commit, and two dequeues never run at once. Each write's rows are stamped with a number of their own
(``stamp()`` in SQL), which is how :mod:`spanlab.store.hot` finds what DuckDB lacks. If one write of a
group fails, the group is rolled back and each runs again alone, so the error reaches only its caller: a
write must be safe to run twice.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import queue
import sqlite3
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from spanlab.errors import InvalidSpanError, StoreError

logger = logging.getLogger(__name__)
T = TypeVar("T")
Write = Callable[[sqlite3.Connection], Any]
_MAX_GROUP = 256


class Writer:
    """Owns ``conn`` from now on: nothing else may use it until :meth:`close` returns. ``last_stamp``: the
    stamp of the last write (stamps count up from there)."""

    def __init__(self, conn: sqlite3.Connection, name: str, last_stamp: int) -> None:
        self._conn = conn
        self._name = name
        self.last_stamp = last_stamp
        self._stamp: int | None = None
        conn.create_function("stamp", 0, self._next_stamp)
        self._queue: queue.SimpleQueue[tuple[Write, Future[Any]] | None] = queue.SimpleQueue()
        self._closed = False
        self._close_lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=f"spanlab-writer {name}", daemon=True)
        self._thread.start()
        atexit.register(self.close)  # a daemon thread inside DuckDB at interpreter exit aborts the process

    def submit(self, fn: Callable[[sqlite3.Connection], T]) -> Future[T]:
        """Queue ``fn``; its future resolves to what ``fn`` returned once the transaction holding it committed."""
        fut: Future[T] = Future()
        if self._closed:
            fut.set_exception(StoreError(f"span store {self._name} is closed"))
        else:
            self._queue.put((fn, fut))
        return fut

    def call(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """:meth:`submit` and wait: the write is committed when this returns."""
        return self.submit(fn).result()

    def close(self) -> None:
        """Commit what is queued, then stop the thread (the caller closes the connection)."""
        atexit.unregister(self.close)
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        self._queue.put(None)
        self._thread.join()

    # --- the thread ----------------------------------------------------------------------------
    def _run(self) -> None:
        while True:  # a group: the first write, and whatever queued up meanwhile (None: close)
            group = [self._queue.get()]
            while group[-1] is not None and len(group) < _MAX_GROUP:
                try:
                    group.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            if writes := [item for item in group if item is not None]:
                self._commit(writes)
            if group[-1] is None:
                return

    def _commit(self, group: list[tuple[Write, Future[Any]]]) -> None:
        if len(group) > 1:
            try:
                results = self._transaction([fn for fn, _ in group])
            except Exception as exc:  # each request runs again alone below
                logger.debug("a group of %d writes failed (%s); running them one by one", len(group), exc)
            else:
                for (_, fut), result in zip(group, results, strict=True):
                    fut.set_result(result)
                return
        for fn, fut in group:
            try:
                fut.set_result(self._transaction([fn])[0])
            except BaseException as exc:  # handed to the caller
                fut.set_exception(exc)

    def _next_stamp(self) -> int:
        """``stamp()`` in SQL: one number per write function, taken when it first changes a row."""
        if self._stamp is None:
            self.last_stamp = self._stamp = self.last_stamp + 1
        return self._stamp

    def _transaction(self, fns: list[Write]) -> list[Any]:
        """BEGIN, every function, COMMIT; SQLite errors become spanlab errors and roll everything back."""
        conn = self._conn
        results: list[Any] = []
        try:
            conn.execute("BEGIN")
            for fn in fns:
                self._stamp = None
                results.append(fn(conn))
            conn.execute("COMMIT")
            return results
        except BaseException as exc:
            with contextlib.suppress(sqlite3.Error):  # a failed BEGIN or COMMIT left no transaction open
                conn.execute("ROLLBACK")
            if isinstance(exc, sqlite3.IntegrityError):
                raise InvalidSpanError(f"rejected by the store: {exc}; nothing of this batch was stored") from exc
            if isinstance(exc, sqlite3.Error):
                raise StoreError(f"span store {self._name}: {exc}") from exc
            raise
