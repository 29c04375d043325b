"""The small tables' SQL: resources, training metrics, and the ``rollout_summary`` rows adapters read.

Functions of the cursor they run on, like :mod:`.queue`: the writer runs the writes in its transaction,
reads run on a cursor of their own.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

import duckdb
import pyarrow as pa

from spanlab.errors import InvalidSpanError, NotFoundError, QueryError
from spanlab.store.base import Metric, RolloutSummary
from spanlab.store.schema import dumps, fetch_dicts, loads, where
from spanlab.types import MAX_INT32, Resource


def add_resource(cur: duckdb.DuckDBPyConnection, res: Resource) -> Resource:
    """Store ``res`` as the next version of its name (versions count up from 1)."""
    ((latest,),) = cur.execute("SELECT max(version) FROM resources WHERE name = ?", [res.name]).fetchall()
    out = res.model_copy(update={"version": (latest or 0) + 1})
    cur.execute("INSERT INTO resources VALUES (?, ?, ?, ?, ?)",
                [out.name, out.version, out.kind, dumps(out.payload), out.created_time])
    return out


def get_resource(cur: duckdb.DuckDBPyConnection, name: str, version: int | None) -> Resource:
    clause, params = where({"name": name, "version": version})
    rows = fetch_dicts(cur.execute(f"SELECT * FROM resources {clause} ORDER BY version DESC LIMIT 1", params))
    if not rows:
        raise NotFoundError(f"unknown resource {name!r}" + (f" version {version}" if version else ""))
    return _resource(rows[0])


def list_resources(cur: duckdb.DuckDBPyConnection, name: str | None) -> list[Resource]:
    clause, params = where({"name": name})
    return [_resource(r) for r in fetch_dicts(cur.execute(f"SELECT * FROM resources {clause} ORDER BY name, version",
                                                          params))]


def _resource(row: dict[str, Any]) -> Resource:
    return Resource(**{**row, "payload": loads(row["payload"]) or {}})


def metrics_table(run_id: str, algorithm: str, step: int, metrics: dict[str, float]) -> tuple[pa.Table, list[str]]:
    """One step's metrics as ``train_metrics`` rows (long format), and the names of non-finite ones."""
    if not 0 <= step <= MAX_INT32:
        raise InvalidSpanError(f"metrics of run {run_id!r}: step {step} is outside 0..{MAX_INT32}")
    values = [None if v is None else float(v) for v in metrics.values()]
    n, now = len(values), time.time()
    tbl = pa.table({"run_id": pa.array([run_id] * n, pa.string()), "algorithm": pa.array([algorithm] * n, pa.string()),
                    "step": pa.array([int(step)] * n, pa.int32()), "name": pa.array([str(k) for k in metrics]),
                    "value": pa.array(values, pa.float64()), "time": pa.array([now] * n, pa.float64())})
    bad = [k for k, v in zip(metrics, values, strict=True) if v is not None and not math.isfinite(v)]
    return tbl, bad


def metrics(cur: duckdb.DuckDBPyConnection, run_id: str | None) -> list[Metric]:
    clause, params = where({"run_id": run_id})
    rows = fetch_dicts(cur.execute(f"SELECT * FROM train_metrics {clause} ORDER BY time, step, name", params))
    return [Metric(**r) for r in rows]


def rollout_summaries(cur: duckdb.DuckDBPyConnection, rollout_ids: Sequence[str] | None,
                      statuses: Sequence[str] | None, metadata: dict[str, str] | None) -> list[RolloutSummary]:
    metadata = metadata or {}
    if bad := [k for k in metadata if not k.replace("_", "").replace("-", "").isalnum()]:
        raise QueryError(f"metadata keys are letters, digits, '_' and '-', not {bad[0]!r}")
    clause, params = where({"rollout_id": rollout_ids, "status": statuses},
                           *(("json_extract_string(metadata, ?) = ?", [f"$.{k}", v]) for k, v in metadata.items()))
    sql = (f"SELECT {', '.join(RolloutSummary.model_fields)} FROM rollout_summary {clause} "
           "ORDER BY enqueue_time, rollout_id")
    return [RolloutSummary(**{**r, "input": loads(r["input"]), "metadata": loads(r["metadata"]) or {}})
            for r in fetch_dicts(cur.execute(sql, params))]
