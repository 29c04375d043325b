"""The rollout queue and the small tables as plain SQL: rollouts and attempts, resources, training metrics.

Every function takes the cursor it runs on and keeps no state. Writes run on the hot store (SQLite, see
``hot.py``) in the writer's transactions, one at a time (so two workers never dequeue the same rollout), and
stamp each row they change (``seq = stamp()``); reads run on DuckDB cursors of their own. The SQL that both
run (``get_rollout``, ``list_rollouts``, ...) is written in the dialect they share. The retry policy is
:func:`next_rollout_status`, one pure function that tests can read like a table.
"""

from __future__ import annotations

import logging
import math
import sqlite3
import time
from collections.abc import Sequence
from typing import Any

import duckdb

from spanlab.errors import InvalidSpanError, NotFoundError, QueryError
from spanlab.store import quarantine
from spanlab.store.base import Metric, RolloutSummary
from spanlab.store.hot import IN_JSON
from spanlab.store.schema import ATTEMPT_COLUMNS, IN_LIST, ROLLOUT_COLUMNS, dumps, fetch_dicts, loads, where
from spanlab.types import (
    ACTIVE_ATTEMPT_STATUSES,
    MAX_INT32,
    Attempt,
    FinishedAttemptStatus,
    Resource,
    Rollout,
    RolloutConfig,
    RolloutStatus,
    new_id,
)

logger = logging.getLogger(__name__)
_WAITING = "('queuing', 'requeuing')"
_ACTIVE = "('preparing', 'running')"
_ROLLOUTS = ", ".join(ROLLOUT_COLUMNS)
_ATTEMPTS = ", ".join(ATTEMPT_COLUMNS)


def _rollout_row(r: Rollout) -> list[Any]:
    """A new rollout as a row of the rollouts table (``ROLLOUT_COLUMNS`` order)."""
    return [r.rollout_id, dumps(r.input), r.mode, r.status, r.resources_version, r.config.timeout_s,
            r.config.unresponsive_s, r.config.max_attempts, dumps(list(r.config.retry_on)), dumps(r.metadata),
            r.enqueue_time, r.start_time, r.end_time, r.num_attempts]


def row_to_rollout(row: dict[str, Any]) -> Rollout:
    retry_on = row.pop("retry_on")  # a list from DuckDB, JSON text from SQLite
    config = RolloutConfig(timeout_s=row.pop("timeout_s"), unresponsive_s=row.pop("unresponsive_s"),
                           max_attempts=row.pop("max_attempts"),
                           retry_on=tuple(loads(retry_on) if isinstance(retry_on, str) else retry_on))
    return Rollout(**{**row, "config": config, "input": loads(row["input"]), "metadata": loads(row["metadata"]) or {}})


def row_to_attempt(row: dict[str, Any]) -> Attempt:
    return Attempt(**{**row, "metadata": loads(row["metadata"]) or {}})


def _first(cur: Any, sql: str, params: list[Any], missing: str) -> dict[str, Any]:
    if rows := fetch_dicts(cur.execute(sql, params)):
        return rows[0]
    raise NotFoundError(missing)


def _rollout_name(row: dict[str, Any]) -> str:
    return f"rollout {row['rollout_id']!r}"


def _attempt_name(row: dict[str, Any]) -> str:
    return f"attempt {row['attempt_id']!r}"


def get_rollout(cur: Any, rollout_id: str) -> Rollout:
    sql = f"SELECT {_ROLLOUTS} FROM rollouts WHERE rollout_id = ?"
    row = _first(cur, sql, [rollout_id], f"unknown rollout_id {rollout_id!r}")
    return quarantine.one(row, row_to_rollout, _rollout_name(row))


def get_attempt(cur: Any, attempt_id: str) -> Attempt:
    sql = f"SELECT {_ATTEMPTS} FROM attempts WHERE attempt_id = ?"
    row = _first(cur, sql, [attempt_id], f"unknown attempt_id {attempt_id!r}")
    return quarantine.one(row, row_to_attempt, _attempt_name(row))


