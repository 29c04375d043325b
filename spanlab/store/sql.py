"""Read-only SQL for users: what ``spanlab sql``, the UI's SQL box, the store server's ``/sql`` and
``StoreAPI.query`` run.

User SQL must never change the store, whatever connection it is given (a read-only file, or a cursor of
the store's own writable connection), so :func:`fetch_user_query` holds three independent lines:

1. the text is exactly one plain ``SELECT`` (``FROM``, ``VALUES``, ``SUMMARIZE``, ``DESCRIBE``, ``SHOW`` are
   SELECTs too) as DuckDB's own parser sees it (:func:`check_select`), with no data-modifying CTE (``WITH d
   AS (DELETE ... RETURNING *) SELECT``) and no table function that acts on the file (``checkpoint()``);
   ``EXPLAIN`` is refused because ``EXPLAIN ANALYZE`` runs its statement;
2. it runs inside ``BEGIN TRANSACTION READ ONLY``, always rolled back: DuckDB refuses a write the check missed;
3. user-facing surfaces open files with external access disabled (:data:`SAFE_QUERY_CONFIG`), so no query
   reads other files (``read_csv('/etc/passwd')``), attaches databases or loads extensions.

A query also gets a time limit (a watchdog interrupts it, also when the HTTP client left) and a byte limit
counted while its result is read, so 10 rows of 30 MB are refused before they are all in memory (the limits
of the shared surfaces, and the threads they run on: :mod:`spanlab.sql_surface`).
"""

from __future__ import annotations

import json
import math
import threading
import time
from typing import Any

import duckdb
import pyarrow as pa

from spanlab.errors import QueryError
from spanlab.sql_surface import QueryLimits
from spanlab.store.schema import SAFE_QUERY_CONFIG

_BATCH_ROWS = 256  # rows per Arrow batch while counting bytes: small enough that one batch cannot blow memory

# Query nodes of a SELECT's tree; anything else (DELETE_QUERY_NODE, INSERT_QUERY_NODE, ...) writes.
_READ_NODES = frozenset({"SELECT_NODE", "SET_OPERATION_NODE", "RECURSIVE_CTE_NODE", "CTE_NODE"})
# Table functions that are SELECTs by syntax but act on the database file.
_FORBIDDEN_FUNCTIONS = frozenset({"checkpoint", "force_checkpoint"})


def check_select(conn: duckdb.DuckDBPyConnection, sql: str) -> str:
    """The one SELECT statement of ``sql`` (its text), or a ``QueryError`` naming what is not allowed."""
    try:
        statements = conn.extract_statements(sql)
        if not statements:
            raise QueryError("empty query: send one SELECT")
        if len(statements) != 1:
            raise QueryError(f"not allowed: send exactly one SELECT statement, not {len(statements)}")
        if (kind := statements[0].type) != duckdb.StatementType.SELECT:
            raise QueryError(f"not allowed: only SELECT queries run here (read-only), not {kind.name}")
        text = statements[0].query
        (tree,) = conn.execute("SELECT json_serialize_sql(?::VARCHAR)", [text]).fetchone()
    except duckdb.Error as exc:
        raise QueryError(str(exc)) from exc
    parsed = json.loads(tree)
    if parsed.get("error"):
        raise QueryError(f"not allowed or not parsed as one plain SELECT: {parsed.get('error_message')}")
    if bad := _writes(parsed):
        raise QueryError(f"not allowed: the query contains {bad} (only reads run here)")
    return text


def _writes(node: Any) -> str | None:
    """The first part of a serialized SELECT tree that writes or touches the file, if any."""
    if isinstance(node, dict):
        kind = node.get("type")
        if isinstance(kind, str) and "cte_map" in node and kind not in _READ_NODES:
            return kind.removesuffix("_QUERY_NODE").removesuffix("_NODE") + " (a data-modifying statement)"
        if kind == "TABLE_FUNCTION":
            name = (node.get("function") or {}).get("function_name")
            if isinstance(name, str) and name.lower() in _FORBIDDEN_FUNCTIONS:
                return f"{name}()"
        values: Any = node.values()
    elif isinstance(node, list):
        values = node
    else:
        return None
    return next(filter(None, map(_writes, values)), None)


