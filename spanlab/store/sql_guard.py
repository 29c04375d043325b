"""The first line of :func:`spanlab.store.sql.fetch_user_query`: is this text one plain SELECT?

DuckDB's ``json_serialize_sql`` serializes SELECT statements only, so a statement it serializes is a
SELECT by DuckDB's own parser, not by a regex of ours. Two things still parse as SELECTs and are refused
by walking its tree: data-modifying CTEs (``WITH d AS (DELETE ... RETURNING *) SELECT``) and table
functions that act on the file (``checkpoint()``). The read-only transaction the query then runs in is
the second, independent line.
"""

from __future__ import annotations

import json
from typing import Any

import duckdb

from spanlab.errors import QueryError

# Query nodes of a SELECT's tree; anything else (DELETE_QUERY_NODE, INSERT_QUERY_NODE, ...) writes.
_READ_NODES = frozenset({"SELECT_NODE", "SET_OPERATION_NODE", "RECURSIVE_CTE_NODE", "CTE_NODE"})
# Table functions that are SELECTs by syntax but act on the database file.
_FORBIDDEN_FUNCTIONS = frozenset({"checkpoint", "force_checkpoint"})


def check_select(conn: duckdb.DuckDBPyConnection, sql: str) -> str:
    """The one SELECT statement of ``sql`` (its text), or a ``QueryError`` naming what is not allowed."""
    try:
        statements = conn.extract_statements(sql)
    except duckdb.Error as exc:
        raise QueryError(str(exc)) from exc
    if not statements:
        raise QueryError("empty query: send one SELECT")
    if len(statements) != 1:
        raise QueryError(f"not allowed: send exactly one SELECT statement, not {len(statements)}")
    kind = statements[0].type
    if kind != duckdb.StatementType.SELECT:
        raise QueryError(f"not allowed: only SELECT queries run here (read-only), not {kind.name}")
    text = statements[0].query
    try:
        (tree,) = conn.execute("SELECT json_serialize_sql(?::VARCHAR)", [text]).fetchone()
    except duckdb.Error as exc:
        raise QueryError(str(exc)) from exc
    parsed = json.loads(tree)
    if parsed.get("error"):
        raise QueryError(f"not allowed or not parsed as one plain SELECT: {parsed.get('error_message')}")
    bad = _writes(parsed)
    if bad:
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
    for value in values:
        bad = _writes(value)
        if bad:
            return bad
    return None
