"""How the gateway's spans reach the store: a completed call's before its answer, failed calls' in the background.

A completed call is stored before the agent gets the answer (:meth:`SpanWriter.store_call` from the event loop,
:meth:`SpanWriter.write` from a thread): once the agent has it, it may end its attempt, and an attempt must
never end ``succeeded`` without the spans of its calls, even if this process is killed right after answering.
One thread of the writer stores completed calls: it takes every call queued by the time it is free and
writes them in one store call (group commit: the store's per-batch work, its commit and fsync included, is
paid once for all of them), then tells each caller. Why one thread and not a worker thread per call: the
calls then do not wait on each other's locks, wake no pool thread each, and the event loop waits on a future.
Calls that failed (the engine's errors, a broken stream, an agent that went away) gave the agent no answer
to act on; their error spans are handed to a second thread (:meth:`SpanWriter.submit`), which gathers
what accumulated for ``flush_interval_s`` and writes it as one batch, in submission order.

A successful call's span must not be lost, so:
* transient store failures (I/O, a locked or busy DuckDB) are logged loudly and retried with backoff,
  keeping order; nothing later overtakes the failed batch;
* a batch the store rejects as invalid is retried span by span (completed calls: call by call, so each
  learns its own fate), so one bad span cannot block or take down the others; a span rejected on its own
  for its size is stored cut to the store's limit and marked (:mod:`.oversize`); one rejected for anything
  else can never succeed and goes to ``fallback_path`` (JSON lines) when one is set, else its ID is logged at
  CRITICAL;
* ``close`` drains both queues, retrying until its timeout; what still cannot be written goes to the
  fallback file too.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from spanlab.gateway.oversize import fit_span
from spanlab.store.base import StoreAPI
from spanlab.types import Span

logger = logging.getLogger(__name__)

SpanJob = Sequence[Span] | Callable[[], Sequence[Span]]


class SpanWriter:
    """Batching, retrying, order-preserving span writer for one store."""

    def __init__(
        self,
        store: StoreAPI,
        *,
        flush_interval_s: float = 0.05,
        max_batch: int = 512,
        retry_initial_s: float = 0.05,
        retry_max_s: float = 2.0,
        fallback_path: str | Path | None = None,
    ) -> None:
        self.store = store
        self.flush_interval_s = flush_interval_s
        self.max_batch = max_batch
        self.retry_initial_s = retry_initial_s
        self.retry_max_s = retry_max_s
        self.fallback_path = Path(fallback_path) if fallback_path else None
        self._queue: deque[SpanJob] = deque()
        self._cond = threading.Condition()
        self._submitted = 0  # jobs; flush() waits for _done to catch up
        self._done = 0
        self.written = 0  # spans
        self.given_up = 0
        self.write_failures = 0
        # How long the last completed calls' answers waited on the store (``/health`` reports percentiles).
        self.write_seconds: deque[float] = deque(maxlen=1024)
        self._closing = False
        self._close_deadline = float("inf")
        self._thread = threading.Thread(target=self._run, name="spanlab-span-writer", daemon=True)
        self._calls: list[_Call] = []  # completed calls waiting for the next group (store, write)
        self._calls_ready = threading.Condition()
        self._calls_thread = threading.Thread(target=self._run_calls, name="spanlab-call-writer", daemon=True)

    def start(self) -> SpanWriter:
        self._thread.start()
        self._calls_thread.start()
        atexit.register(self.close)  # a daemon thread inside DuckDB at interpreter exit aborts the process
        return self

    @property
    def pending(self) -> int:
        """Jobs (calls) submitted but not yet stored."""
        return self._submitted - self._done

    def submit(self, job: SpanJob) -> None:
        """Queue spans, or a function building them, for writing; returns at once (any thread)."""
        with self._cond:
            if self._closing:  # still written: the thread drains until the queue is empty
                logger.warning("span writer is closing; a late job was queued anyway")
            self._queue.append(job)
            self._submitted += 1
            self._cond.notify_all()

    async def store_call(self, job: SpanJob, timeout_s: float) -> bool:
        """Store a completed call's spans before its answer, retrying store failures for up to ``timeout_s``;
        False if they could not be stored (then they went where ``_give_up`` puts them). The event loop only
        waits: the spans are built and written in the writer's thread. A caller cancelled meanwhile (the agent
        went away) does not stop the write."""
        loop = asyncio.get_running_loop()
        stored: asyncio.Future[bool] = loop.create_future()
        self._queue_call(job, timeout_s, lambda ok: _settle_soon(loop, stored, ok))
        return await stored

    def write(self, job: SpanJob, timeout_s: float) -> bool:
        """:meth:`store_call` for a caller on a thread of its own (blocks until stored or given up)."""
        outcome: list[bool] = []
        told = threading.Event()
        self._queue_call(job, timeout_s, lambda ok: (outcome.append(ok), told.set()))
        told.wait()
        return outcome[0]

    def _queue_call(self, job: SpanJob, timeout_s: float, tell: Callable[[bool], object]) -> None:
        call = _Call(job, time.monotonic(), timeout_s, tell)
        with self._calls_ready:
            if self._calls_thread.is_alive() and not self._closing:
                self._calls.append(call)
                self._calls_ready.notify()
                return
        # not started, or closing: write it here, so no call waits on a thread that will not take it
        self._write_calls([call])

    def _run_calls(self) -> None:
        while True:
            with self._calls_ready:
                self._calls_ready.wait_for(lambda: self._calls or self._closing)
                if not self._calls:
                    return
                group, self._calls = self._calls, []
            self._write_calls(group)

    def _write_calls(self, group: list[_Call]) -> None:
        """Concurrent calls' spans in one store write: the store's per-batch work (checks, Arrow, commit) once
        for all of them. A group the store rejects is written call by call, so each call learns its own fate."""
        built = []
        for c in group:
            try:
                c.spans = list(c.job() if callable(c.job) else c.job)
                built.append(c)
            except Exception:
                logger.critical("building the spans of a call failed; that call is NOT recorded", exc_info=True)
        deadline = min((c.queued + c.timeout_s for c in built), default=0.0)
        try:
            ok = not built or self._write_batch([s for c in built for s in c.spans], deadline, whole=len(built) > 1)
            for c in built:
                c.ok = ok
        except _Rejected:
            for c in built:
                c.ok = self._write_batch(c.spans, deadline)
        finally:
            now = time.monotonic()
            for c in group:
                self.write_seconds.append(now - c.queued)
                c.tell(c.ok)

    def write_ms(self) -> dict[str, float | None]:
        """p50, p99 and max of how long the recent completed calls waited to be stored (``write_seconds``: from
        :meth:`store_call` or :meth:`write` to the outcome, span building included), in ms."""
        ms = sorted(s * 1000 for s in list(self.write_seconds))
        if not ms:
            return {"n": 0, "p50": None, "p99": None, "max": None}
        return {"n": len(ms), "p50": ms[len(ms) // 2], "p99": ms[min(len(ms) - 1, len(ms) * 99 // 100)], "max": ms[-1]}

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until everything submitted before this call is stored (or given up); False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            target = self._submitted
            while self._done < target:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._cond.wait(remaining)
        return True

    def close(self, timeout: float = 30.0) -> None:
        """Write what is queued (retrying up to ``timeout`` seconds), then stop the thread."""
        atexit.unregister(self.close)
        with self._cond, self._calls_ready:
            self._closing = True
            self._close_deadline = time.monotonic() + timeout
            self._cond.notify_all()
            self._calls_ready.notify_all()
        for thread in (self._calls_thread, self._thread):
            if thread.is_alive():
                thread.join()
        if self._calls:  # the thread never started or died: do not lose the calls waiting on it
            calls, self._calls = self._calls, []
            self._write_calls(calls)
        while self._queue:  # the thread never started or died: do not lose what is queued
            self._process(self._take())

    # --- the thread ------------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closing:
                    self._cond.wait()
                if not self._queue and self._closing:
                    return
                gather = len(self._queue) < self.max_batch and not self._closing
            if gather and self.flush_interval_s > 0:
                # Let calls accumulate into one transaction (outside the lock, so submitters never
                # wait on it and their notifies do not cut the pause short).
                time.sleep(self.flush_interval_s)
            self._process(self._take())

    def _take(self) -> list[SpanJob]:
        with self._cond:
            return [self._queue.popleft() for _ in range(min(self.max_batch, len(self._queue)))]

    def _process(self, jobs: list[SpanJob]) -> None:
        spans: list[Span] = []
        for job in jobs:
            try:
                spans.extend(job() if callable(job) else job)
            except Exception:  # a bug in span building: say so loudly, keep writing the others
                logger.critical("building the spans of a call failed; that call is NOT recorded", exc_info=True)
        if spans:
            self._write_batch(spans)
        with self._cond:
            self._done += len(jobs)
            self._cond.notify_all()

    def _write_batch(self, batch: list[Span], deadline: float | None = None, *, whole: bool = False) -> bool:
        """Store ``batch``, retrying store failures until ``deadline`` (or the close deadline); False if any
        span was given up. ``whole``: raise :class:`_Rejected` if the store rejects it, rather than split it."""
        delay = self.retry_initial_s
        while True:
            try:
                self.store.add_spans(batch)
            except (ValueError, KeyError) as exc:  # InvalidSpanError / NotFoundError: retrying won't help
                if whole:
                    raise _Rejected from exc
                if len(batch) > 1:
                    logger.error("store rejected a batch of %d spans (%s); writing them one by one", len(batch), exc)
                    return all([self._write_batch([span], deadline) for span in batch])
                if "truncated" not in batch[0].attributes and (  # cut once: a cut span refused again is given up
                        fitted := fit_span(batch[0], self.store.max_json_bytes)) is not None:
                    logger.warning("span %s is over the store's %d-byte limit (%s); storing it with %s cut "
                                   "(attributes.truncated)", batch[0].span_id, self.store.max_json_bytes, exc,
                                   ", ".join(fitted.attributes["truncated"]))
                    return self._write_batch([fitted], deadline)
                self._give_up(batch, exc)
                return False
            except Exception as exc:  # any other store failure is retried, never dropped
                self.write_failures += 1
                if time.monotonic() >= min(self._close_deadline, deadline or float("inf")):
                    self._give_up(batch, exc)
                    return False
                logger.error(
                    "store write of %d span(s) failed (%s: %s); retrying in %.2fs",
                    len(batch),
                    type(exc).__name__,
                    exc,
                    delay,
                    exc_info=self.write_failures == 1,
                )
                time.sleep(delay)
                delay = min(delay * 2, self.retry_max_s)
                continue
            self.written += len(batch)
            return True

    def _give_up(self, batch: list[Span], exc: BaseException) -> None:
        ids = ", ".join(s.span_id for s in batch)
        self.given_up += len(batch)
        if self.fallback_path is None:
            logger.critical("span(s) %s LOST: the store cannot take them (%s) and no fallback_path is set", ids, exc)
            return
        try:
            self.fallback_path.parent.mkdir(parents=True, exist_ok=True)
            with self.fallback_path.open("a", encoding="utf-8") as f:
                for span in batch:
                    f.write(span.model_dump_json() + "\n")
            logger.critical("store cannot take span(s) %s (%s); saved to %s", ids, exc, self.fallback_path)
        except OSError as io_exc:
            logger.critical(
                "span(s) %s LOST: store failed (%s) and %s failed (%s)", ids, exc, self.fallback_path, io_exc
            )


class _Rejected(Exception):
    """A group of calls' spans that the store rejected as invalid."""


@dataclass(eq=False)
class _Call:
    """A completed call waiting to be stored; ``tell`` gets the outcome, from the writer's thread."""

    job: SpanJob
    queued: float  # time.monotonic()
    timeout_s: float
    tell: Callable[[bool], object]
    spans: list[Span] = field(default_factory=list)
    ok: bool = False


def _settle_soon(loop: asyncio.AbstractEventLoop, stored: asyncio.Future[bool], ok: bool) -> None:
    """Resolve ``stored`` on its loop; a loop already closed has no one waiting."""
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(_settle, stored, ok)


def _settle(stored: asyncio.Future[bool], ok: bool) -> None:
    if not stored.done():  # cancelled: the agent went away; its spans were written all the same
        stored.set_result(ok)
