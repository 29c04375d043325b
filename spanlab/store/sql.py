"""Read-only SQL over a span store file: what ``spanlab sql`` (and later the UI and store server) run.

The file is opened read-only with external access disabled and the configuration locked, so a query
can read the store's tables and views but cannot read other files (``read_csv('/etc/passwd')``),
write (``COPY``, ``INSERT``), attach databases or install/load extensions. Each refusal becomes a
``QueryError`` that says which rule it hit.
"""

from __future__ import annotations

import csv
import datetime as dt
import decimal
import io
import json
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import duckdb
import pyarrow as pa

from spanlab.errors import QueryError
from spanlab.store.connection import connect

DEFAULT_DB = "spanlab.duckdb"
OutputFormat = Literal["table", "csv", "json"]


def resolve_db(db: str | Path | None) -> Path:
    """``--db`` wins, then ``$SPANLAB_DB``, then ``./spanlab.duckdb``."""
    return Path(db or os.environ.get("SPANLAB_DB") or DEFAULT_DB)


def fetch_user_query(conn: duckdb.DuckDBPyConnection, sql: str, max_rows: int | None = None) -> pa.Table:
    """Run a user's query on a locked-down connection; DuckDB's refusals become ``QueryError``s that
    say which rule was hit. Shared by ``spanlab sql`` and the store server's ``/sql``."""
    try:
        rel = conn.sql(sql)
        if rel is None:  # a statement with no result (SET, PRAGMA that returns nothing)
            return pa.table({})
        if max_rows is not None:
            rel = rel.limit(max_rows)
        return rel.to_arrow_table()
    except duckdb.PermissionException as exc:
        raise QueryError(
            "not allowed: SQL here cannot touch files, the network or extensions (no access to files outside "
            f"the store; external access disabled). DuckDB said: {exc}"
        ) from exc
    except duckdb.InvalidInputException as exc:
        if "read-only" in str(exc) or "read only" in str(exc):
            raise QueryError(f"not allowed: the span store is opened read-only. DuckDB said: {exc}") from exc
        raise QueryError(str(exc)) from exc
    except duckdb.Error as exc:
        raise QueryError(str(exc)) from exc


def run_query(db: str | Path, sql: str, *, max_rows: int | None = None) -> pa.Table:
    """Run one user query on the file, opened read-only; at most ``max_rows`` rows when given."""
    conn = connect(db, read_only=True, safe=True)
    try:
        return fetch_user_query(conn, sql, max_rows)
    finally:
        conn.close()


def _jsonable(value: Any) -> Any:
    """A value strict JSON can carry (non-finite floats become the strings JavaScript would print)."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, decimal.Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    return value


def rows(table: pa.Table) -> Iterator[dict[str, Any]]:
    for batch in table.to_batches(max_chunksize=1024):
        for row in batch.to_pylist():
            yield {k: _jsonable(v) for k, v in row.items()}


def to_csv(table: pa.Table) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(table.column_names)
    for row in rows(table):
        writer.writerow(json.dumps(v) if isinstance(v, (list, dict)) else v for v in row.values())
    return buf.getvalue()


def to_json(table: pa.Table) -> str:
    return json.dumps(list(rows(table)), ensure_ascii=False, indent=1)


def cell_text(value: Any, width: int = 60) -> str:
    text = "NULL" if value is None else json.dumps(value) if isinstance(value, (list, dict)) else str(value)
    return text if len(text) <= width else text[: width - 1] + "…"
