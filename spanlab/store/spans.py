"""The ``spans`` table: the one gate every span passes, its Arrow form and back, the insert the writer runs.

The span rules are the pydantic models of ``spanlab/types.py``, and only those: typed spans are checked when
built, an Arrow batch (the wire format) row by row in :func:`table_to_spans`, token columns as NumPy views (no
Python int per token). A batch becomes one Arrow table (:func:`spans_to_arrow`), stored as one blob (copied
into DuckDB later: ``hot.py``), within :func:`check_limits`. What only the database can tell is decided by
:func:`insert`, in the writer's transaction: that every attempt exists and belongs to the span's rollout,
which span IDs it stored already (a retried write is skipped, not duplicated), and the next ``sequence_id``
of spans that left it empty.
"""

from __future__ import annotations

import sqlite3
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import ValidationError

from spanlab.errors import InvalidSpanError
from spanlab.store.hot import IN_JSON
from spanlab.store.schema import JSON_SPAN_COLUMNS, REQUIRED_SPAN_COLUMNS, SPAN_ARROW_SCHEMA, dumps, loads
from spanlab.store.wire import table_to_bytes
from spanlab.types import ACTIVE_ATTEMPT_STATUSES, LATE_ATTRIBUTE, Span
from spanlab.vectors import list_column, list_rows

_LIST_TYPES: dict[str, type] = {"prompt_token_ids": np.int32, "response_token_ids": np.int32,
                                "response_logprobs": np.float32, "loss_mask": np.uint8}
_TOP = ("span_id", "rollout_id", "attempt_id", "sequence_id", "parent_id", "name", "kind", "start_time", "end_time",
        "status")
_LLM = ("model", "request_messages", "request_tools", "response_message", "finish_reason", *_LIST_TYPES)
_USAGE = ("prompt_tokens", "completion_tokens", "total_tokens")
_REWARD = {"reward_name": "name", "reward_value": "value", "reward_call_span_id": "call_span_id"}


def as_model(model: type, value: Any, index: int) -> Any:
    """Accept a model instance or a dict; turn pydantic's error into one line that names the item."""
    if isinstance(value, model):
        return value
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        key = "span_id" if model is Span else "rollout_id"
        ident = value.get(key) if isinstance(value, dict) else None
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'span'}: {e['msg']}" for e in exc.errors())
        named = f" ({ident})" if ident is not None else ""
        raise InvalidSpanError(f"{model.__name__.lower()} #{index}{named} is invalid: {problems}; "
                               "nothing of this batch was stored") from None


def conform(tbl: pa.Table) -> pa.Table:
    """Reorder and cast ``tbl`` to the span schema; absent optional columns become nulls."""
    if tbl.schema.equals(SPAN_ARROW_SCHEMA):  # what spans_to_arrow and StoreClient send: nothing to do
        return tbl
    names = set(tbl.column_names)
    if unknown := names - set(SPAN_ARROW_SCHEMA.names):
        raise InvalidSpanError(f"unknown span columns {sorted(unknown)}; nothing stored")
    if missing := [c for c in REQUIRED_SPAN_COLUMNS if c not in names]:
        raise InvalidSpanError(f"span batch lacks required columns {missing}; nothing stored")
    arrays = []
    for field in SPAN_ARROW_SCHEMA:
        col = tbl[field.name] if field.name in names else pa.nulls(tbl.num_rows, field.type)
        try:
            arrays.append(col.cast(field.type) if col.type != field.type else col)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise InvalidSpanError(f"span column `{field.name}` has type {col.type}, expected {field.type}: "
                                   f"{exc}; nothing stored") from exc
    return pa.Table.from_arrays(arrays, schema=SPAN_ARROW_SCHEMA)


def table_to_spans(tbl: pa.Table) -> list[Span]:
    """Each row of an Arrow span batch (any subset of the optional columns) validated as a ``Span``."""
    tbl = conform(tbl)
    rows = tbl.drop_columns(list(_LIST_TYPES)).to_pylist()
    lists = {name: list_rows(tbl[name]) for name in _LIST_TYPES}
    return [row_to_span(row | {k: v[i] for k, v in lists.items()}, i) for i, row in enumerate(rows)]


