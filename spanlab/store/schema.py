"""DuckDB tables and views of the span store, and the Arrow schema spans are ingested with.

Token IDs are ``INTEGER[]`` and logprobs ``FLOAT[]``: a column store keeps them compact and reads them back
as Arrow list arrays without ever building Python ints. What users filter on (kind, model, finish reason,
reward value, token counts) is a column of its own; free-form payloads (messages, tools, attributes) are
JSON. The views are the stable surface of ``spanlab sql``: the tables may grow columns, the views keep their
names and meanings. Times are epoch seconds (``*_time``) with a TIMESTAMP twin (``*_at``).

Opening a file another process holds read-write (DuckDB allows one), or one that is not a DuckDB database,
fails with a spanlab error that says what to do, and the file is never touched.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from spanlab.errors import InvalidSpanError, StoreError, StoreLockedError
from spanlab.jsonpolicy import MAX_DEPTH, check_depth, decode, may_nest_deeper

MEMORY = ":memory:"

# Settings of the user-facing query surface (`spanlab sql`, the UI, the store server's /sql): no file,
# network or extension access, so SQL cannot read /etc/passwd or write anywhere; and a memory limit, so one
# query cannot take the machine's memory (DuckDB's default is 80% of it): past it the query fails, or spills
# to the file's temporary folder where its operators can. It is the whole database's limit (DuckDB has no
# per-query one), which the store's own reads fit in with room to spare. Locked last.
USER_SQL_MEMORY_LIMIT = "192MB"
SAFE_QUERY_CONFIG: dict[str, Any] = {
    "enable_external_access": False, "autoinstall_known_extensions": False, "autoload_known_extensions": False,
    "allow_community_extensions": False, "memory_limit": USER_SQL_MEMORY_LIMIT, "lock_configuration": True,
}


def connect(path: str | Path, *, read_only: bool = False, safe: bool = False) -> duckdb.DuckDBPyConnection:
    """Open ``path`` (or ``:memory:``); ``safe`` applies :data:`SAFE_QUERY_CONFIG`."""
    target = str(path)
    if target != MEMORY:
        p = Path(target)
        if read_only and not p.exists():
            raise StoreError(f"no span store at {p}: the file does not exist (set --db or SPANLAB_DB)")
        if not read_only:
            p.parent.mkdir(parents=True, exist_ok=True)
    try:
        return duckdb.connect(target, read_only=read_only, config=dict(SAFE_QUERY_CONFIG) if safe else {})
    except duckdb.Error as exc:
        raise translate_open_error(target, exc) from exc


def translate_open_error(path: str, exc: Exception) -> StoreError:
    msg = str(exc)
    # "Corrupt database file: ... checksum ... for block ...": "block" holds "lock", so the lock test is exact.
    if "could not set lock" in msg.lower() or "conflicting lock" in msg.lower():
        holder = f" (PID {pid.group(1)})" if (pid := re.search(r"PID (\d+)", msg)) else ""
        return StoreLockedError(f"span store {path} is held read-write by another process{holder}. Only one process "
                                "may open it while it is written: stop that process, or query through its store "
                                "server (spanlab sql --url http://HOST:PORT, served by spanlab store serve or "
                                f"spanlab serve's store_server). DuckDB said: {msg}")
    if any(word in msg.lower() for word in ("not a valid duckdb database", "corrupt", "invalid", "serializ")):
        return StoreError(f"span store {path} is not a readable DuckDB database (corrupt or another kind of file); "
                          f"it was left untouched. DuckDB said: {msg}")
    return StoreError(f"cannot open span store {path}: {msg}")


def dumps(value: Any, *, allow_nan: bool = False) -> str | None:
    """JSON for a JSON column; None stays SQL NULL. What no read could answer with (the JSON policy,
    :mod:`spanlab.jsonpolicy`: nesting past 100 levels; NaN and Infinity unless ``allow_nan``) is an
    ``InvalidSpanError`` (a ``ValueError``) before anything is stored."""
    if value is None:
        return None
    try:
        text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=allow_nan)
        if may_nest_deeper(text):
            check_depth(value, what="a JSON value")
        return text
    except RecursionError:  # nesting far past the policy's limit exhausts the encoder before any check
        raise InvalidSpanError(f"cannot store {type(value).__name__} as JSON: it is nested deeper than {MAX_DEPTH} "
                               "levels; nothing was stored") from None
    except ValueError as exc:
        raise InvalidSpanError(f"cannot store {type(value).__name__} as JSON: {exc}; nothing was stored") from None


def loads(value: str | None) -> Any:
    """A JSON column's value, read by the policy (:mod:`spanlab.jsonpolicy`); what it refuses is quarantined
    by the caller (:mod:`spanlab.store.quarantine`)."""
    return None if value is None else decode(value, what="a stored JSON value")


def fetch_dicts(cur: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
    """Rows of the last result as dicts (small results only: queue rows, resources)."""
    names = [d[0] for d in cur.description or []]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


IN_LIST = "IN (SELECT unnest(?::VARCHAR[]))"  # a whole list of strings as one parameter


def where(filters: dict[str, Any], *extra: tuple[str, list[Any]]) -> tuple[str, list[Any]]:
    """The WHERE clause ("" for none) of the filters given, and its parameters: a string or number is
    ``column = ?``, a list ``column IN (...)``, None no filter; ``extra`` conditions come with their own."""
    parts = [(f"{k} = ?", [v]) if isinstance(v, (str, int, float)) else (f"{k} {IN_LIST}", [list(v)])
             for k, v in filters.items() if v is not None] + list(extra)
    return ("WHERE " + " AND ".join(c for c, _ in parts)) if parts else "", [p for _, ps in parts for p in ps]


SCHEMA_VERSION = 1

# The tables, column by column: their DDL and the queue's column lists are written from these.
META_COLUMNS = {"key": "VARCHAR PRIMARY KEY", "value": "VARCHAR"}
RESOURCE_COLUMNS = {"name": "VARCHAR NOT NULL", "version": "INTEGER NOT NULL", "kind": "VARCHAR NOT NULL",
                    "payload": "JSON", "created_time": "DOUBLE NOT NULL"}
# long format (one row per metric per step) so new metrics need no migration and SQL can pivot
METRIC_COLUMNS = {"run_id": "VARCHAR NOT NULL", "algorithm": "VARCHAR NOT NULL", "step": "INTEGER NOT NULL",
                  "name": "VARCHAR NOT NULL", "value": "DOUBLE", "time": "DOUBLE NOT NULL"}
ROLLOUT_COLUMNS = {
    "rollout_id": "VARCHAR PRIMARY KEY", "input": "JSON", "mode": "VARCHAR NOT NULL", "status": "VARCHAR NOT NULL",
    "resources_version": "VARCHAR", "timeout_s": "DOUBLE", "unresponsive_s": "DOUBLE",
    "max_attempts": "INTEGER NOT NULL", "retry_on": "VARCHAR[] NOT NULL", "metadata": "JSON",
    "enqueue_time": "DOUBLE NOT NULL", "start_time": "DOUBLE", "end_time": "DOUBLE", "num_attempts": "INTEGER NOT NULL",
}
ATTEMPT_COLUMNS = {
    "attempt_id": "VARCHAR PRIMARY KEY", "rollout_id": "VARCHAR NOT NULL", "sequence_id": "INTEGER NOT NULL",
    "worker_id": "VARCHAR", "status": "VARCHAR NOT NULL", "start_time": "DOUBLE NOT NULL", "end_time": "DOUBLE",
    "last_heartbeat_time": "DOUBLE", "metadata": "JSON",
}

_S, _I, _F, _IDS, _FLOATS, _BYTES = (pa.string(), pa.int32(), pa.float64(), pa.list_(pa.int32()),
                                     pa.list_(pa.float32()), pa.list_(pa.uint8()))
SPAN_ARROW_SCHEMA = pa.schema([  # the spans table's columns, in its order: its DDL is written from this
    ("span_id", _S), ("rollout_id", _S), ("attempt_id", _S), ("sequence_id", _I), ("parent_id", _S), ("name", _S),
    ("kind", _S), ("start_time", _F), ("end_time", _F), ("status", _S), ("attributes", _S), ("model", _S),
    ("request_messages", _S), ("request_tools", _S), ("response_message", _S), ("finish_reason", _S),
    ("prompt_token_ids", _IDS), ("response_token_ids", _IDS), ("response_logprobs", _FLOATS), ("loss_mask", _BYTES),
    ("prompt_tokens", _I), ("completion_tokens", _I), ("total_tokens", _I),
    ("reward_name", _S), ("reward_value", _F), ("reward_call_span_id", _S),
])

SPAN_COLUMNS: tuple[str, ...] = tuple(SPAN_ARROW_SCHEMA.names)
JSON_SPAN_COLUMNS: tuple[str, ...] = ("attributes", "request_messages", "request_tools", "response_message")
# The largest JSON column of one stored span, in bytes (UTF-8). The one size limit of a recorded call: the store
# refuses a span over it, and the gateway refuses a request body over it at the door (413, before the engine is
# called), so no call is generated that its record could not hold (spanlab.gateway.oversize, docs/gateway.md).
MAX_JSON_BYTES = 16 * 1024 * 1024
REQUIRED_SPAN_COLUMNS = ("span_id", "name", "kind", "start_time", "status")  # sequence_id: filled in if absent
_SQL_TYPES = {_S: "VARCHAR", _I: "INTEGER", _F: "DOUBLE", _IDS: "INTEGER[]", _FLOATS: "FLOAT[]", _BYTES: "UTINYINT[]"}
# No PRIMARY KEY: an ART index cuts ingest ~4x; the store dedupes span_id per attempt itself.
_SPAN_SQL = {f.name: ("JSON" if f.name in JSON_SPAN_COLUMNS else _SQL_TYPES[f.type])
             + (" NOT NULL" if f.name in (*REQUIRED_SPAN_COLUMNS, "sequence_id") else "") for f in SPAN_ARROW_SCHEMA}


def _create(table: str, columns: dict[str, str], *constraints: str) -> str:
    parts = [f"{k} {v}" for k, v in columns.items()] + list(constraints)
    return f"CREATE TABLE IF NOT EXISTS {table} ({', '.join(parts)});"


def schema_version_problem(path: str, stored: object) -> str | None:
    """Why a store whose ``spanlab_meta`` says ``stored`` cannot be opened by this spanlab; None when it can. One
    rule for opening a store and for ``spanlab train --check`` (:mod:`spanlab.jobs.file_checks`)."""
    if not str(stored).isdigit():
        return f"{path} has a spanlab_meta table without a schema version: not a span store"
    if int(str(stored)) > SCHEMA_VERSION:
        return f"{path} was written by a newer spanlab (schema {stored} > {SCHEMA_VERSION}); upgrade spanlab"
    return None


def init(cur: duckdb.DuckDBPyConnection, path: str) -> None:
    """Create the tables and views a file lacks (in the caller's transaction); refuse a newer schema."""
    cur.execute(_create("spanlab_meta", META_COLUMNS) + _create("train_metrics", METRIC_COLUMNS)
                + _create("resources", RESOURCE_COLUMNS, "PRIMARY KEY (name, version)")
                + _create("rollouts", ROLLOUT_COLUMNS) + _create("attempts", ATTEMPT_COLUMNS)
                + _create("spans", _SPAN_SQL))
    rows = cur.execute("SELECT value FROM spanlab_meta WHERE key = 'schema_version'").fetchall()
    if not rows:
        cur.execute("INSERT INTO spanlab_meta VALUES ('schema_version', ?)", [str(SCHEMA_VERSION)])
    elif problem := schema_version_problem(path, rows[0][0]):
        raise StoreError(problem)
    cur.execute("INSERT OR IGNORE INTO spanlab_meta VALUES ('store_id', uuid()::VARCHAR)")  # pairs the hot store
    cur.execute("INSERT OR IGNORE INTO spanlab_meta VALUES ('hot_seq', '0')")  # the last write copied from it
    cur.execute(VIEWS_DDL)


# An attempt's final reward (spanlab.adapters.trainable, rule 3), an aggregate over its reward spans: the last one
# marked final (attributes.final true), else, in a store written before the marker, the last unmarked one tied to
# no call; never one that arrived after the attempt ended (attributes.late true, set by the store). ``{where}``
# narrows the rows it reads (the UI's query reads spans of every kind).
_MARK = "(attributes->'$.final')::VARCHAR"
ON_TIME = "(attributes->'$.late')::VARCHAR IS DISTINCT FROM 'true'"  # a reward that is not late
FINAL_REWARD_SQL = ("coalesce(arg_max({value}, sequence_id) FILTER (WHERE {where} AND " + ON_TIME + " AND " + _MARK
                    + " = 'true'), arg_max({value}, sequence_id) FILTER (WHERE {where} AND " + ON_TIME + " AND "
                    "reward_call_span_id IS NULL AND " + _MARK + " IS DISTINCT FROM 'true' AND " + _MARK
                    + " IS DISTINCT FROM 'false'))")


def final_reward_sql(value: str = "reward_value", where: str = "TRUE") -> str:
    """:data:`FINAL_REWARD_SQL` of column ``value`` over the rows ``where`` holds (a SQL condition)."""
    return FINAL_REWARD_SQL.format(value=value, where=where)


VIEWS_DDL = """
CREATE OR REPLACE VIEW llm_calls AS
SELECT
    rollout_id, attempt_id, sequence_id, span_id, parent_id, attributes->>'$.agent' AS agent,
    name, model, status, finish_reason, start_time, end_time, end_time - start_time AS latency_s,
    to_timestamp(start_time) AS started_at,
    len(prompt_token_ids) AS prompt_len, len(response_token_ids) AS response_len,
    prompt_tokens, completion_tokens, total_tokens,
    request_messages, request_tools, response_message,
    prompt_token_ids, response_token_ids, response_logprobs, loss_mask, attributes
FROM spans
WHERE kind = 'llm_call';

CREATE OR REPLACE VIEW demonstrations AS
SELECT
    span_id, attributes->>'$.run_id' AS run_id, attributes->>'$.source' AS source,
    attributes->>'$.task_id' AS task_id, (attributes->>'$.level')::INTEGER AS level, model,
    to_timestamp(start_time) AS recorded_at, len(prompt_token_ids) + len(response_token_ids) AS num_tokens,
    list_sum(loss_mask)::BIGINT AS trained_tokens, request_messages, prompt_token_ids, response_token_ids,
    loss_mask, attributes
FROM spans
WHERE kind = 'demonstration';

CREATE OR REPLACE VIEW rewards AS
SELECT
    rollout_id, attempt_id, sequence_id, span_id, reward_name AS name, reward_value AS value,
    reward_call_span_id AS call_span_id, TRY_CAST(attributes->'$.final' AS BOOLEAN) AS final,
    coalesce(TRY_CAST(attributes->'$.late' AS BOOLEAN), false) AS late,
    start_time, to_timestamp(start_time) AS recorded_at
FROM spans
WHERE kind = 'reward';

CREATE OR REPLACE VIEW rollout_summary AS
WITH last_attempt AS (
    SELECT rollout_id, arg_max(attempt_id, sequence_id) AS attempt_id,
           arg_max(worker_id, sequence_id) AS worker_id
    FROM attempts GROUP BY rollout_id
), calls AS (
    SELECT attempt_id, count(*) AS llm_calls,
           sum(len(prompt_token_ids))::BIGINT AS prompt_tokens, sum(len(response_token_ids))::BIGINT AS response_tokens
    FROM spans WHERE kind = 'llm_call' GROUP BY attempt_id
), rw AS (
    SELECT attempt_id, sum(reward_value) FILTER (WHERE {on_time}) AS total_reward, {final_reward} AS final_reward
    FROM spans WHERE kind = 'reward' GROUP BY attempt_id
)
SELECT
    r.rollout_id, r.mode, r.status, r.num_attempts AS attempts, la.attempt_id AS last_attempt_id,
    la.worker_id, coalesce(c.llm_calls, 0) AS llm_calls,
    coalesce(c.prompt_tokens, 0) AS prompt_tokens, coalesce(c.response_tokens, 0) AS response_tokens,
    rw.total_reward, rw.final_reward, r.resources_version,
    r.enqueue_time, r.start_time, r.end_time, r.end_time - r.start_time AS duration_s,
    to_timestamp(r.enqueue_time) AS enqueued_at, r.input, r.metadata
FROM rollouts r
LEFT JOIN last_attempt la USING (rollout_id)
LEFT JOIN calls c ON c.attempt_id = la.attempt_id
LEFT JOIN rw ON rw.attempt_id = la.attempt_id;

-- TITO sessions (docs/tito.md): one row per (attempt, agent, segment), read from the segment's last successful
-- call, whose prompt + response IS the segment and whose loss_mask covers it (1 on sampled IDs only).
-- A whole session is its segments in order; segment_start is each one's offset in it (the boundaries).
CREATE OR REPLACE VIEW tito_sessions AS
WITH calls AS (
    SELECT rollout_id, attempt_id, attributes->>'$.agent' AS agent, sequence_id, span_id, finish_reason,
           CAST(attributes->>'$.tito.segment' AS INTEGER) AS segment,
           CAST(attributes->>'$.tito.offset' AS BIGINT) AS segment_start,
           CAST(attributes->>'$.tito.call' AS INTEGER) AS call,
           prompt_token_ids, response_token_ids, response_logprobs, loss_mask
    FROM spans
    WHERE kind = 'llm_call' AND status = 'ok' AND attributes->>'$.tito.mode' = 'tito'
)
SELECT
    rollout_id, attempt_id, agent, segment, min(segment_start) AS segment_start, count(*) AS calls,
    arg_max(list_concat(prompt_token_ids, response_token_ids), call) AS token_ids,
    arg_max(loss_mask, call) AS loss_mask,
    flatten(list(response_logprobs ORDER BY call)) AS logprobs,
    len(arg_max(list_concat(prompt_token_ids, response_token_ids), call)) AS num_tokens,
    list_sum(arg_max(loss_mask, call)) AS num_sampled,
    list(span_id ORDER BY call) AS span_ids, arg_max(finish_reason, call) AS finish_reason
FROM calls
GROUP BY rollout_id, attempt_id, agent, segment;

-- Per role (attributes.agent; NULL for a single agent's calls) and policy (attributes.policy; NULL until the
-- gateway records one) of each training step (metadata.step; an SFT run's metadata.round; NULL for an async
-- loop's rollouts) of each run: the last attempts' calls, their final reward, and the intermediate rewards the
-- role earned. An intermediate reward is every reward span but an attempt's final one (as in rollout_summary:
-- spanlab.adapters.trainable, rule 3); it is the role's whose call it names (call_span_id), else the role of
-- the last call recorded before it (an ASOF join on sequence_id): what that turn's work was rewarded with.
-- policy_versions: the versions of the policy that answered the calls (attributes.policy_version), sorted.
CREATE OR REPLACE VIEW role_summary AS
WITH last_attempt AS (
    SELECT rollout_id, arg_max(attempt_id, sequence_id) AS attempt_id FROM attempts GROUP BY rollout_id
), calls AS (
    SELECT s.rollout_id, s.attempt_id, s.span_id, s.sequence_id, s.attributes->>'$.agent' AS role,
           s.attributes->>'$.policy' AS policy, s.attributes->>'$.policy_version' AS policy_version,
           len(s.response_token_ids) AS response_tokens
    FROM spans s JOIN last_attempt la USING (attempt_id)
    WHERE s.kind = 'llm_call'
), rw AS (
    SELECT s.attempt_id, s.span_id, s.sequence_id, s.reward_value, s.reward_call_span_id, s.attributes
    FROM spans s JOIN last_attempt la USING (attempt_id)
    WHERE s.kind = 'reward' AND {on_time}
), finals AS (
    SELECT attempt_id, {final_reward} AS final_reward, {final_span} AS span_id
    FROM rw GROUP BY attempt_id HAVING span_id IS NOT NULL
), intermediate AS (
    SELECT coalesce(tied.span_id, prev.span_id) AS call_span_id, rw.reward_value
    FROM rw
    ASOF LEFT JOIN calls prev ON rw.attempt_id = prev.attempt_id AND rw.sequence_id > prev.sequence_id
    LEFT JOIN calls tied ON tied.span_id = rw.reward_call_span_id AND tied.attempt_id = rw.attempt_id
    WHERE rw.span_id NOT IN (SELECT span_id FROM finals)
), turn_rewards AS (
    SELECT call_span_id AS span_id, count(*) AS rewards, sum(reward_value) AS reward
    FROM intermediate WHERE call_span_id IS NOT NULL GROUP BY call_span_id
), per_attempt AS (
    SELECT c.rollout_id, c.attempt_id, c.role, c.policy, count(*) AS llm_calls,
           sum(c.response_tokens)::BIGINT AS response_tokens,
           coalesce(sum(t.rewards), 0)::BIGINT AS intermediate_rewards, sum(t.reward) AS intermediate_reward,
           coalesce(list(DISTINCT c.policy_version) FILTER (WHERE c.policy_version IS NOT NULL), [])
               AS policy_versions
    FROM calls c LEFT JOIN turn_rewards t USING (span_id)
    GROUP BY c.rollout_id, c.attempt_id, c.role, c.policy
)
SELECT
    r.metadata->>'$.run_id' AS run_id,
    TRY_CAST(coalesce(r.metadata->>'$.step', r.metadata->>'$.round') AS INTEGER) AS step,
    r.mode, p.role, p.policy, count(*) AS rollouts, sum(p.llm_calls)::BIGINT AS llm_calls,
    sum(p.response_tokens)::BIGINT AS response_tokens,
    avg(f.final_reward) AS final_reward_mean, count(f.final_reward) AS final_rewards,
    sum(p.intermediate_rewards)::BIGINT AS intermediate_rewards, sum(p.intermediate_reward) AS intermediate_reward_sum,
    sum(p.intermediate_reward) / nullif(sum(p.intermediate_rewards), 0) AS intermediate_reward_mean,
    list_sort(list_distinct(flatten(list(p.policy_versions)))) AS policy_versions
FROM per_attempt p
JOIN rollouts r USING (rollout_id)
LEFT JOIN finals f USING (attempt_id)
GROUP BY ALL;
""".format(final_reward=final_reward_sql(), final_span=final_reward_sql("span_id"), on_time=ON_TIME)
