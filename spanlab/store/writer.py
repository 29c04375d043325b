"""The store's one writer: every write is a function of the hot store's SQLite connection, run in a
transaction of its own, one at a time, and COMMITted (an fsync) before the call returns.

Why a lock and not a thread that groups writes: a SQLite COMMIT in WAL mode costs ~0.1-0.5 ms here, so
writers waiting their turn wait less than a DuckDB commit would take, and nothing needs grouping. One at a
time also means two dequeues never take the same rollout. Each write's rows are stamped with a number of
their own (``stamp()`` in SQL), which is how :mod:`spanlab.store.hot` finds what DuckDB lacks.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Callable
from typing import TypeVar

from spanlab.errors import InvalidSpanError, StoreError

T = TypeVar("T")


class Writer:
    """Owns ``conn``: nothing else may use it. ``last_stamp``: the stamp of the last write; stamps count up."""

    def __init__(self, conn: sqlite3.Connection, name: str, last_stamp: int) -> None:
        self._conn = conn
        self._name = name
        self._lock = threading.Lock()
        self._closed = False
        self.last_stamp = last_stamp
        self._stamp: int | None = None
        conn.create_function("stamp", 0, self._next_stamp)

    def _next_stamp(self) -> int:
        """``stamp()`` in SQL: one number per write, taken when it first changes a row."""
        if self._stamp is None:
            self.last_stamp = self._stamp = self.last_stamp + 1
        return self._stamp

    def call(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """BEGIN, ``fn(conn)``, COMMIT: the write is durable when this returns. An error rolls it back;
        SQLite's errors become spanlab errors."""
        with self._lock:
            if self._closed:
                raise StoreError(f"span store {self._name} is closed")
            self._stamp = None
            try:
                self._conn.execute("BEGIN IMMEDIATE")
                result = fn(self._conn)
                self._conn.execute("COMMIT")
                return result
            except BaseException as exc:
                with contextlib.suppress(sqlite3.Error):  # a failed BEGIN or COMMIT left no transaction open
                    self._conn.execute("ROLLBACK")
                if isinstance(exc, sqlite3.IntegrityError):
                    raise InvalidSpanError(f"rejected by the store: {exc}; nothing of this batch was stored") from exc
                if isinstance(exc, sqlite3.Error):
                    raise StoreError(f"span store {self._name}: {exc}") from exc
                raise

    def close(self) -> None:
        """Refuse further writes; a write under way finishes first."""
        with self._lock:
            self._closed = True
