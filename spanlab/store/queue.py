"""The rollout queue as plain SQL functions over one DuckDB connection.

Callers (``SpanStore``) hold the store's lock and run each function inside a transaction, so a
dequeue that picks a rollout and creates its attempt is atomic: two workers never get the same
rollout. The retry policy lives in :func:`next_rollout_status`, one pure function that tests can
read like a table. Which rollout to dequeue and which attempts are overdue is decided in memory
(:mod:`spanlab.store.queue_index`); these functions only read and write the tables.
"""

from __future__ import annotations

from typing import Any

import duckdb
import pyarrow as pa

from spanlab.errors import NotFoundError
from spanlab.store.connection import dumps, fetch_dicts, loads
from spanlab.types import (
    Attempt,
    FinishedAttemptStatus,
    Rollout,
    RolloutConfig,
    RolloutStatus,
    new_id,
)

ROLLOUT_COLUMNS = (
    "rollout_id, input, mode, status, resources_version, timeout_s, unresponsive_s, max_attempts, "
    "retry_on, metadata, enqueue_time, start_time, end_time, num_attempts"
)
ATTEMPT_COLUMNS = (
    "attempt_id, rollout_id, sequence_id, worker_id, status, start_time, end_time, last_heartbeat_time, metadata"
)


def rollouts_to_arrow(rollouts: list[Rollout]) -> pa.Table:
    return pa.table(
        {
            "rollout_id": [r.rollout_id for r in rollouts],
            "input": [dumps(r.input) for r in rollouts],
            "mode": [r.mode for r in rollouts],
            "status": [r.status for r in rollouts],
            "resources_version": pa.array([r.resources_version for r in rollouts], pa.string()),
            "timeout_s": pa.array([r.config.timeout_s for r in rollouts], pa.float64()),
            "unresponsive_s": pa.array([r.config.unresponsive_s for r in rollouts], pa.float64()),
            "max_attempts": pa.array([r.config.max_attempts for r in rollouts], pa.int32()),
            "retry_on": pa.array([list(r.config.retry_on) for r in rollouts], pa.list_(pa.string())),
            "metadata": [dumps(r.metadata) for r in rollouts],
            "enqueue_time": pa.array([r.enqueue_time for r in rollouts], pa.float64()),
            "start_time": pa.array([r.start_time for r in rollouts], pa.float64()),
            "end_time": pa.array([r.end_time for r in rollouts], pa.float64()),
            "num_attempts": pa.array([r.num_attempts for r in rollouts], pa.int32()),
        }
    )


def row_to_rollout(row: dict[str, Any]) -> Rollout:
    return Rollout(
        rollout_id=row["rollout_id"],
        input=loads(row["input"]),
        mode=row["mode"],
        status=row["status"],
        resources_version=row["resources_version"],
        config=RolloutConfig(
            timeout_s=row["timeout_s"],
            unresponsive_s=row["unresponsive_s"],
            max_attempts=row["max_attempts"],
            retry_on=tuple(row["retry_on"]),
        ),
        metadata=loads(row["metadata"]) or {},
        enqueue_time=row["enqueue_time"],
        start_time=row["start_time"],
        end_time=row["end_time"],
        num_attempts=row["num_attempts"],
    )


def row_to_attempt(row: dict[str, Any]) -> Attempt:
    return Attempt(**{**row, "metadata": loads(row["metadata"]) or {}})


def get_rollout(cur: duckdb.DuckDBPyConnection, rollout_id: str) -> Rollout:
    rows = fetch_dicts(cur.execute(f"SELECT {ROLLOUT_COLUMNS} FROM rollouts WHERE rollout_id = ?", [rollout_id]))
    if not rows:
        raise NotFoundError(f"unknown rollout_id {rollout_id!r}")
    return row_to_rollout(rows[0])


def get_attempt(cur: duckdb.DuckDBPyConnection, attempt_id: str) -> Attempt:
    rows = fetch_dicts(cur.execute(f"SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE attempt_id = ?", [attempt_id]))
    if not rows:
        raise NotFoundError(f"unknown attempt_id {attempt_id!r}")
    return row_to_attempt(rows[0])


def next_rollout_status(rollout: Rollout, attempt_status: FinishedAttemptStatus) -> RolloutStatus:
    """Where a rollout goes when its current attempt ends with ``attempt_status``."""
    if rollout.status == "cancelled":
        return "cancelled"
    if attempt_status == "succeeded":
        return "succeeded"
    retryable = attempt_status in rollout.config.retry_on
    if retryable and rollout.num_attempts < rollout.config.max_attempts:
        return "requeuing"
    return "failed"