def row_to_span(row: dict[str, Any], index: int = 0) -> Span:
    """One row of the ``spans`` table (token columns as lists or NumPy arrays) as a validated ``Span``: the
    inverse of :func:`spans_to_arrow`, for rows arriving (``table_to_spans``) and rows read back alike."""
    for name in JSON_SPAN_COLUMNS:
        try:
            row[name] = loads(row[name])
        except ValueError as exc:
            raise InvalidSpanError(f"span #{index} ({row['span_id']}): `{name}` is not valid JSON ({exc}); nothing "
                                   "of this batch was stored") from None
    span: dict[str, Any] = {k: row[k] for k in _TOP} | {"attributes": row["attributes"] or {}}
    llm, usage = {k: row[k] for k in _LLM}, {k: row[k] for k in _USAGE}
    if row["kind"] == "llm_call" or any(v is not None for v in llm.values()) or row["prompt_tokens"] is not None:
        span["llm"] = {k: v for k, v in llm.items() if v is not None} | {"model": row["model"]}
        if any(v is not None for v in usage.values()):
            span["llm"]["usage"] = usage
    if row["kind"] == "reward" or row["reward_value"] is not None or row["reward_call_span_id"] is not None:
        span["reward"] = {v: row[k] for k, v in _REWARD.items()} | {"name": row["reward_name"] or "reward"}
    return as_model(Span, span, index)


def spans_to_arrow(spans: Sequence[Span | dict[str, Any]]) -> pa.Table:
    """Spans (dicts validated as ``Span`` first) as one Arrow table with the span schema (token IDs copied once)."""
    spans = [as_model(Span, s, i) for i, s in enumerate(spans)]
    llms = [s.llm for s in spans]
    usages = [x.usage if x else None for x in llms]
    rewards = [s.reward for s in spans]
    columns: dict[str, list[Any]] = {k: [getattr(s, k) for s in spans] for k in _TOP}
    columns |= {k: _of(llms, k) for k in _LLM} | {k: _of(usages, k) for k in _USAGE}
    columns |= {k: _of(rewards, v) for k, v in _REWARD.items()}
    columns["attributes"] = [s.attributes or None for s in spans]
    columns["request_messages"] = [m or None for m in columns["request_messages"]]
    for name in JSON_SPAN_COLUMNS:
        columns[name] = [_json(spans, i, name, v) for i, v in enumerate(columns[name])]
    arrays = [list_column(columns[f.name], _LIST_TYPES[f.name], f.type) if f.name in _LIST_TYPES
              else pa.array(columns[f.name], type=f.type) for f in SPAN_ARROW_SCHEMA]
    return pa.Table.from_arrays(arrays, schema=SPAN_ARROW_SCHEMA)


def _of(items: list[Any], attr: str) -> list[Any]:
    return [None if x is None else getattr(x, attr) for x in items]


def _json(spans: Sequence[Span], i: int, name: str, value: Any) -> str | None:
    """JSON text of a JSON column; NaN and Infinity are not JSON (DuckDB would refuse the whole batch)."""
    try:
        text = dumps(value, allow_nan=False)
        if text is not None:
            text.encode()  # lone surrogates: not UTF-8, which Arrow and DuckDB need
        return text
    except (ValueError, UnicodeEncodeError) as exc:
        raise InvalidSpanError(f"span #{i} ({spans[i].span_id}): `{name}` is not valid JSON ({exc}); "
                               "nothing of this batch was stored") from None


def check_limits(tbl: pa.Table, max_tokens_per_span: int, max_json_bytes: int) -> None:
    """Limits that protect the store: no span_id twice in a batch, no span over the token or JSON limit."""
    ids = tbl["span_id"].to_pylist()
    if dups := [s for s, n in Counter(ids).items() if n > 1]:
        raise InvalidSpanError(f"span_id {dups[0]!r} appears twice in the batch; nothing stored")
    # Each check is one max per column (pyarrow calls have a fixed cost, paid per batch); a span's token count
    # is at most the sum of the two columns' maxima, so rows are counted only when that sum is over the limit.
    lengths = [pc.list_value_length(tbl[c]) for c in ("prompt_token_ids", "response_token_ids")]
    if sum(pc.max(n).as_py() or 0 for n in lengths) > max_tokens_per_span:
        n_tokens = sum(n.fill_null(0).to_numpy() for n in lengths)
        if n_tokens.max() > max_tokens_per_span:
            i = int(n_tokens.argmax())
            raise InvalidSpanError(f"span #{i} ({ids[i]}): {n_tokens[i]} token IDs exceed "
                                   f"max_tokens_per_span={max_tokens_per_span}; nothing stored")
    for col in JSON_SPAN_COLUMNS:
        json_bytes = pc.binary_length(tbl[col])
        if (pc.max(json_bytes).as_py() or 0) > max_json_bytes:
            i = int(pc.index(json_bytes, pc.max(json_bytes)).as_py())
            raise InvalidSpanError(f"span #{i} ({ids[i]}): `{col}` is {json_bytes[i].as_py()} bytes of JSON, "
                                   f"over max_json_bytes={max_json_bytes}; nothing of this batch was stored")


