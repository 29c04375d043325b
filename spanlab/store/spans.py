"""The ``spans`` table: the store's limits on a batch, the insert the writer runs, the SQL of span reads.

A batch reaching :func:`insert` already passed its rules (the pydantic models, for typed spans and Arrow
rows alike: :mod:`.arrow`) and :func:`check_limits`. What only the database can tell is decided here, in the writer's
transaction: that every attempt exists and belongs to the span's rollout, which span IDs the attempt
stored already (a retried write is skipped, not duplicated), and the next ``sequence_id`` of spans that
left it empty. Then one INSERT of the Arrow table.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spanlab.errors import InvalidSpanError
from spanlab.store.schema import JSON_SPAN_COLUMNS
from spanlab.store.writer import Batchable

ORDER = ("rollout_id", "attempt_id", "sequence_id")
_IN = "IN (SELECT unnest(?::VARCHAR[]))"


def check_limits(tbl: pa.Table, max_tokens_per_span: int, max_json_bytes: int) -> None:
    """Limits that protect the store: no span_id twice in a batch, no span over the token or JSON limit."""
    ids = tbl["span_id"].to_pylist()
    if len(set(ids)) != len(ids):
        dup = next(s for s, n in Counter(ids).items() if n > 1)
        raise InvalidSpanError(f"span_id {dup!r} appears twice in the batch; nothing stored")
    n_tokens = (_lengths(tbl["prompt_token_ids"]) + _lengths(tbl["response_token_ids"]))
    if len(n_tokens) and n_tokens.max() > max_tokens_per_span:
        i = int(n_tokens.argmax())
        raise InvalidSpanError(f"span #{i} ({ids[i]}): {n_tokens[i]} token IDs exceed "
                               f"max_tokens_per_span={max_tokens_per_span}; nothing stored")
    for col in JSON_SPAN_COLUMNS:
        if tbl[col].null_count == tbl.num_rows:
            continue
        lengths = pc.binary_length(tbl[col]).fill_null(0).to_numpy()
        if lengths.max() > max_json_bytes:
            i = int(lengths.argmax())
            raise InvalidSpanError(f"span #{i} ({ids[i]}): `{col}` is {lengths[i]} bytes of JSON, "
                                   f"over max_json_bytes={max_json_bytes}; nothing of this batch was stored")


def _lengths(col: pa.ChunkedArray) -> np.ndarray:
    return pc.fill_null(pc.list_value_length(col), 0).to_numpy()


class Insert(Batchable):
    """One caller's span batch for the writer (its result: the span_ids it stored, the rest were stored
    already); batches queued together are inserted as one table."""

    def __init__(self, tbl: pa.Table) -> None:
        self.tbl = tbl

    @classmethod
    def run_many(cls, cur: duckdb.DuckDBPyConnection, writes: list[Insert]) -> list[list[str]]:
        tbl = pa.concat_tables([w.tbl for w in writes]) if len(writes) > 1 else writes[0].tbl
        kept, ids, start = set(_insert_rows(cur, tbl)), tbl["span_id"].to_pylist(), 0
        out = []
        for w in writes:
            out.append([ids[i] for i in range(start, start + w.tbl.num_rows) if i in kept])
            start += w.tbl.num_rows
        return out


def _insert_rows(cur: duckdb.DuckDBPyConnection, tbl: pa.Table) -> list[int]:
    """Insert the rows of ``tbl`` not stored yet; returns their row numbers."""
    span_ids = tbl["span_id"].to_pylist()
    attempt_ids = tbl["attempt_id"].to_pylist()
    rollout_ids = tbl["rollout_id"].to_pylist()
    named = sorted({a for a in attempt_ids if a is not None})
    owners: dict[str | None, str] = {}
    stored: set[tuple[str, str | None]] = set()
    last: dict[str | None, int] = {}
    # one statement for the attempts' rollouts, their stored span IDs and last sequence numbers
    for attempt_id, rollout_id, span_id, seq in cur.execute(
        f"SELECT a.attempt_id, a.rollout_id, s.span_id, s.sequence_id FROM attempts a "
        f"LEFT JOIN spans s ON s.attempt_id = a.attempt_id WHERE a.attempt_id {_IN}", [named]
    ).fetchall() if named else ():
        owners[attempt_id] = rollout_id
        if span_id is not None:
            stored.add((span_id, attempt_id))
            last[attempt_id] = max(last.get(attempt_id, seq), seq)
    for attempt_id, rollout_id in dict(zip(attempt_ids, rollout_ids, strict=True)).items():
        if attempt_id is None:
            continue
        if attempt_id not in owners:
            raise InvalidSpanError(f"unknown attempt_id {attempt_id!r} (rollout {rollout_id!r}); nothing stored")
        if owners[attempt_id] != rollout_id:
            raise InvalidSpanError(f"attempt {attempt_id!r} belongs to rollout {owners[attempt_id]!r}, "
                                   f"not {rollout_id!r}; nothing stored")
    if None in attempt_ids:  # unattributed spans: deduplicated against the other unattributed ones
        stored |= set(cur.execute(f"SELECT span_id, attempt_id FROM spans WHERE attempt_id IS NULL AND span_id {_IN}",
                                  [span_ids]).fetchall())
        ((last[None],),) = cur.execute("SELECT max(sequence_id) FROM spans WHERE attempt_id IS NULL").fetchall()
    keep, seqs = [], []
    for i, (span_id, attempt_id, given) in enumerate(
        zip(span_ids, attempt_ids, tbl["sequence_id"].to_pylist(), strict=True)
    ):
        if (span_id, attempt_id) in stored:
            continue
        stored.add((span_id, attempt_id))
        prev = last.get(attempt_id)
        seq = (0 if prev is None else prev + 1) if given is None else given
        last[attempt_id] = seq if prev is None else max(prev, seq)
        keep.append(i)
        seqs.append(seq)
    if not keep:
        return []
    if len(keep) != tbl.num_rows:
        tbl = tbl.take(pa.array(keep, pa.int64()))
    idx = tbl.schema.get_field_index("sequence_id")
    tbl = tbl.set_column(idx, tbl.schema.field(idx), pa.array(seqs, pa.int32()))
    cur.from_arrow(tbl).insert_into("spans")  # columns by position: SPAN_ARROW_SCHEMA follows the table (tested)
    return keep


def select(lists: dict[str, Sequence[str] | None], cols: Sequence[str]) -> tuple[str, list[Any]]:
    """The SQL of a span read: ``cols`` of the rows whose columns are in the given lists (None: any), in
    attempt and sequence order."""
    parts = [(f"{k} {_IN}", list(v)) for k, v in lists.items() if v is not None]
    where = ("WHERE " + " AND ".join(p for p, _ in parts)) if parts else ""
    return f"SELECT {', '.join(cols)} FROM spans {where} ORDER BY {', '.join(ORDER)}", [v for _, v in parts]
