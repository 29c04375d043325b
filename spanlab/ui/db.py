"""Read-only access to a span store file for the web UI, one short-lived connection per request.

Why a connection per request instead of one held open: DuckDB refuses a read-write open by another process
while any process holds the file, even read-only. A UI left open in a browser tab must not stop a training
run from starting, so the file is opened (read-only, with :data:`SAFE_QUERY_CONFIG`, exactly like
``spanlab sql``) for each API call and closed right after; opening a file is a few milliseconds. When a
writer holds the file, the open fails with ``StoreLockedError`` and the page says so.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from spanlab.errors import QueryError, StoreError
from spanlab.sql_surface import QueryLimits, rows
from spanlab.store.schema import connect
from spanlab.store.sql import fetch_user_query


def fetch_arrow(conn: duckdb.DuckDBPyConnection, sql: str, params: Sequence[Any] = ()) -> pa.Table:
    """One of the UI's own parameterized, LIMITed queries, as Arrow."""
    try:
        return conn.sql(sql, params=list(params)).to_arrow_table()
    except duckdb.Error as exc:
        raise StoreError(f"UI query failed: {exc}") from exc


def fetch(conn: duckdb.DuckDBPyConnection, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
    """Rows of :func:`fetch_arrow` as JSON-ready dicts."""
    return list(rows(fetch_arrow(conn, sql, params)))


def objects(conn: duckdb.DuckDBPyConnection) -> set[str]:
    """Names of the tables and views in the file: older stores may lack ``train_metrics`` or ``tito_sessions``,
    and a read-only open cannot add them."""
    sql = ("SELECT table_name AS n FROM duckdb_tables() "
           "UNION ALL SELECT view_name FROM duckdb_views() WHERE NOT internal")
    return {r["n"] for r in fetch(conn, sql)}


class ReadOnlyStore:
    """Parameterized reads and user SQL over one store file; never writes, never holds the file between calls."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    @contextlib.contextmanager
    def connection(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """The file opened read-only with external access disabled (raises ``StoreLockedError`` when held)."""
        conn = connect(self.path, read_only=True, safe=True)
        try:
            yield conn
        finally:
            conn.close()

    def fetch(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        """One query on its own connection (see :func:`fetch` to run several on one)."""
        with self.connection() as conn:
            return fetch(conn, sql, params)

    def user_query(self, sql: str, max_rows: int, limits: QueryLimits | None = None,
                   ) -> tuple[list[str], list[dict[str, Any]], bool]:
        """The SQL box: the same locked-down path as ``spanlab sql`` (:func:`fetch_user_query`), capped at
        ``max_rows`` rows; returns (columns, rows, truncated)."""
        if not sql.strip():
            raise QueryError("empty query")
        with self.connection() as conn:
            table = fetch_user_query(conn, sql, max_rows + 1, limits=limits)
        truncated = table.num_rows > max_rows
        return table.column_names, list(rows(table.slice(0, max_rows))), truncated
