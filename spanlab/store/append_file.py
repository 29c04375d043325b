"""An append-only file whose appends are durable when they return: what the store's journal is made of.

Records are framed (length of the body, CRC-32 of the body), so a reader after a crash can tell the records
from what follows them (:func:`scan_frames`). An append may skip its fsync (``sync=False``): it is in the OS's
page cache when it returns, so it survives the process being killed, and it reaches the disk with the next
synced append or :meth:`AppendFile.sync` (fsync flushes everything written to the file before it). The queue
uses that for transitions that only hand work out (a dequeue, a first heartbeat), whose loss in a power cut
hands a rollout out again.

**Why the file is reused, not truncated.** An fsync that must also commit a new file size (an append at the
end) costs two disk flushes here; one that only overwrites blocks the file already has costs one (a ~100 KB
finish: ~0.6 -> ~0.35 ms). So the file is kept: zeros are written ahead of the records (space fallocate'd
without writing is "unwritten" to ext4, and writing into it is a metadata change again), and emptying the file
(:meth:`AppendFile.clear`) starts a new *generation* instead of truncating: the header at byte 0 holds the
generation number, and every record's CRC is seeded with it. Records of an earlier generation that still lie
further on fail their CRC, and reading stops there. Files of earlier versions (no header, plain CRCs, the
records end at the file's end) are read too.
"""

from __future__ import annotations

import contextlib
import logging
import os
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spanlab.errors import StoreError

logger = logging.getLogger(__name__)
_FRAME = struct.Struct("<QI")  # a record: body length, CRC-32 of the body (seeded by the generation); the body
_HEADER = struct.Struct("<8sQ")  # a file: MAGIC, generation
MAGIC = b"spanlabJ"
PREALLOC_MIN = 1024 * 1024  # zeros written ahead of the records: the first step, doubling up to the max
PREALLOC_MAX = 8 * 1024 * 1024


def _seed(generation: int) -> int:
    return zlib.crc32(generation.to_bytes(8, "little"))


def framed(body: Any, seed: int = 0) -> list[bytes | memoryview]:
    """A record's parts (frame header, then the body); ``body``: bytes, any buffer, or a list of them (one
    record written from several buffers, without joining them). ``seed=0``: the plain CRC of files without a
    header (what versions before generations wrote)."""
    views = [memoryview(part) for part in (body if isinstance(body, list) else [body])]
    crc = seed
    for view in views:
        crc = zlib.crc32(view, crc)
    return [_FRAME.pack(sum(v.nbytes for v in views), crc), *views]


@dataclass
class Frames:
    bodies: list[bytes]
    end: int  # where the last good record ends
    complete: bool  # False: a bad record with good ones after it (corruption, not a torn or stale tail)


def scan_frames(data: bytes, source: str = "journal") -> Frames:
    """The records of a journal file's bytes. With a header (:data:`MAGIC`), reading stops at the first record
    that fails its CRC (torn, an earlier generation's, or zeros); it is corruption if a good record follows it.
    Without one (older files), the records run to the end of the file and a bad record before the end is
    corruption. ``source`` names the file in the log."""
    versioned = data[:8] == MAGIC and len(data) >= _HEADER.size
    seed = _seed(_HEADER.unpack_from(data)[1]) if versioned else 0
    pos = _HEADER.size if versioned else 0
    bodies: list[bytes] = []
    while pos < len(data):
        body, end = _frame(data, pos, seed)
        if body is None:
            break
        bodies.append(body)
        pos = end
    else:
        return Frames(bodies, pos, True)
    # a bad record at pos: the end of the records, or corruption if good ones follow
    if versioned:
        corrupt = end < len(data) and _frame(data, end, seed)[0] is not None
    else:
        corrupt = end < len(data)
        if not corrupt:
            logger.warning("%s: dropping a torn last record (%d bytes)", source, len(data) - pos)
    if corrupt:
        logger.error("%s: the record at byte %d is corrupt and more follow", source, pos)
    return Frames(bodies, pos, not corrupt)


def _frame(data: bytes, pos: int, seed: int) -> tuple[bytes | None, int]:
    """(the body of the record at ``pos`` if it is good, where it ends by its length field)."""
    start = pos + _FRAME.size
    if start > len(data):
        return None, len(data)
    size, crc = _FRAME.unpack_from(data, pos)
    end = start + size
    if size == 0 or end > len(data):  # a record is never empty: zeros are no record
        return None, min(end, len(data)) if size else len(data)
    body = data[start:end]
    return (body if zlib.crc32(body, seed) == crc else None), end


def read_frames(path: Path) -> tuple[list[bytes], bool]:
    """(the record bodies of a journal file, whether all of it was readable): see :func:`scan_frames`."""
    frames = scan_frames(path.read_bytes(), f"journal {path}")
    return frames.bodies, frames.complete


class AppendFile:
    """Appends are written and fsync'd before :meth:`append` returns; a failed append leaves no partial
    record in front of the next one. ``path=None`` (a ``:memory:`` store) keeps nothing on disk."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.dirty = False  # written since the last fsync
        self._file = None
        self._generation = 1
        self._size = self._allocated = 0  # end of the records; end of the file (zeros or stale records between)
        if path is None:
            return
        if path.exists() and path.stat().st_size:
            raise StoreError(f"{path} exists: a journal must be replayed before it is written again")
        self._file = open(path, "w+b")  # noqa: SIM115 - held open for appends
        self._start_generation()

    def _start_generation(self) -> None:
        """Write the header (not fsync'd: the next synced append puts it on disk; until then the file on disk
        holds the last generation, already in the tables, whose replay is harmless)."""
        assert self._file is not None
        self._file.seek(0)
        self._file.write(_HEADER.pack(MAGIC, self._generation))
        self._seed = _seed(self._generation)
        self._size = _HEADER.size
        self._allocated = max(self._allocated, self._size)

    def append(self, *bodies: bytes | memoryview | list[bytes | memoryview], sync: bool = True) -> None:
        """Append one record per body (in one write, one fsync); a body given as a list is one record."""
        if self._file is None:
            return
        parts = [part for body in bodies for part in framed(body, self._seed)]
        end = self._size + sum(memoryview(p).nbytes for p in parts)
        try:
            self._file.seek(self._size)
            for part in parts:
                self._file.write(part)
            if end > self._allocated:
                self._allocated = end + min(max(PREALLOC_MIN, self._allocated), PREALLOC_MAX)
                self._file.write(bytes(self._allocated - end))
            self._file.flush()
            if sync:
                os.fdatasync(self._file.fileno())
        except OSError as exc:
            with contextlib.suppress(OSError):
                self._file.truncate(self._size)  # the partial record, and what lay after it, go
            self._allocated = self._size
            raise StoreError(f"cannot write {self.path}: {exc}; nothing of this write was stored") from exc
        self._size = end
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
        """Empty the file: a new generation. No fsync: its users replay records already applied harmlessly."""
        if self._file is not None:
            self._generation += 1
            self._start_generation()
            self._file.flush()

    def close(self, *, remove: bool) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
            if remove and self.path is not None:
                self.path.unlink(missing_ok=True)


def count_records(path: Path) -> int:
    """How many good records a journal file holds (0 if it is missing): the file's size says nothing, it is
    reused and preallocated."""
    return len(read_frames(path)[0]) if path.exists() else 0
