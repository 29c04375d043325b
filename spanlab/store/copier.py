"""The copy of the hot store into DuckDB, in the background: one thread, so no write ever waits for a copy.

A write only commits to the hot store (SQLite). This thread runs the store's copy into DuckDB once ``every``
writes have piled up, or when ``interval_s`` passed with anything written, so a process that only writes (a
gateway) keeps DuckDB nearly current and a read finds little left to copy. A read still copies what is left
itself, under the store's lock (copies never overlap, and one that finds DuckDB current does nothing): that is
how it sees every write that returned.

The thread holds the store weakly: a store dropped without ``close`` is collected, and the thread then ends.
"""

from __future__ import annotations

import atexit
import logging
import threading
import weakref
from collections.abc import Callable

from spanlab.errors import StoreError

logger = logging.getLogger(__name__)


class Copier:
    """Runs ``copy`` (a bound method of the store) in a thread of its own, by size or by age."""

    def __init__(self, copy: Callable[[], object], *, name: str, every: int, interval_s: float) -> None:
        self._copy = weakref.WeakMethod(copy)
        self.every = every
        self.interval_s = interval_s
        self._due = threading.Condition()
        self._writes = 0  # since the last copy started
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name=f"spanlab-copy-{name}", daemon=True)
        self._thread.start()
        atexit.register(self.stop)  # a daemon thread inside DuckDB at interpreter exit aborts the process

    def wrote(self) -> None:
        """Count a write; wake the thread once ``every`` have piled up."""
        with self._due:
            self._writes += 1
            if self._writes >= self.every:
                self._due.notify()

    def stop(self) -> None:
        """End the thread; a copy under way finishes first."""
        atexit.unregister(self.stop)
        with self._due:
            self._stopped = True
            self._due.notify()
        if self._thread is not threading.current_thread():
            self._thread.join()

    def _run(self) -> None:
        while True:
            with self._due:
                self._due.wait_for(lambda: self._stopped or self._writes >= self.every, timeout=self.interval_s)
                if self._stopped:
                    return
                if not self._writes:
                    continue
                self._writes = 0
            copy = self._copy()
            if copy is None:  # the store was collected
                return
            try:
                copy()
            except StoreError as exc:  # the next read copies again, and raises it to its caller
                logger.error("background copy into DuckDB failed (a read will try again): %s", exc)
            del copy
