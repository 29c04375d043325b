"""The rollout queue: its transitions as pure functions, and the SQL that reads and writes its tables.

``SpanStore`` holds the store's lock around each transition, so a dequeue that picks a rollout and
creates its attempt is atomic: two workers never get the same rollout. Transitions (:func:`opened`,
:func:`started`, :func:`closed`) compute the new rows in Python; the queue journal makes them durable
and :func:`write_states` writes them to the tables in groups (:mod:`spanlab.store.journal`). The retry
policy lives in :func:`next_rollout_status`, one pure function that tests can read like a table. Which
rollout to dequeue and which attempts are overdue is decided in memory (:mod:`spanlab.store.queue_index`).
"""

from __future__ import annotations

from typing import Any

import duckdb
import pyarrow as pa

from spanlab.errors import NotFoundError
from spanlab.store.connection import dumps, fetch_dicts, loads, registered, where_equal
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


def list_rollouts(cur: duckdb.DuckDBPyConnection, equals: dict[str, Any], limit: int, offset: int) -> list[Rollout]:
    """Rollouts in enqueue order, those whose columns equal the non-None values of ``equals``."""
    where, params = where_equal(equals)
    rows = fetch_dicts(cur.execute(
        f"SELECT {ROLLOUT_COLUMNS} FROM rollouts {where} ORDER BY enqueue_time, rollout_id LIMIT ? OFFSET ?",
        [*params, limit, offset]))
    return [row_to_rollout(r) for r in rows]


def first_stored_rollout(cur: duckdb.DuckDBPyConnection, rollout_ids: list[str]) -> str | None:
    """One of ``rollout_ids`` the rollouts table holds already, or None."""
    found = cur.execute("SELECT rollout_id FROM rollouts WHERE rollout_id IN (SELECT unnest(?::VARCHAR[])) LIMIT 1",
                        [rollout_ids]).fetchone()
    return found[0] if found else None


def list_attempts(cur: duckdb.DuckDBPyConnection, rollout_id: str) -> list[Attempt]:
    rows = fetch_dicts(cur.execute(
        f"SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE rollout_id = ? ORDER BY sequence_id", [rollout_id]))
    return [row_to_attempt(r) for r in rows]


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


def opened(rollout: Rollout, worker_id: str | None, now: float, resources: str | None) -> tuple[Rollout, Attempt]:
    """A waiting rollout and its new attempt once dequeued.

    A rollout enqueued without ``resources_version`` takes ``resources`` (the latest versions, as
    ``name@version,...``) when first dequeued, and keeps it across retries.
    """
    rollout = rollout.model_copy(update={
        "status": "preparing",
        "num_attempts": rollout.num_attempts + 1,
        "start_time": rollout.start_time if rollout.start_time is not None else now,
        "resources_version": rollout.resources_version if rollout.resources_version is not None else resources,
    })
    attempt = Attempt(
        rollout_id=rollout.rollout_id,
        attempt_id=new_id("at"),
        sequence_id=rollout.num_attempts,
        worker_id=worker_id,
        status="preparing",
        start_time=now,
        last_heartbeat_time=now,
    )
    return rollout, attempt


def started(rollout: Rollout, attempt: Attempt, now: float) -> tuple[Rollout, Attempt]:
    """A preparing attempt (and its rollout) after its first heartbeat."""
    status = "running" if rollout.status == "preparing" else rollout.status
    return (rollout.model_copy(update={"status": status}),
            attempt.model_copy(update={"status": "running", "last_heartbeat_time": now}))


def closed(
    rollout: Rollout, attempt: Attempt, status: FinishedAttemptStatus, now: float
) -> tuple[Rollout, Attempt]:
    """An active attempt and its rollout once the attempt ends, with the retry policy applied."""
    new_status = next_rollout_status(rollout, status)
    end_time = rollout.end_time if new_status in ("requeuing", "cancelled") else now
    return (rollout.model_copy(update={"status": new_status, "end_time": end_time}),
            attempt.model_copy(update={"status": status, "end_time": now}))


def write_states(cur: duckdb.DuckDBPyConnection, new_rollouts: list[Rollout], rollouts: list[dict[str, Any]],
                 attempts: list[Attempt]) -> None:
    """Write queue states (the resulting rows, so writing one twice is harmless) with up to three statements.

    Called inside the caller's transaction. ``new_rollouts`` are enqueued rollouts, inserted unless there
    already; ``rollouts`` hold the columns a transition changes (:data:`spanlab.store.journal.ROLLOUT_STATE`);
    attempts are whole rows, inserted or replaced.
    """
    if new_rollouts:
        with registered(cur, "_new_rollouts", rollouts_to_arrow(new_rollouts)):
            cur.execute(f"INSERT OR IGNORE INTO rollouts ({ROLLOUT_COLUMNS}) SELECT * FROM _new_rollouts")
    if attempts:
        tbl = pa.table({
            "attempt_id": [a.attempt_id for a in attempts],
            "rollout_id": [a.rollout_id for a in attempts],
            "sequence_id": pa.array([a.sequence_id for a in attempts], pa.int32()),
            "worker_id": pa.array([a.worker_id for a in attempts], pa.string()),
            "status": [a.status for a in attempts],
            "start_time": pa.array([a.start_time for a in attempts], pa.float64()),
            "end_time": pa.array([a.end_time for a in attempts], pa.float64()),
            "last_heartbeat_time": pa.array([a.last_heartbeat_time for a in attempts], pa.float64()),
            "metadata": [dumps(a.metadata) for a in attempts],
        })
        with registered(cur, "_attempt_states", tbl):
            cur.execute(f"INSERT OR REPLACE INTO attempts ({ATTEMPT_COLUMNS}) SELECT * FROM _attempt_states")
    if rollouts:
        tbl = pa.table({
            "rollout_id": [r["rollout_id"] for r in rollouts],
            "status": [r["status"] for r in rollouts],
            "num_attempts": pa.array([r["num_attempts"] for r in rollouts], pa.int32()),
            "start_time": pa.array([r["start_time"] for r in rollouts], pa.float64()),
            "end_time": pa.array([r["end_time"] for r in rollouts], pa.float64()),
            "resources_version": pa.array([r["resources_version"] for r in rollouts], pa.string()),
        })
        with registered(cur, "_rollout_states", tbl):
            cur.execute(
                "UPDATE rollouts SET status = s.status, num_attempts = s.num_attempts, start_time = s.start_time, "
                "end_time = s.end_time, resources_version = s.resources_version "
                "FROM _rollout_states s WHERE rollouts.rollout_id = s.rollout_id"
            )


def active_attempts(cur: duckdb.DuckDBPyConnection) -> list[tuple[Rollout, Attempt]]:
    """Attempts still preparing or running, with their rollouts (to rebuild the queue index on open)."""
    ids = cur.execute("SELECT attempt_id FROM attempts WHERE status IN ('preparing', 'running')").fetchall()
    out = []
    for (attempt_id,) in ids:
        attempt = get_attempt(cur, attempt_id)
        out.append((get_rollout(cur, attempt.rollout_id), attempt))
    return out


def waiting_rollouts(cur: duckdb.DuckDBPyConnection) -> list[Rollout]:
    """Every rollout waiting for an attempt (held in memory by the queue index, so dequeue reads no row)."""
    rows = fetch_dicts(
        cur.execute(f"SELECT {ROLLOUT_COLUMNS} FROM rollouts WHERE status IN ('queuing', 'requeuing')")
    )
    return [row_to_rollout(r) for r in rows]


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