def list_rollouts(cur: Any, equals: dict[str, Any], limit: int, offset: int,
                  *extra: tuple[str, list[Any]]) -> list[Rollout]:
    """Rollouts in enqueue order, those whose columns equal the non-None values of ``equals`` (and ``extra``
    conditions, as in :func:`~spanlab.store.schema.where`)."""
    clause, params = where(equals, *extra)
    rows = fetch_dicts(cur.execute(f"SELECT {_ROLLOUTS} FROM rollouts {clause} ORDER BY enqueue_time, rollout_id "
                                   "LIMIT ? OFFSET ?", [*params, limit, offset]))
    return quarantine.kept(rows, row_to_rollout, _rollout_name)


def enqueue(cur: sqlite3.Connection, rollouts: list[Rollout]) -> list[Rollout]:
    """Insert new rollouts (status ``queuing``); a rollout_id already stored is refused."""
    if found := cur.execute(f"SELECT rollout_id FROM rollouts WHERE rollout_id {IN_JSON} LIMIT 1",
                            [dumps([r.rollout_id for r in rollouts])]).fetchall():
        raise InvalidSpanError(f"enqueue: rollout_id {found[0][0]!r} already exists")
    cur.executemany(f"INSERT INTO rollouts ({_ROLLOUTS}, seq) VALUES ({'?, ' * len(ROLLOUT_COLUMNS)}stamp())",
                    [_rollout_row(r) for r in rollouts])
    return rollouts


def dequeue(cur: sqlite3.Connection, worker_id: str | None, mode: str | None,
            now: float) -> tuple[Rollout, Attempt] | None:
    """Take the oldest waiting rollout (of ``mode``, if given) and open its next attempt.

    A rollout enqueued without ``resources_version`` takes the latest version of every resource
    (``name@version,...``) when first dequeued, and keeps them across retries.
    """
    while not (waiting := list_rollouts(cur, {"mode": mode or None}, 1, 0, (f"status IN {_WAITING}", []))):
        if not _fail_quarantined(cur, mode, now):
            return None
    old = waiting[0]
    if (resources := old.resources_version) is None:
        latest = cur.execute("SELECT name, max(version) FROM resources GROUP BY name ORDER BY name").fetchall()
        resources = ",".join(f"{name}@{version}" for name, version in latest) or None
    rollout = old.model_copy(update={"status": "preparing", "num_attempts": old.num_attempts + 1,
                                     "start_time": old.start_time if old.start_time is not None else now,
                                     "resources_version": resources})
    cur.execute("UPDATE rollouts SET status = ?, num_attempts = ?, start_time = ?, resources_version = ?, "
                "seq = stamp() WHERE rollout_id = ?", [rollout.status, rollout.num_attempts, rollout.start_time,
                                         rollout.resources_version, rollout.rollout_id])
    attempt = Attempt(rollout_id=rollout.rollout_id, attempt_id=new_id("at"), sequence_id=rollout.num_attempts,
                      worker_id=worker_id, status="preparing", start_time=now, last_heartbeat_time=now)
    cur.execute(f"INSERT INTO attempts ({_ATTEMPTS}, seq) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, stamp())",
                [attempt.attempt_id, attempt.rollout_id, attempt.sequence_id, attempt.worker_id, attempt.status,
                 attempt.start_time, attempt.end_time, attempt.last_heartbeat_time, dumps(attempt.metadata)])
    return rollout, attempt


def _fail_quarantined(cur: sqlite3.Connection, mode: str | None, now: float) -> bool:
    """Take the oldest waiting rollout out of the queue if it cannot be read (quarantined): marked ``failed``, so
    the queue moves on. False when it can be read or none waits."""
    clause, params = where({"mode": mode or None}, (f"status IN {_WAITING}", []))
    rows = fetch_dicts(cur.execute(f"SELECT {_ROLLOUTS} FROM rollouts {clause} ORDER BY enqueue_time, rollout_id "
                                   "LIMIT 1", params))
    if not rows or quarantine.kept(rows, row_to_rollout, _rollout_name):
        return False
    cur.execute("UPDATE rollouts SET status = 'failed', end_time = ?, seq = stamp() WHERE rollout_id = ?",
                [now, rows[0]["rollout_id"]])
    logger.error("rollout %r left the queue as failed: it is quarantined", rows[0]["rollout_id"])
    return True


