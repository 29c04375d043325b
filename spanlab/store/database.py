"""One DuckDB file owned by one process: its lock, transactions, resources, metrics and read-only SQL.

The part of the span store that is not the queue or the spans: ``SpanStore`` builds on it. DuckDB lets
one process hold a file read-write, so this class is that process's only way in: one connection, one
re-entrant lock, every write in a transaction. Reads of the queue tables call :meth:`_before_read`
first, which the store uses to write what its queue journal holds.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
from pydantic import ValidationError

from spanlab.errors import InvalidSpanError, NotFoundError, QueryError, StoreError
from spanlab.store.connection import (
    MEMORY,
    SAFE_QUERY_CONFIG,
    connect,
    cursor,
    dumps,
    fetch_dicts,
    loads,
    registered,
    where_equal,
)
from spanlab.store.schema import SCHEMA_VERSION, TABLES_DDL
from spanlab.store.sql import fetch_user_query
from spanlab.store.views import VIEWS_DDL
from spanlab.types import Resource, ResourceKind

logger = logging.getLogger(__name__)


class Database:
    def __init__(self, path: str | Path = MEMORY, *, compress: bool = True) -> None:
        self.path = str(path)
        self._lock = threading.RLock()
        self._conn = connect(self.path)
        if not compress:
            self._conn.execute("SET force_compression = 'uncompressed'")
        self._closed = False
        self._init_schema()
        latest = self._conn.execute("SELECT name, max(version) FROM resources GROUP BY name").fetchall()
        self._latest_resources: dict[str, int] = dict(latest)

    def _resources_ref(self) -> str | None:
        """The latest version of every resource, as recorded on the rollouts that use them."""
        return ",".join(f"{n}@{v}" for n, v in sorted(self._latest_resources.items())) or None

    def _ensure_open(self) -> None:
        if self._closed:
            raise StoreError("the span store is closed")

    def _before_read(self) -> None:
        """Hook: make the tables current before SQL reads them."""

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                if self.path != MEMORY:
                    self._conn.execute("CHECKPOINT")
            finally:
                self._conn.close()

    def _init_schema(self) -> None:
        try:
            with self._transaction() as cur:
                cur.execute(TABLES_DDL)
                row = cur.execute("SELECT value FROM spanlab_meta WHERE key = 'schema_version'").fetchone()
                if row is None:
                    cur.execute("INSERT INTO spanlab_meta VALUES ('schema_version', ?)", [str(SCHEMA_VERSION)])
                elif int(row[0]) > SCHEMA_VERSION:
                    raise StoreError(
                        f"{self.path} was written by a newer spanlab (schema {row[0]} > {SCHEMA_VERSION}); "
                        "upgrade spanlab"
                    )
                cur.execute(VIEWS_DDL)
        except StoreError:
            self._conn.close()
            raise

    @contextmanager
    def _transaction(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """Lock + BEGIN/COMMIT; DuckDB errors become ``StoreError`` and roll back."""
        with self._lock:
            self._ensure_open()
            cur = self._conn
            cur.execute("BEGIN TRANSACTION")
            try:
                yield cur
                cur.execute("COMMIT")
            except BaseException as exc:
                cur.execute("ROLLBACK")
                if isinstance(exc, (duckdb.ConversionException, duckdb.ConstraintException)):
                    raise InvalidSpanError(f"rejected by DuckDB: {exc}; nothing of this batch was stored") from exc
                if isinstance(exc, duckdb.Error):
                    raise StoreError(f"span store {self.path}: {exc}") from exc
                raise

    @contextmanager
    def _registered(self, name: str, tbl: pa.Table) -> Iterator[None]:
        """Make an Arrow table visible to SQL as ``name``; unregistered outside any transaction."""
        with self._lock, registered(self._conn, name, tbl):
            yield

    def _cursor(self) -> duckdb.DuckDBPyConnection:
        with self._lock:
            self._ensure_open()
            return cursor(self._conn, self.path)

    # --- resources -----------------------------------------------------------------------------
    def add_resource(self, name: str, payload: dict[str, Any], kind: ResourceKind = "other") -> Resource:
        res = as_model(Resource, {"name": name, "payload": payload, "kind": kind}, 0)
        with self._lock:
            with self._transaction() as cur:
                (latest,) = cur.execute("SELECT max(version) FROM resources WHERE name = ?", [name]).fetchone()
                res.version = (latest or 0) + 1
                cur.execute(
                    "INSERT INTO resources VALUES (?, ?, ?, ?, ?)",
                    [res.name, res.version, res.kind, dumps(res.payload), res.created_time],
                )
            self._latest_resources[res.name] = res.version  # only once committed
        return res

    def get_resource(self, name: str, version: int | None = None) -> Resource:
        sql = "SELECT * FROM resources WHERE name = ? "
        sql += "AND version = ?" if version is not None else "ORDER BY version DESC LIMIT 1"
        rows = fetch_dicts(self._cursor().execute(sql, [name] + ([version] if version is not None else [])))
        if not rows:
            raise NotFoundError(f"unknown resource {name!r}" + (f" version {version}" if version else ""))
        return _row_to_resource(rows[0])

    def list_resources(self, name: str | None = None) -> list[Resource]:
        where, params = where_equal({"name": name})
        rows = fetch_dicts(self._cursor().execute(f"SELECT * FROM resources {where} ORDER BY name, version", params))
        return [_row_to_resource(r) for r in rows]

    # --- training metrics ----------------------------------------------------------------------
    def add_metrics(self, run_id: str, algorithm: str, step: int, metrics: dict[str, float]) -> None:
        """Record one training step's metrics (long format: ``train_metrics`` is queryable with SQL)."""
        now = time.time()
        rows = [
            [run_id, algorithm, int(step), str(k), None if v is None else float(v), now] for k, v in metrics.items()
        ]
        bad = [r[3] for r in rows if r[4] is not None and not math.isfinite(r[4])]
        if bad:
            logger.warning("run %s step %d: non-finite metrics %s", run_id, step, bad)
        tbl = pa.table(
            {
                "run_id": pa.array([r[0] for r in rows], pa.string()),
                "algorithm": pa.array([r[1] for r in rows], pa.string()),
                "step": pa.array([r[2] for r in rows], pa.int32()),
                "name": pa.array([r[3] for r in rows], pa.string()),
                "value": pa.array([r[4] for r in rows], pa.float64()),
                "time": pa.array([r[5] for r in rows], pa.float64()),
            }
        )
        with self._lock, self._transaction() as cur, self._registered("_metrics_in", tbl):
            cur.execute("INSERT INTO train_metrics SELECT * FROM _metrics_in")

    # --- SQL -----------------------------------------------------------------------------------
    def restrict_to_store(self) -> None:
        """Turn off DuckDB's access to other files, the network and extensions for this database.

        For a process that serves user SQL (the store server): the store's own file stays open and
        writable, but no query can read /etc/passwd, COPY out, ATTACH or INSTALL. Irreversible.
        """
        with self._lock:
            for key, value in SAFE_QUERY_CONFIG.items():
                self._conn.execute(f"SET {key} = {str(value).lower()}")

    def query_read_only(self, sql: str, max_rows: int | None = None) -> pa.Table:
        """One SELECT (or EXPLAIN), refused otherwise; for user-facing SQL over a live store."""
        self._before_read()
        cur = self._cursor()
        try:
            statements = cur.extract_statements(sql)
        except duckdb.Error as exc:
            raise QueryError(str(exc)) from exc
        if len(statements) != 1:
            raise QueryError(f"send exactly one statement, not {len(statements)}")
        kind = statements[0].type
        if kind not in (duckdb.StatementType.SELECT, duckdb.StatementType.EXPLAIN):
            raise QueryError(f"not allowed: only SELECT queries run here (read-only), not {kind.name}")
        return fetch_user_query(cur, sql, max_rows)

    def query(self, sql: str, params: Sequence[Any] | None = None) -> pa.Table:
        self._before_read()
        try:
            return self._cursor().sql(sql, params=list(params or [])).to_arrow_table()
        except duckdb.Error as exc:
            raise StoreError(f"query failed: {exc}") from exc


def _row_to_resource(row: dict[str, Any]) -> Resource:
    return Resource(**{**row, "payload": loads(row["payload"]) or {}})


def as_model(model: type, value: Any, index: int) -> Any:
    """Accept a model instance or a dict; turn pydantic's error into one that names the item."""
    if isinstance(value, model):
        return value
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        raise InvalidSpanError(
            f"{model.__name__} #{index} is invalid; nothing of this batch was stored:\n{exc}"
        ) from exc
