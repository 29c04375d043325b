"""The queue journal: queue transitions durable in a fraction of a millisecond, written to DuckDB in groups.

A DuckDB statement costs 1-2 ms on a small machine and a dequeue or a finish needs 3-4 of them, so the
queue alone cost a rollout ~15-20 ms of store time, and the store server topped out near 50 rollouts/s.
Instead, each transition (a dequeue, a first heartbeat, a finish) is appended to the store's journal
``<db>.journal`` as one JSON record and fsync'd before the call returns (a few tenths of a millisecond): as
durable as a commit. The journal file holds the span journal's batches too (:mod:`spanlab.store.journal_file`),
so a finish and its spans are one append and one fsync.
Handing work out (a dequeue, a first heartbeat) skips its own fsync: the next fsync'd line, the background
writer's sync within a second, or the next write of the tables puts it on disk (see
:mod:`spanlab.store.append_file`); a power cut before that hands the rollout out again. The
store keeps the live state in memory and writes what is pending to the ``rollouts`` and ``attempts``
tables in one transaction (:func:`spanlab.store.queue.write_states`) now and then, before anything reads
those tables, and on close, together with the waiting spans; then the journal file is emptied.

An enqueue is journaled the same way (one line with the new rollouts' whole rows, inserted at the next write
unless already there), so a step's enqueue costs an fsync instead of a DuckDB transaction (~13 ms for 20
rollouts here, most of it the commit).

Each line holds the *resulting* rows, not a change, so writing a line twice changes nothing: a crash
between that transaction's commit and the emptying of the file replays lines that are already in the tables,
harmlessly. A crash mid-append leaves a torn last record, which was never acknowledged and is skipped.

A finish that carries spans (the reward) names them, and is written with them in one append (or, for a batch
too big for the journal, before their insert); on replay a finish whose spans are not all stored is skipped.
So after a crash either both the finish and its spans are there, or neither is: an attempt never ends
succeeded without its reward, and no acknowledged finish is lost. A leftover ``<db>.queue-journal`` (JSON
lines: what versions before the shared journal file wrote) is replayed too (:func:`read_journal`).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from spanlab.errors import StoreError
from spanlab.store.append_file import AppendFile
from spanlab.types import Attempt, Rollout

logger = logging.getLogger(__name__)

# The rollout columns a queue transition changes; the rest (input, config, ...) are written by enqueue.
ROLLOUT_STATE = ("rollout_id", "status", "num_attempts", "start_time", "end_time", "resources_version")


def rollout_state(rollout: Rollout) -> dict[str, Any]:
    return {k: getattr(rollout, k) for k in ROLLOUT_STATE}


class QueueJournal:
    """Pending queue changes: in memory (last state wins per row) and, for a file store, in the journal file
    (which the store empties once everything in it is in the tables)."""

    def __init__(self, file: AppendFile) -> None:
        self.path = file.path
        self.new_rollouts: dict[str, Rollout] = {}  # enqueued, not in the rollouts table yet
        self.rollouts: dict[str, dict[str, Any]] = {}
        self.attempts: dict[str, Attempt] = {}
        self.file = file

    def __len__(self) -> int:
        return len(self.attempts) + len(self.new_rollouts)

    def enqueued(self, rollouts: list[Rollout]) -> None:
        """Make new rollouts durable (on return) and pending for the rollouts table."""
        if self.path is not None:
            self.file.append(_encode({"enqueue": [r.model_dump(mode="json") for r in rollouts]}))
        self.new_rollouts.update((r.rollout_id, r) for r in rollouts)

    def record(self, rollout: Rollout, attempt: Attempt, requires: list[str] | None = None, *,
               sync: bool = True, written: bool = False) -> None:
        """Make ``rollout``'s and ``attempt``'s new state durable (on return) and pending for the tables.

        ``requires``: span IDs this state only holds with (a finish's spans).
        ``sync=False``: written but not fsync'd (see :mod:`spanlab.store.append_file`).
        ``written=True``: already in the file (:meth:`record_body` went out with the finish's spans).
        """
        if self.path is not None and not written:
            self.file.append(self.record_body(rollout, attempt, requires), sync=sync)
        self.rollouts[rollout.rollout_id] = rollout_state(rollout)
        self.attempts[attempt.attempt_id] = attempt

    @staticmethod
    def record_body(rollout: Rollout, attempt: Attempt, requires: list[str] | None = None) -> bytes:
        """The journal record of a transition, for an append that carries more (a finish's spans)."""
        entry: dict[str, Any] = {"rollout": rollout_state(rollout), "attempt": attempt.model_dump(mode="json")}
        if requires:
            entry["requires"] = requires
        return _encode(entry)

    def clear(self) -> None:
        """Forget what is pending: call only once it is committed to the tables."""
        self.new_rollouts.clear()
        self.rollouts.clear()
        self.attempts.clear()


def _encode(entry: dict[str, Any]) -> bytes:
    return json.dumps(entry, separators=(",", ":")).encode()


Entry = tuple[dict[str, Any], Attempt, list[str]]  # (rollout state, attempt, span IDs it requires)


def read_journal(path: Path) -> tuple[list[Rollout], list[Entry]]:
    """A leftover ``<db>.queue-journal`` of earlier versions (JSON lines): (the rollouts its enqueues added, its
    transitions in order); a torn last line is skipped, a corrupt one before it is an error."""
    lines = path.read_bytes().split(b"\n")
    good = []
    for i, raw in enumerate(lines):
        if not raw.strip():
            continue
        try:
            good.append(json.loads(raw))
        except ValueError as exc:
            if i >= len(lines) - 2:  # the last line (a complete one is followed by "\n")
                logger.warning("queue journal %s: skipping a torn last line (%s)", path, exc)
                continue
            raise StoreError(f"queue journal {path} line {i + 1} is corrupt ({exc}); nothing was changed") from exc
    return parse_entries(good, path)


def parse_entries(raw: list[dict[str, Any]], where: Path) -> tuple[list[Rollout], list[Entry]]:
    """Journal records (decoded JSON) as (the rollouts enqueues added, the transitions in order)."""
    new_rollouts: list[Rollout] = []
    entries: list[Entry] = []
    for i, entry in enumerate(raw):
        try:
            if "enqueue" in entry:
                new_rollouts += [Rollout.model_validate(r) for r in entry["enqueue"]]
                continue
            state, attempt = entry["rollout"], Attempt.model_validate(entry["attempt"])
            entries.append(({k: state[k] for k in ROLLOUT_STATE}, attempt, list(entry.get("requires", []))))
        except (ValueError, KeyError, TypeError) as exc:
            raise StoreError(f"journal {where}: queue record {i + 1} does not parse ({exc}); nothing was changed") \
                from exc
    return new_rollouts, entries


def effective_states(
    entries: list[Entry], stored_span_ids: set[str]
) -> tuple[list[dict[str, Any]], list[Attempt]]:
    """What a leftover journal leaves in the tables: per row its last state, skipping every finish whose
    spans were not all stored (it was cut off before they were, so it never happened)."""
    rollouts: dict[str, dict[str, Any]] = {}
    attempts: dict[str, Attempt] = {}
    for state, attempt, requires in entries:
        if any(s not in stored_span_ids for s in requires):
            logger.warning("queue journal: the finish of attempt %s was cut off before its spans were stored; "
                           "the attempt stays open", attempt.attempt_id)
            continue
        rollouts[state["rollout_id"]] = state
        attempts[attempt.attempt_id] = attempt
    return list(rollouts.values()), list(attempts.values())
