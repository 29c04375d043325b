"""What span ingest checks before anything is written, and the attempt index that keeps it cheap.

A batch is all-or-nothing: every check runs on the Arrow batch before the insert, so a bad span names
itself and the rest of its batch is not half-stored. The :class:`AttemptIndex` remembers, per recently seen attempt,
its rollout, its stored span IDs and its last sequence number, so ingest asks DuckDB once per attempt
instead of once per span (a DuckDB point query costs milliseconds; REFERENCE.md §8).
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from dataclasses import dataclass, field

import duckdb

from spanlab.errors import InvalidSpanError
from spanlab.store.schema import JSON_SPAN_COLUMNS
from spanlab.store.span_columns import (
    SpanBatch,
    byte_lengths,
    column,
    take_rows,
    token_counts,
    with_sequence_ids,
)


def check_batch(batch: SpanBatch, max_tokens_per_span: int, max_json_bytes: int) -> None:
    """Limits that protect the store: no span_id twice in a batch, no span over the token or JSON limit.
    ``batch``: an Arrow table or :class:`~spanlab.store.span_columns.SpanColumns` (the same rules, messages)."""
    ids = column(batch, "span_id")
    if len(set(ids)) != len(ids):
        counts = Counter(ids)
        dup = next(s for s in ids if counts[s] > 1)
        raise InvalidSpanError(f"span_id {dup!r} appears twice in the batch; nothing stored")
    n_tokens = token_counts(batch)
    biggest = int(n_tokens.max()) if len(n_tokens) else 0
    if biggest > max_tokens_per_span:
        i = int(n_tokens.argmax())
        raise InvalidSpanError(
            f"span #{i} ({ids[i]}): {biggest} token IDs exceed max_tokens_per_span={max_tokens_per_span}; "
            "nothing stored"
        )
    for col in JSON_SPAN_COLUMNS:
        lengths = byte_lengths(batch, col)
        if lengths is not None and lengths.max() > max_json_bytes:
            i = int(lengths.argmax())
            raise InvalidSpanError(
                f"span #{i} ({ids[i]}): `{col}` is {lengths[i]} bytes of JSON, "
                f"over max_json_bytes={max_json_bytes}; nothing of this batch was stored"
            )


@dataclass
class AttemptState:
    rollout_id: str | None
    last_seq: int = -1
    span_ids: set[str] = field(default_factory=set)

    def next_sequence_id(self, given: int | None) -> int:
        """``given``, or the next number of the attempt when the span left it empty."""
        self.last_seq = self.last_seq + 1 if given is None else max(self.last_seq, given)
        return self.last_seq if given is None else given


class AttemptIndex:
    """Bounded LRU of attempt states. Unattributed spans (attempt None) keep only a counter, and are
    deduplicated against DuckDB, so a gateway serving unattributed traffic for days does not grow it."""

    def __init__(self, capacity: int = 4096) -> None:
        self.capacity = capacity
        self._states: OrderedDict[str | None, AttemptState] = OrderedDict()

    def add_attempt(self, attempt_id: str, rollout_id: str) -> None:
        self._put(attempt_id, AttemptState(rollout_id))

    def knows(self, attempt_ids: list[str | None]) -> bool:
        """Whether every attempt (None: unattributed spans) is in the index, so ingest reads no table."""
        return all(a in self._states for a in attempt_ids)

    def states_for(
        self, conn: duckdb.DuckDBPyConnection, pairs: dict[str | None, str | None]
    ) -> dict[str | None, AttemptState]:
        """State of each ``attempt_id -> rollout_id`` pair; an unknown or mismatched attempt is an error."""
        missing = [a for a in pairs if a not in self._states]
        if missing:
            self._load(conn, missing)
        states = {}
        for attempt_id, rollout_id in pairs.items():
            state = self._states.get(attempt_id)
            if state is None:
                raise InvalidSpanError(f"unknown attempt_id {attempt_id!r} (rollout {rollout_id!r}); nothing stored")
            if state.rollout_id != rollout_id:
                raise InvalidSpanError(
                    f"attempt {attempt_id!r} belongs to rollout {state.rollout_id!r}, not {rollout_id!r}; "
                    "nothing stored"
                )
            self._states.move_to_end(attempt_id)
            states[attempt_id] = state
        return states

    def new_rows(self, conn: duckdb.DuckDBPyConnection, batch: SpanBatch, buffered: set[str]) -> SpanBatch:
        """The rows not stored yet, with sequence numbers filled in.

        A retried write is skipped instead of duplicated. Nothing is remembered until :meth:`mark_stored`, so
        a failed insert leaves the index as it was (except sequence numbers, where a gap is harmless).
        ``buffered``: IDs of unattributed spans stored but not in the table yet (the span journal's);
        unattributed spans are checked against the table and them.
        """
        span_ids = column(batch, "span_id")
        attempt_ids = column(batch, "attempt_id")
        states = self.states_for(conn, dict(zip(attempt_ids, column(batch, "rollout_id"), strict=True)))
        stored_unattributed: set[str] = set()
        if None in states:
            rows = conn.execute(
                "SELECT span_id FROM spans WHERE attempt_id IS NULL AND span_id IN (SELECT unnest(?::VARCHAR[]))",
                [[s for s, a in zip(span_ids, attempt_ids, strict=True) if a is None]],
            ).fetchall()
            stored_unattributed = {r[0] for r in rows} | buffered
        keep, seqs = [], []
        for i, (span_id, attempt_id, given) in enumerate(
            zip(span_ids, attempt_ids, column(batch, "sequence_id"), strict=True)
        ):
            stored = stored_unattributed if attempt_id is None else states[attempt_id].span_ids
            if span_id not in stored:
                keep.append(i)
                seqs.append(states[attempt_id].next_sequence_id(given))
        if len(keep) != batch.num_rows:
            batch = take_rows(batch, keep)
        return with_sequence_ids(batch, seqs)

    def mark_stored(self, batch: SpanBatch) -> None:
        for span_id, attempt_id in zip(column(batch, "span_id"), column(batch, "attempt_id"), strict=True):
            if attempt_id is not None and (state := self._states.get(attempt_id)) is not None:
                state.span_ids.add(span_id)

    def _load(self, conn: duckdb.DuckDBPyConnection, attempt_ids: list[str | None]) -> None:
        named = [a for a in attempt_ids if a is not None]
        rows = conn.execute(
            "SELECT attempt_id, rollout_id FROM attempts WHERE attempt_id IN (SELECT unnest(?::VARCHAR[]))", [named]
        ).fetchall()
        found: dict[str | None, AttemptState] = {a: AttemptState(r) for a, r in rows}
        if found:
            for attempt_id, span_id, seq in conn.execute(
                "SELECT attempt_id, span_id, sequence_id FROM spans WHERE attempt_id IN (SELECT unnest(?::VARCHAR[]))",
                [list(found)],
            ).fetchall():
                found[attempt_id].span_ids.add(span_id)
                found[attempt_id].last_seq = max(found[attempt_id].last_seq, seq)
        if None in attempt_ids:
            (last,) = conn.execute("SELECT max(sequence_id) FROM spans WHERE attempt_id IS NULL").fetchone()
            found[None] = AttemptState(None, last_seq=-1 if last is None else last)
        for attempt_id, state in found.items():
            self._put(attempt_id, state)

    def _put(self, attempt_id: str | None, state: AttemptState) -> None:
        self._states[attempt_id] = state
        self._states.move_to_end(attempt_id)
        while len(self._states) > self.capacity:
            self._states.popitem(last=False)