def heartbeat(cur: sqlite3.Connection, attempt_id: str, now: float) -> Attempt:
    """Mark a live attempt alive (the first beat moves it and its rollout to ``running``); an attempt that
    already ended is returned as it is, so its worker learns it was timed out."""
    rows = fetch_dicts(cur.execute(f"UPDATE attempts SET last_heartbeat_time = ?, status = 'running', "
                                   f"seq = stamp() WHERE "
                                   f"attempt_id = ? AND status IN {_ACTIVE} RETURNING {_ATTEMPTS}", [now, attempt_id]))
    if not rows:
        return get_attempt(cur, attempt_id)
    attempt = row_to_attempt(rows[0])
    cur.execute("UPDATE rollouts SET status = 'running', seq = stamp() WHERE rollout_id = ? AND status = 'preparing'",
                [attempt.rollout_id])
    return attempt


def finish(cur: sqlite3.Connection, attempt_id: str, status: FinishedAttemptStatus, now: float) -> Rollout:
    """End a live attempt and apply the retry policy; an attempt that already ended changes nothing."""
    row = _first(cur, f"SELECT a.status AS attempt_status, {', '.join('r.' + c for c in ROLLOUT_COLUMNS)} "
                 "FROM attempts a JOIN rollouts r USING (rollout_id) WHERE a.attempt_id = ?", [attempt_id],
                 f"unknown attempt_id {attempt_id!r}")  # the attempt's status and its rollout, in one statement
    attempt_status = row.pop("attempt_status")
    rollout = quarantine.one(row, row_to_rollout, _rollout_name(row))
    if attempt_status not in ACTIVE_ATTEMPT_STATUSES:
        return rollout
    new_status = next_rollout_status(rollout, status)
    end_time = rollout.end_time if new_status in ("requeuing", "cancelled") else now
    cur.execute("UPDATE attempts SET status = ?, end_time = ?, seq = stamp() WHERE attempt_id = ?",
                [status, now, attempt_id])
    cur.execute("UPDATE rollouts SET status = ?, end_time = ?, seq = stamp() WHERE rollout_id = ?",
                [new_status, end_time, rollout.rollout_id])
    return rollout.model_copy(update={"status": new_status, "end_time": end_time})


def expire(cur: sqlite3.Connection, now: float, timeout_grace_s: float) -> list[Attempt]:
    """End live attempts past their rollout's ``timeout_s`` (plus ``timeout_grace_s``, so the worker, which
    enforces its timeout itself, acts first) or silent for longer than ``unresponsive_s``."""
    overdue = cur.execute(  # a NULL limit compares as NULL: no verdict
        "SELECT a.attempt_id, CASE WHEN ? - a.start_time > r.timeout_s + ? THEN 'timeout' WHEN ? - coalesce("
        "a.last_heartbeat_time, a.start_time) > r.unresponsive_s THEN 'unresponsive' END AS verdict FROM attempts a "
        f"JOIN rollouts r USING (rollout_id) WHERE a.status IN {_ACTIVE} AND verdict IS NOT NULL ORDER BY a.start_time",
        [now, timeout_grace_s, now]).fetchall()
    ended = []
    for attempt_id, verdict in overdue:
        rollout = finish(cur, attempt_id, verdict, now)
        logger.warning("attempt %s of rollout %s ended %s", attempt_id, rollout.rollout_id, verdict)
        ended.append(get_attempt(cur, attempt_id))
    return ended


def cancel(cur: sqlite3.Connection, rollout_id: str, now: float) -> Rollout:
    rollout = get_rollout(cur, rollout_id)
    if rollout.status in ("succeeded", "failed", "cancelled"):
        return rollout
    cur.execute(f"UPDATE attempts SET status = 'failed', end_time = ?, seq = stamp() WHERE rollout_id = ? "
                f"AND status IN {_ACTIVE}", [now, rollout_id])
    cur.execute("UPDATE rollouts SET status = 'cancelled', end_time = ?, seq = stamp() WHERE rollout_id = ?",
                [now, rollout_id])
    return rollout.model_copy(update={"status": "cancelled", "end_time": now})


def list_attempts(cur: duckdb.DuckDBPyConnection, rollout_id: str) -> list[Attempt]:
    rows = fetch_dicts(cur.execute(f"SELECT {_ATTEMPTS} FROM attempts WHERE rollout_id = ? ORDER BY sequence_id",
                                   [rollout_id]))
    return quarantine.kept(rows, row_to_attempt, _attempt_name)


