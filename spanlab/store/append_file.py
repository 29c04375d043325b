"""An append-only file whose appends are durable when they return: what the store's journal is made of.

Records are framed (:func:`framed`: body length, CRC-32 of the body), so a reader after a crash can tell a
torn last record (never acknowledged: dropped) from a corrupt one with more after it (:func:`read_frames`).

An append may also skip its fsync (``sync=False``): it is in the OS's page cache when it returns, so it
survives the process being killed, and it reaches the disk with the next synced append or :meth:`sync`
(fsync flushes everything written to the file before it). The queue uses that for transitions that only
hand work out (a dequeue, a first heartbeat), whose loss in a power cut hands a rollout out again.
"""

from __future__ import annotations

import contextlib
import logging
import os
import struct
import zlib
from pathlib import Path
from typing import Any

from spanlab.errors import StoreError

logger = logging.getLogger(__name__)
_FRAME = struct.Struct("<QI")  # a record: body length, CRC-32 of the body; then the body


def framed(body: Any) -> tuple[bytes, memoryview]:
    """A record's parts (header, body) for :meth:`AppendFile.append`; ``body``: bytes or any buffer."""
    view = memoryview(body)
    return _FRAME.pack(view.nbytes, zlib.crc32(view)), view


def read_frames(path: Path) -> tuple[list[bytes], bool]:
    """(the record bodies of a framed file, whether all of it was readable). A torn last record (cut short,
    or its checksum wrong: never acknowledged) is dropped; at a bad record with more after it reading stops."""
    data = path.read_bytes()
    bodies: list[bytes] = []
    pos = 0
    while pos < len(data):
        start = pos + _FRAME.size
        size, crc = _FRAME.unpack_from(data, pos) if start <= len(data) else (len(data), 0)
        end = start + size
        body = data[start:end]
        if end <= len(data) and zlib.crc32(body) == crc:
            bodies.append(body)
            pos = end
            continue
        if end >= len(data):
            logger.warning("journal %s: dropping a torn last record (%d bytes)", path, len(data) - pos)
            return bodies, True
        logger.error("journal %s: record at byte %d is corrupt and more follow", path, pos)
        return bodies, False
    return bodies, True


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
