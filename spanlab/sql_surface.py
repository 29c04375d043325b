"""The shared surfaces for user SQL (the store server's ``/sql``, the UI's SQL box): what a query may take,
a few threads of their own, and rows as JSON.

User SQL on a server runs on a few threads of its own (:class:`SqlPool`), never those of the queue or the
pages, under a time and byte limit (:class:`QueryLimits`, applied by
:func:`~spanlab.store.sql.fetch_user_query`); a query that finds every thread busy is answered at once (503)
rather than queued behind slow ones.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import decimal
import math
import threading
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import pyarrow as pa

from spanlab.errors import QueryError

# Limits of the shared query surfaces (the store server's /sql, the UI's SQL box): a query there must not
# hold a thread or memory that the queue routes or other pages need.
SURFACE_TIMEOUT_S = 10.0
SURFACE_MAX_BYTES = 32 * 1024 * 1024
T = TypeVar("T")
_POLL_S = 0.1  # how often a waiting request checks whether its client is still there


@dataclass(frozen=True)
class QueryLimits:
    """What one user query may take: seconds, bytes of Arrow result; ``cancel`` set: stop it now."""

    timeout_s: float | None = None
    max_bytes: int | None = None
    cancel: threading.Event | None = None


def _jsonable(value: Any) -> Any:
    """A value strict JSON can carry (non-finite floats become the strings JavaScript would print)."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, decimal.Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    return value


def rows(table: pa.Table) -> Iterator[dict[str, Any]]:
    for batch in table.to_batches(max_chunksize=1024):
        for row in batch.to_pylist():
            yield {k: _jsonable(v) for k, v in row.items()}


class QueryBusyError(QueryError):
    """Every SQL worker is busy; the client should retry later (HTTP 503)."""


class SqlPool:
    """``workers`` threads for user SQL, each call under a time and byte limit."""

    def __init__(self, workers: int = 2, *, timeout_s: float | None = None, max_bytes: int | None = None) -> None:
        self.workers = workers
        self.timeout_s = timeout_s
        self.max_bytes = max_bytes
        self._executor = ThreadPoolExecutor(workers, thread_name_prefix="spanlab-sql")
        self._free = threading.BoundedSemaphore(workers)

    async def run(self, is_disconnected: Callable[[], Awaitable[bool]], fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args, limits)`` on a free worker, interrupted (through ``limits.cancel``) if ``is_disconnected()``
        turns true; busy: an error at once."""
        if not self._free.acquire(blocking=False):
            raise QueryBusyError(f"all {self.workers} SQL workers are busy with other queries: retry in a few seconds")
        cancel = threading.Event()
        limits = QueryLimits(timeout_s=self.timeout_s, max_bytes=self.max_bytes, cancel=cancel)

        def call() -> T:
            try:
                return fn(*args, limits)
            finally:
                self._free.release()  # here, not in run(): the slot stays taken until the thread is free

        future = asyncio.get_running_loop().run_in_executor(self._executor, call)
        try:
            while (await asyncio.wait({future}, timeout=_POLL_S))[1]:  # still pending
                if await is_disconnected():
                    cancel.set()
            return future.result()
        except asyncio.CancelledError:
            cancel.set()
            raise

    def close(self) -> None:
        """Stop taking queries; running ones finish (their limits bound how long that takes)."""
        self._executor.shutdown(wait=False, cancel_futures=True)
