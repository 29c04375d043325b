"""A read-only user query on a store file: what ``spanlab sql --db`` and the drift report's adapter run.

Why apart from :mod:`.sql`: before a file is read, the writes only its hot file holds are copied in by opening
the store (:mod:`.catchup`), and the store itself runs user SQL through :func:`~spanlab.store.sql.fetch_user_query`;
with both in one module the two would import each other.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from spanlab.sql_surface import QueryLimits
from spanlab.store.catchup import catch_up
from spanlab.store.schema import connect
from spanlab.store.sql import fetch_user_query


def run_query(db: str | Path, sql: str, *, max_rows: int | None = None, timeout_s: float | None = None,
              max_bytes: int | None = None) -> pa.Table:
    """Run one user query on the file, opened read-only; limits as in :func:`~spanlab.store.sql.fetch_user_query`.
    Writes that only the store's hot file holds (its writer was killed) are copied in first (:mod:`.catchup`)."""
    catch_up(db)
    conn = connect(db, read_only=True, safe=True)
    try:
        return fetch_user_query(conn, sql, max_rows, limits=QueryLimits(timeout_s, max_bytes))
    finally:
        conn.close()