def fetch_user_query(conn: duckdb.DuckDBPyConnection, sql: str, max_rows: int | None = None, *,
                     limits: QueryLimits | None = None) -> pa.Table:
    """Run a user's query where it cannot write (see the module docstring): at most ``max_rows`` rows,
    within ``limits``. The query runs on a cursor of ``conn``, so the caller's transaction is not touched."""
    limits = limits or QueryLimits()
    try:
        cur = conn.cursor()
    except duckdb.Error as exc:
        raise QueryError(f"cannot run the query: {exc}") from exc
    done = threading.Event()
    watchdog = threading.Thread(target=_watch, args=(cur, limits, done), name="spanlab-sql-watchdog", daemon=True)
    try:
        text = check_select(cur, sql)
        cur.execute("BEGIN TRANSACTION READ ONLY")
        if limits.timeout_s is not None or limits.cancel is not None:
            watchdog.start()
        try:
            return _read_limited(cur, text, max_rows, limits.max_bytes)
        finally:
            done.set()
            cur.execute("ROLLBACK")
    except duckdb.InterruptException as exc:
        left = limits.cancel is not None and limits.cancel.is_set()
        why = "the client left" if left else f"it ran over {limits.timeout_s:g} s"
        raise QueryError(f"query stopped: {why} (add a LIMIT, filter, or aggregate)") from exc
    except duckdb.PermissionException as exc:
        raise QueryError(
            "not allowed: SQL here cannot touch files, the network or extensions (no access to files outside "
            f"the store; external access disabled). DuckDB said: {exc}"
        ) from exc
    except duckdb.Error as exc:
        read_only = "read only" in str(exc).lower().replace("-", " ")
        if read_only and isinstance(exc, (duckdb.InvalidInputException, duckdb.TransactionException)):
            raise QueryError(f"not allowed: SQL here is read-only. DuckDB said: {exc}") from exc
        if isinstance(exc, duckdb.OutOfMemoryException):  # DuckDB adds a paragraph of settings to change
            raise QueryError(f"query stopped: it needs more than the {SAFE_QUERY_CONFIG['memory_limit']} that user "
                             f"SQL may use ({str(exc).splitlines()[0]}); add a LIMIT, filter, or aggregate") from exc
        raise QueryError(str(exc)) from exc
    finally:
        done.set()
        if watchdog.is_alive():
            watchdog.join()
        cur.close()


def _watch(cur: duckdb.DuckDBPyConnection, limits: QueryLimits, done: threading.Event) -> None:
    """Interrupt ``cur`` when the time is up or ``limits.cancel`` is set, unless the query finished first."""
    deadline = time.monotonic() + (math.inf if limits.timeout_s is None else limits.timeout_s)
    while not done.wait(0.05):
        if (limits.cancel is not None and limits.cancel.is_set()) or time.monotonic() >= deadline:
            cur.interrupt()
            return


def _read_limited(cur: duckdb.DuckDBPyConnection, text: str, max_rows: int | None,
                  max_bytes: int | None) -> pa.Table:
    """The result as Arrow, stopped with a ``QueryError`` once it passes ``max_bytes``."""
    rel = cur.sql(text)
    if max_rows is not None:
        rel = rel.limit(max_rows)
    reader = rel.to_arrow_reader(_BATCH_ROWS)
    batches, size = [], 0
    try:
        for batch in reader:
            size += batch.nbytes
            if max_bytes is not None and size > max_bytes:
                reader.close()
                raise QueryError(
                    f"result over the {max_bytes // (1024 * 1024)} MB limit after {sum(b.num_rows for b in batches)} "
                    "rows: select fewer rows or columns (token lists are large), or aggregate"
                )
            batches.append(batch)
    except (OSError, pa.ArrowException) as exc:  # DuckDB's errors arrive through the Arrow reader as these
        if "INTERRUPT" in str(exc):  # the watchdog stopped it mid-read: the same answer as before the first row
            raise duckdb.InterruptException(str(exc)) from exc
        raise QueryError(f"cannot read the result: {' '.join(str(exc).split())[:200]}") from exc
    return pa.Table.from_batches(batches, schema=reader.schema)