def _mark_late(tbl: pa.Table, ended: set[str]) -> pa.Table:
    """``tbl`` with each reward span of an attempt in ``ended`` marked ``attributes.late = true``: kept for the
    record, never an attempt's final reward (:data:`~spanlab.types.LATE_ATTRIBUTE`)."""
    kinds, attempts = tbl["kind"].to_pylist(), tbl["attempt_id"].to_pylist()
    late = [i for i, (kind, aid) in enumerate(zip(kinds, attempts, strict=True)) if kind == "reward" and aid in ended]
    if not late:
        return tbl
    attributes = tbl["attributes"].to_pylist()
    for i in late:
        attributes[i] = dumps({**(loads(attributes[i]) or {}), LATE_ATTRIBUTE: True})
    return tbl.set_column(tbl.schema.get_field_index("attributes"), "attributes", pa.array(attributes, pa.string()))


def insert(cur: sqlite3.Connection, tbl: pa.Table) -> list[str]:
    """Store the spans of ``tbl`` not stored yet (in the writer's transaction); returns their span_ids. A reward
    span of an attempt that has ended is stored marked late (:func:`_mark_late`)."""
    span_ids, attempt_ids, rollout_ids = (tbl[c].to_pylist() for c in ("span_id", "attempt_id", "rollout_id"))
    named = sorted({a for a in attempt_ids if a is not None})
    owners: dict[str | None, str] = {}
    ended: set[str] = set()  # attempts that ended before this write: its rewards are late
    stored: set[tuple[str, str | None]] = set()
    last: dict[str | None, int] = {}
    # one statement for the attempts' rollouts and statuses, their stored span IDs and last sequence numbers
    for attempt_id, rollout_id, status, span_id, seq in cur.execute(
        f"SELECT a.attempt_id, a.rollout_id, a.status, s.span_id, s.sequence_id FROM attempts a "
        f"LEFT JOIN span_keys s ON s.attempt_id = a.attempt_id WHERE a.attempt_id {IN_JSON}", [dumps(named)]
    ).fetchall() if named else ():
        owners[attempt_id] = rollout_id
        if status not in ACTIVE_ATTEMPT_STATUSES:
            ended.add(attempt_id)
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
        stored |= set(cur.execute(f"SELECT span_id, attempt_id FROM span_keys WHERE attempt_id IS NULL "
                                  f"AND span_id {IN_JSON}", [dumps(span_ids)]).fetchall())
        sql = "SELECT coalesce(max(sequence_id), -1) FROM span_keys WHERE attempt_id IS NULL"
        ((last[None],),) = cur.execute(sql).fetchall()
    keep, seqs = [], []
    for i, (span_id, attempt_id, given) in enumerate(
        zip(span_ids, attempt_ids, tbl["sequence_id"].to_pylist(), strict=True)
    ):
        if (span_id, attempt_id) not in stored:
            stored.add((span_id, attempt_id))
            prev = last.get(attempt_id, -1)  # -1: no span of the attempt yet
            seq = prev + 1 if given is None else given
            last[attempt_id] = max(prev, seq)
            keep.append(i)
            seqs.append(seq)
    if not keep:
        return []
    if len(keep) != tbl.num_rows:
        tbl = tbl.take(pa.array(keep, pa.int64()))
    tbl = tbl.set_column(tbl.schema.get_field_index("sequence_id"), "sequence_id", pa.array(seqs, pa.int32()))
    if ended:
        tbl = _mark_late(tbl, ended)
    cur.executemany("INSERT INTO span_keys VALUES (?, ?, ?)",
                    [(span_ids[i], attempt_ids[i], seq) for i, seq in zip(keep, seqs, strict=True)])
    cur.execute("INSERT INTO span_batches VALUES (stamp(), ?)", [table_to_bytes(tbl)])  # DuckDB's copy: hot.py
    return [span_ids[i] for i in keep]