def open_attempt(
    cur: duckdb.DuckDBPyConnection, rollout_id: str, worker_id: str | None, now: float, resources: str | None
) -> tuple[Rollout, Attempt]:
    """Start the next attempt of a waiting rollout (caller holds a transaction and picked the rollout).

    A rollout enqueued without ``resources_version`` takes ``resources`` (the latest versions, as
    ``name@version,...``) when first dequeued, and keeps it across retries.
    """
    rows = fetch_dicts(
        cur.execute(
            "UPDATE rollouts SET status = 'preparing', num_attempts = num_attempts + 1, "
            "start_time = coalesce(start_time, ?), resources_version = coalesce(resources_version, ?) "
            f"WHERE rollout_id = ? RETURNING {ROLLOUT_COLUMNS}",
            [now, resources, rollout_id],
        )
    )
    if not rows:
        raise NotFoundError(f"unknown rollout_id {rollout_id!r}")
    rollout = row_to_rollout(rows[0])
    attempt = Attempt(
        rollout_id=rollout_id,
        attempt_id=new_id("at"),
        sequence_id=rollout.num_attempts,
        worker_id=worker_id,
        status="preparing",
        start_time=now,
        last_heartbeat_time=now,
    )
    cur.execute(
        f"INSERT INTO attempts ({ATTEMPT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, NULL, ?, ?)",
        [attempt.attempt_id, rollout_id, attempt.sequence_id, worker_id, "preparing", now, now, "{}"],
    )
    return rollout, attempt


def record_heartbeat(cur: duckdb.DuckDBPyConnection, attempt: Attempt, now: float) -> Attempt:
    """Mark an active attempt alive and running (its rollout too, on the first beat)."""
    cur.execute(
        "UPDATE attempts SET last_heartbeat_time = ?, status = 'running' WHERE attempt_id = ?",
        [now, attempt.attempt_id],
    )
    if attempt.status == "preparing":
        cur.execute(
            "UPDATE rollouts SET status = 'running' WHERE rollout_id = ? AND status = 'preparing'",
            [attempt.rollout_id],
        )
    return attempt.model_copy(update={"status": "running", "last_heartbeat_time": now})


def close_attempt(
    cur: duckdb.DuckDBPyConnection, rollout: Rollout, attempt: Attempt, status: FinishedAttemptStatus, now: float
) -> Rollout:
    """End an active attempt of ``rollout`` and apply the retry policy; returns the rollout's new state.

    ``attempt`` is the live copy: its last heartbeat time, which may not have reached the file yet, is written too.
    """
    cur.execute(
        "UPDATE attempts SET status = ?, end_time = ?, last_heartbeat_time = ? WHERE attempt_id = ?",
        [status, now, attempt.last_heartbeat_time, attempt.attempt_id],
    )
    new_status = next_rollout_status(rollout, status)
    end_time = rollout.end_time if new_status in ("requeuing", "cancelled") else now
    cur.execute(
        "UPDATE rollouts SET status = ?, end_time = ? WHERE rollout_id = ?", [new_status, end_time, rollout.rollout_id]
    )
    return rollout.model_copy(update={"status": new_status, "end_time": end_time})


def active_attempts(cur: duckdb.DuckDBPyConnection) -> list[tuple[Rollout, Attempt]]:
    """Attempts still preparing or running, with their rollouts (to rebuild the queue index on open)."""
    ids = cur.execute("SELECT attempt_id FROM attempts WHERE status IN ('preparing', 'running')").fetchall()
    out = []
    for (attempt_id,) in ids:
        attempt = get_attempt(cur, attempt_id)
        out.append((get_rollout(cur, attempt.rollout_id), attempt))
    return out


def waiting_rollouts(cur: duckdb.DuckDBPyConnection) -> list[tuple[float, str, str]]:
    """(enqueue_time, rollout_id, mode) of every rollout waiting for an attempt."""
    return cur.execute(
        "SELECT enqueue_time, rollout_id, mode FROM rollouts WHERE status IN ('queuing', 'requeuing')"
    ).fetchall()


def cancel_rollout(cur: duckdb.DuckDBPyConnection, rollout_id: str, now: float) -> Rollout:
    rollout = get_rollout(cur, rollout_id)
    if rollout.status in ("succeeded", "failed", "cancelled"):
        return rollout
    cur.execute(
        "UPDATE attempts SET status = 'failed', end_time = ? "
        "WHERE rollout_id = ? AND status IN ('preparing', 'running')",
        [now, rollout_id],
    )
    cur.execute("UPDATE rollouts SET status = 'cancelled', end_time = ? WHERE rollout_id = ?", [now, rollout_id])
    return rollout.model_copy(update={"status": "cancelled", "end_time": now})
