"""A store's background writer: the journals reach the DuckDB tables without a caller waiting for it.

A write call returns once its journal append is durable, and the tables catch up every ``span_flush_s``
and ``queue_flush_s``. When only writes checked those times, the catching up (a DuckDB insert and commit of
tens of milliseconds) landed in whichever write came first after they fell due: a call that costs a
millisecond or two paid for the whole second before it, and after a quiet spell always did. This thread
checks them a few times per interval and writes what is due, so a store that is between steps writes its
tables while nobody waits. Under steady load callers still share the store's lock with it, as before: the
work is the same, only who waits for it changes. DuckDB releases the GIL while it inserts.

The thread holds the store weakly: a store nobody closed can still be garbage-collected. At interpreter exit
the thread is stopped (an ``atexit`` hook that waits for a flush in progress): a daemon thread still inside
DuckDB when Python finalizes is killed mid-call, which aborts the whole process (``terminate called after
throwing an instance of ''``, exit status 134) for a program that only forgot to close its store.
"""

from __future__ import annotations

import atexit
import logging
import threading
import weakref
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)


class BackgroundFlusher:
    """Calls ``flush(owner)`` every ``interval_s`` on a daemon thread until :meth:`stop` (or ``owner`` is gone)."""

    def __init__(self, owner: Any, flush: Callable[[Any], None], interval_s: float, name: str) -> None:
        self.interval_s = interval_s
        self._stopped = threading.Event()
        self._thread = threading.Thread(
            target=_run, args=(weakref.ref(owner), flush, interval_s, self._stopped), name=name, daemon=True
        )
        self._thread.start()
        atexit.register(self.stop)

    def stop(self) -> None:
        """Stop and wait for a flush in progress to end. Call without holding the lock ``flush`` takes."""
        atexit.unregister(self.stop)
        self._stopped.set()
        if self._thread is not threading.current_thread():
            self._thread.join()


def _run(ref: weakref.ref, flush: Callable[[Any], None], interval_s: float, stopped: threading.Event) -> None:
    while not stopped.wait(interval_s):
        owner = ref()
        if owner is None:
            return
        try:
            flush(owner)
        except Exception:  # a failed flush keeps its rows journaled; the next due flush or a read retries
            logger.exception("background flush failed; the journals keep what it did not write")
        del owner
