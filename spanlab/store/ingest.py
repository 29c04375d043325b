"""What span ingest checks before anything is written, and the attempt index that keeps it cheap.

A batch is all-or-nothing: every check runs before the insert, so a bad span names itself and the
rest of its batch is not half-stored. The :class:`AttemptIndex` remembers, per recently seen attempt,
its rollout, its stored span IDs and its last sequence number, so ingest asks DuckDB once per attempt
instead of once per span (a DuckDB point query costs milliseconds; REFERENCE.md §8).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from spanlab.errors import InvalidSpanError
from spanlab.types import Span

JSON_COLUMNS = ("attributes", "request_messages", "request_tools", "response_message")


def check_batch(spans: Sequence[Span], max_tokens_per_span: int) -> None:
    """No span_id twice in one batch; no span over the token limit."""
    seen: set[str] = set()
    for i, s in enumerate(spans):
        if s.span_id in seen:
            raise InvalidSpanError(f"span #{i}: span_id {s.span_id!r} appears twice in the batch")
        seen.add(s.span_id)
        if s.llm is not None:
            n = len(s.llm.prompt_token_ids) + len(s.llm.response_token_ids)
            if n > max_tokens_per_span:
                raise InvalidSpanError(
                    f"span #{i} ({s.span_id}): {n} token IDs exceed max_tokens_per_span={max_tokens_per_span}"
                )


def check_json_sizes(tbl: pa.Table, max_json_bytes: int) -> None:
    """Measured on the serialized Arrow columns, so the limit is on what would really be stored."""
    for col in JSON_COLUMNS:
        lengths = pc.binary_length(tbl[col])
        biggest = pc.max(lengths).as_py()
        if biggest is not None and biggest > max_json_bytes:
            i = pc.index(lengths, biggest).as_py()
            raise InvalidSpanError(
                f"span #{i} ({tbl['span_id'][i].as_py()}): `{col}` is {biggest} bytes of JSON, "
                f"over max_json_bytes={max_json_bytes}; nothing of this batch was stored"
            )


@dataclass
class AttemptState:
    rollout_id: str | None
    last_seq: int = -1
    span_ids: set[str] = field(default_factory=set)

    def assign_sequence_id(self, span: Span) -> None:
        """Fill a missing ``sequence_id`` with the next number of the attempt."""
        if span.sequence_id is None:
            self.last_seq += 1
            span.sequence_id = self.last_seq
        else:
            self.last_seq = max(self.last_seq, span.sequence_id)


class AttemptIndex:
    """Bounded LRU of attempt states. Unattributed spans (attempt None) keep only a counter, and are
    deduplicated against DuckDB, so a gateway serving unattributed traffic for days does not grow it."""

    def __init__(self, capacity: int = 4096) -> None:
        self.capacity = capacity
        self._states: OrderedDict[str | None, AttemptState] = OrderedDict()

    def add_attempt(self, attempt_id: str, rollout_id: str) -> None:
        self._put(attempt_id, AttemptState(rollout_id))

    def states_for(self, conn: duckdb.DuckDBPyConnection, spans: Sequence[Span]) -> dict[str | None, AttemptState]:
        """State of every attempt the batch names; an unknown or mismatched attempt is an error."""
        wanted = {s.attempt_id: s.rollout_id for s in spans}
        missing = [a for a in wanted if a not in self._states]
        if missing:
            self._load(conn, missing)
        states = {}
        for attempt_id, rollout_id in wanted.items():
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

    def new_spans(self, conn: duckdb.DuckDBPyConnection, spans: Sequence[Span]) -> list[Span]:
        """The spans not stored yet: a retried write is skipped instead of duplicated."""
        states = self.states_for(conn, spans)
        unattributed = [s.span_id for s in spans if s.attempt_id is None]
        stored_unattributed: set[str] = set()
        if unattributed:
            rows = conn.execute(
                "SELECT span_id FROM spans WHERE attempt_id IS NULL AND span_id IN (SELECT unnest(?::VARCHAR[]))",
                [unattributed],
            ).fetchall()
            stored_unattributed = {r[0] for r in rows}
        fresh = [
            s for s in spans
            if s.span_id not in (stored_unattributed if s.attempt_id is None else states[s.attempt_id].span_ids)
        ]
        for s in fresh:
            states[s.attempt_id].assign_sequence_id(s)
        return fresh

    def mark_stored(self, spans: Sequence[Span]) -> None:
        for s in spans:
            if s.attempt_id is not None and (state := self._states.get(s.attempt_id)) is not None:
                state.span_ids.add(s.span_id)

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
