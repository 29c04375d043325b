"""Reading spans for training: the ``spans`` table and the span journal's buffered batches, as one stream.

Spans written moments ago may still wait in the span journal (:mod:`spanlab.store.span_journal`); a
trainer reading a step's spans right after its rollouts ended should not wait for their insert. Three cases:
every matching span is still buffered (read from memory: filter and sort in Arrow; a step's 200 spans of
2,500 token IDs read back in ~10 ms in the store benchmark, where DuckDB, converting the IDs in and out,
took ~20 ms), none is (read the table), or both (DuckDB reads the table and the buffered rows together).
Rows come in the same order and with the same Arrow types whichever way they are read.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

ORDER = ("rollout_id", "attempt_id", "sequence_id")


def where_in(lists: dict[str, Sequence[str] | None]) -> tuple[str, list[Any]]:
    """``WHERE col IN (...) AND ...`` for the lists given (None: no condition on that column)."""
    parts = [(f"{k} IN (SELECT unnest(?::VARCHAR[]))", list(v)) for k, v in lists.items() if v is not None]
    return ("WHERE " + " AND ".join(p for p, _ in parts) if parts else ""), [v for _, v in parts]


def matching(tbl: pa.Table | None, lists: dict[str, Sequence[str] | None]) -> pa.Array | None:
    """Indices of the rows of ``tbl`` that :func:`where_in` of ``lists`` selects, in :data:`ORDER`; None if
    none. Only the key columns are touched here; the token lists are sliced (or copied once) by the caller."""
    if tbl is None:
        return None
    keep = None
    for col, values in lists.items():
        if values is not None:
            hit = pc.is_in(tbl[col], value_set=pa.array(list(values), pa.string()))
            keep = hit if keep is None else pc.and_(keep, hit)
    keys = tbl.select(list(ORDER))
    if keep is not None:
        rows = pc.indices_nonzero(keep)
        if not len(rows):
            return None
        keys = keys.take(rows)
    order = pc.sort_indices(keys, sort_keys=[(c, "ascending") for c in ORDER])
    return order if keep is None else rows.take(order)


def read_spans(
    cursor: Callable[[], duckdb.DuckDBPyConnection],
    buffered: pa.Table | None,
    lists: dict[str, Sequence[str] | None],
    cols: list[str],
    batch_size: int,
    table_may_have: bool = True,
) -> pa.RecordBatchReader:
    """The spans ``lists`` selects (see :func:`where_in`), ``cols`` of them, in :data:`ORDER`.

    ``buffered``: the span journal's batches (or None). ``cursor`` makes a DuckDB cursor, asked for only when
    the table is read. ``table_may_have=False``: the caller knows the table has no matching row. Call under
    the store's lock: the buffered rows and the table's snapshot must be taken together.
    """
    where, params = where_in(lists)
    select = f"SELECT {', '.join(cols)} FROM {{}} {where} ORDER BY {', '.join(ORDER)}"
    rows = matching(buffered, lists)
    if rows is None:
        return cursor().sql(select.format("spans"), params=params).to_arrow_reader(batch_size)
    in_table = False
    if table_may_have:
        cur = cursor()
        ((in_table,),) = cur.execute(f"SELECT EXISTS (SELECT 1 FROM spans {where})", params).fetchall()
    if in_table:
        cur.register("_buffered_spans", buffered)
        source = "(SELECT * FROM spans UNION ALL SELECT * FROM _buffered_spans)"
        return cur.sql(select.format(source), params=params).to_arrow_reader(batch_size)
    picked = _in_order(buffered.select(cols), rows)
    picked = picked.cast(_as_duckdb_gives(picked.schema))
    return pa.RecordBatchReader.from_batches(picked.schema, picked.to_batches(max_chunksize=batch_size))


def _in_order(tbl: pa.Table, rows: pa.Array) -> pa.Table:
    """``tbl.take(rows)``, but zero-copy where ``rows`` runs through consecutive rows: an attempt's spans
    arrive together, so a step's buffered spans are a few runs, and copying their token lists (a ``take``:
    ~3 ms per 100k IDs here) is what reading them from memory would otherwise cost."""
    idx = rows.to_numpy()
    starts = np.concatenate(([0], np.flatnonzero(np.diff(idx) != 1) + 1))
    if len(starts) > max(8, len(idx) // 8):  # scattered rows: one copy beats many tiny batches
        return tbl.take(rows)
    ends = np.append(starts[1:], len(idx))
    return pa.concat_tables([tbl.slice(int(idx[a]), int(b - a)) for a, b in zip(starts, ends, strict=True)])


def _as_duckdb_gives(schema: pa.Schema) -> pa.Schema:
    """``schema`` with list items named the way DuckDB's Arrow export names them (``l``), so a reader's
    schema does not depend on where its rows were."""
    fields = [pa.field(f.name, pa.list_(pa.field("l", f.type.value_type)) if pa.types.is_list(f.type) else f.type)
              for f in schema]
    return pa.schema(fields)

