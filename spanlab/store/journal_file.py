"""The store's journal file, ``<db>.journal``: everything acknowledged that the tables do not hold yet.

Span batches (Arrow IPC streams or typed spans' columns, :mod:`spanlab.store.span_journal`) and queue changes (JSON,
:mod:`spanlab.store.journal`) are framed records in one append-only file (:mod:`spanlab.store.append_file`),
in the order they happened. A finish and its spans are therefore one append and one fsync; with a file per
journal they were two (~0.9 ms each on a rollout's finish here). The store writes both kinds to the tables
together (the spans, then the queue states, each in its own transaction) and only then empties the file, so
the file always holds everything since the tables were last current, and replaying it is harmless. Emptying
the file starts a new generation in it rather than truncating it, so appends overwrite blocks the file already
has and their fsync commits no new size (:mod:`spanlab.store.append_file`).

On open, a leftover journal is read back (:func:`read_leftovers`): its spans are inserted unless already
there, then its queue changes are written. A torn last record (never acknowledged) is dropped. A file with a
corrupt record before its end is kept aside (``<name>.unreadable-<time>``) after what precedes the bad record
is written, never deleted. Journals of earlier versions (``<db>.span-journal``: the same records, spans only;
``<db>.queue-journal``: JSON lines) are read the same way.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from spanlab.errors import StoreError
from spanlab.store.append_file import read_frames
from spanlab.store.journal import Entry, parse_entries, read_journal
from spanlab.store.span_journal import decode_spans
from spanlab.types import Rollout

SUFFIX = ".journal"
_OLD_SPANS, _OLD_QUEUE = ".span-journal", ".queue-journal"


@dataclass
class Leftovers:
    """What journals left on disk hold, in the order it happened."""

    spans: pa.Table | None = None
    new_rollouts: list[Rollout] = field(default_factory=list)
    entries: list[Entry] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)  # every journal file read
    unreadable: list[Path] = field(default_factory=list)  # of those, the ones with a corrupt record before the end


def read_leftovers(db_path: str) -> Leftovers:
    """Read every journal file a store on ``db_path`` left behind (none: an empty :class:`Leftovers`)."""
    left = Leftovers()
    span_bodies: list[bytes] = []
    queue_records: list[dict[str, Any]] = []
    old_queue = Path(db_path + _OLD_QUEUE)
    if old_queue.exists():  # older than anything in the other files
        left.files.append(old_queue)
        left.new_rollouts, left.entries = read_journal(old_queue)
    for path in (Path(db_path + _OLD_SPANS), Path(db_path + SUFFIX)):
        if not path.exists():
            continue
        left.files.append(path)
        bodies, complete = read_frames(path)
        if not complete:
            left.unreadable.append(path)
        for body in bodies:
            if body[:1] == b"{":
                queue_records.append(_json(body, path))
            else:
                span_bodies.append(body)
    new_rollouts, entries = parse_entries(queue_records, Path(db_path + SUFFIX))
    left.new_rollouts += new_rollouts
    left.entries += entries
    if span_bodies:
        try:
            left.spans = decode_spans(span_bodies)
        except pa.ArrowException as exc:
            raise StoreError(f"journal of {db_path}: a span record passed its checksum but does not parse ({exc}); "
                             "nothing was changed") from exc
    return left


def _json(body: bytes, path: Path) -> dict[str, Any]:
    try:
        return json.loads(body)
    except ValueError as exc:
        raise StoreError(f"journal {path}: a queue record passed its checksum but is not JSON ({exc}); "
                         "nothing was changed") from exc
