"""An append-only file whose appends are durable when they return: what both store journals are made of.

An append may also skip its fsync (``sync=False``): it is in the OS's page cache when it returns, so it
survives the process being killed, and it reaches the disk with the next synced append or :meth:`sync`
(fsync flushes everything written to the file before it). The queue uses that for transitions that only
hand work out (a dequeue, a first heartbeat), whose loss in a power cut hands a rollout out again.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from spanlab.errors import StoreError


class AppendFile:
    """Appends are written and fsync'd before :meth:`append` returns; a failed append leaves no partial
    record in front of the next one. ``path=None`` (a ``:memory:`` store) keeps nothing on disk."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._file = open(path, "ab") if path is not None else None  # noqa: SIM115 - held open for appends
        self._size = self._file.tell() if self._file is not None else 0
        self.dirty = False  # written since the last fsync

    def append(self, *parts: bytes | memoryview, sync: bool = True) -> None:
        if self._file is None:
            return
        try:
            for part in parts:
                self._file.write(part)
            self._file.flush()
            if sync:
                os.fdatasync(self._file.fileno())
        except OSError as exc:
            with contextlib.suppress(OSError):
                self._file.truncate(self._size)
            raise StoreError(f"cannot write {self.path}: {exc}; nothing of this write was stored") from exc
        self._size += sum(memoryview(p).nbytes for p in parts)
        self.dirty = not sync

    def sync(self) -> None:
        """Put appends written without fsync on disk."""
        if self._file is not None and self.dirty:
            try:
                os.fdatasync(self._file.fileno())
            except OSError as exc:
                raise StoreError(f"cannot sync {self.path}: {exc}") from exc
            self.dirty = False

    def clear(self) -> None:
        """Empty the file. No fsync: its users replay records already applied harmlessly."""
        if self._file is not None:
            self._file.truncate(0)
            self._size = 0
            self.dirty = False

    def close(self, *, remove: bool) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
            if remove and self.path is not None:
                self.path.unlink(missing_ok=True)
