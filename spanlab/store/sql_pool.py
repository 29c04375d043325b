"""User SQL on its own few threads, so it can never starve the routes that serve the queue or the pages.

A server runs blocking store calls on asyncio's default thread pool. If user queries ran there too, a
handful of slow ones (whose clients may long have given up) would hold every thread and leave
``/dequeue`` and ``/rollouts`` waiting. Here they get a pool of their own, ``workers`` wide; a query that
finds it full is answered at once (``QueryBusyError``, 503) rather than queued behind the others, and a
query whose client disconnects is interrupted (:class:`~spanlab.store.sql.QueryLimits` ``cancel``).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from spanlab.errors import QueryError
from spanlab.store.sql import QueryLimits

T = TypeVar("T")
_POLL_S = 0.1  # how often a waiting request checks whether its client is still there


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
            raise QueryBusyError(
                f"all {self.workers} SQL workers are busy with other queries: retry in a few seconds")
        cancel = threading.Event()
        limits = QueryLimits(timeout_s=self.timeout_s, max_bytes=self.max_bytes, cancel=cancel)

        def call() -> T:
            try:
                return fn(*args, limits)
            finally:
                self._free.release()  # here, not in run(): the slot stays taken until the thread is free

        future = asyncio.get_running_loop().run_in_executor(self._executor, call)
        try:
            while True:
                done, _ = await asyncio.wait({future}, timeout=_POLL_S)
                if done:
                    return future.result()
                if await is_disconnected():
                    cancel.set()
        except asyncio.CancelledError:
            cancel.set()
            raise

    def close(self) -> None:
        """Stop taking queries; running ones finish (their limits bound how long that takes)."""
        self._executor.shutdown(wait=False, cancel_futures=True)