def last_attempts(cur: duckdb.DuckDBPyConnection, rollout_ids: Sequence[str]) -> list[tuple[Rollout, Attempt]]:
    """Each rollout with its latest attempt, in the order of ``rollout_ids`` (rollouts never dequeued: left out)."""
    rows = fetch_dicts(cur.execute(f"SELECT {_ATTEMPTS} FROM attempts WHERE rollout_id {IN_LIST} "
                                   "QUALIFY sequence_id = max(sequence_id) OVER (PARTITION BY rollout_id)",
                                   [list(rollout_ids)]))
    attempts = {a.rollout_id: a for a in quarantine.kept(rows, row_to_attempt, _attempt_name)}
    sql = f"SELECT {_ROLLOUTS} FROM rollouts WHERE rollout_id {IN_LIST}"
    rollouts = quarantine.kept(fetch_dicts(cur.execute(sql, [list(attempts)])), row_to_rollout, _rollout_name)
    by_id = {r.rollout_id: r for r in rollouts}
    return [(by_id[rid], attempts[rid]) for rid in dict.fromkeys(rollout_ids) if rid in attempts and rid in by_id]


def count_rollouts(cur: duckdb.DuckDBPyConnection, statuses: Sequence[str] | None) -> int:
    clause, params = where({"status": statuses})
    return cur.execute(f"SELECT count(*) FROM rollouts {clause}", params).fetchall()[0][0]


def next_rollout_status(rollout: Rollout, attempt_status: FinishedAttemptStatus) -> RolloutStatus:
    """Where a rollout goes when its current attempt ends with ``attempt_status``."""
    if rollout.status == "cancelled":
        return "cancelled"
    if attempt_status == "succeeded":
        return "succeeded"
    if attempt_status in rollout.config.retry_on and rollout.num_attempts < rollout.config.max_attempts:
        return "requeuing"
    return "failed"


def add_resource(cur: sqlite3.Connection, res: Resource) -> Resource:
    """Store ``res`` as the next version of its name (versions count up from 1)."""
    ((latest,),) = cur.execute("SELECT max(version) FROM resources WHERE name = ?", [res.name]).fetchall()
    out = res.model_copy(update={"version": (latest or 0) + 1})
    cur.execute("INSERT INTO resources VALUES (?, ?, ?, ?, ?, stamp())",
                [out.name, out.version, out.kind, dumps(out.payload), out.created_time])
    return out


def get_resource(cur: duckdb.DuckDBPyConnection, name: str, version: int | None) -> Resource:
    clause, params = where({"name": name, "version": version})
    row = _first(cur, f"SELECT * FROM resources {clause} ORDER BY version DESC LIMIT 1", params,
                 f"unknown resource {name!r}" + (f" version {version}" if version else ""))
    return quarantine.one(row, _resource, _resource_name(row))


def list_resources(cur: duckdb.DuckDBPyConnection, name: str | None) -> list[Resource]:
    clause, params = where({"name": name})
    rows = fetch_dicts(cur.execute(f"SELECT * FROM resources {clause} ORDER BY name, version", params))
    return quarantine.kept(rows, _resource, _resource_name)


def _resource_name(row: dict[str, Any]) -> str:
    return f"resource {row['name']!r} version {row['version']}"


def _resource(row: dict[str, Any]) -> Resource:
    return Resource(**{**row, "payload": loads(row["payload"]) or {}})


def add_metrics(cur: sqlite3.Connection, run_id: str, algorithm: str, step: int,
                metrics: dict[str, float]) -> list[str]:
    """One step's metrics as ``train_metrics`` rows (long format); returns the names of non-finite ones."""
    if not 0 <= step <= MAX_INT32:
        raise InvalidSpanError(f"metrics of run {run_id!r}: step {step} is outside 0..{MAX_INT32}")
    now, values = time.time(), {str(k): None if v is None else float(v) for k, v in metrics.items()}
    rows = [(run_id, algorithm, int(step), k, None if v is None else repr(v), now) for k, v in values.items()]
    cur.executemany("INSERT INTO train_metrics VALUES (?, ?, ?, ?, ?, ?, stamp())", rows)  # repr: 'nan' stays NaN
    return [k for k, v in values.items() if v is not None and not math.isfinite(v)]


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
    return quarantine.kept(fetch_dicts(cur.execute(sql, params)), _summary, _rollout_name)


def _summary(row: dict[str, Any]) -> RolloutSummary:
    return RolloutSummary(**{**row, "input": loads(row["input"]), "metadata": loads(row["metadata"]) or {}})
