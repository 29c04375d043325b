"""DuckDB tables of the span store and the Arrow schema spans are ingested with.

Token IDs are ``INTEGER[]`` and logprobs ``FLOAT[]``: a column store keeps them compact and reads
them back as Arrow list arrays without ever building Python ints. Everything the user might want to
filter on (kind, model, finish reason, reward value, token counts) is its own column; free-form
payloads (messages, tools, attributes) are JSON.
"""

from __future__ import annotations

import pyarrow as pa

SCHEMA_VERSION = 1

TABLES_DDL = """
CREATE TABLE IF NOT EXISTS spanlab_meta (
    key VARCHAR PRIMARY KEY,
    value VARCHAR
);
CREATE TABLE IF NOT EXISTS rollouts (
    rollout_id VARCHAR PRIMARY KEY,
    input JSON,
    mode VARCHAR NOT NULL,
    status VARCHAR NOT NULL,
    resources_version VARCHAR,
    timeout_s DOUBLE,
    unresponsive_s DOUBLE,
    max_attempts INTEGER NOT NULL,
    retry_on VARCHAR[] NOT NULL,
    metadata JSON,
    enqueue_time DOUBLE NOT NULL,
    start_time DOUBLE,
    end_time DOUBLE,
    num_attempts INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS attempts (
    attempt_id VARCHAR PRIMARY KEY,
    rollout_id VARCHAR NOT NULL,
    sequence_id INTEGER NOT NULL,
    worker_id VARCHAR,
    status VARCHAR NOT NULL,
    start_time DOUBLE NOT NULL,
    end_time DOUBLE,
    last_heartbeat_time DOUBLE,
    metadata JSON
);
CREATE TABLE IF NOT EXISTS spans (
    -- no PRIMARY KEY: an ART index cuts ingest ~4x; the store dedupes span_id per attempt itself
    span_id VARCHAR NOT NULL,
    rollout_id VARCHAR,
    attempt_id VARCHAR,
    sequence_id INTEGER NOT NULL,
    parent_id VARCHAR,
    name VARCHAR NOT NULL,
    kind VARCHAR NOT NULL,
    start_time DOUBLE NOT NULL,
    end_time DOUBLE,
    status VARCHAR NOT NULL,
    attributes JSON,
    model VARCHAR,
    request_messages JSON,
    request_tools JSON,
    response_message JSON,
    finish_reason VARCHAR,
    prompt_token_ids INTEGER[],
    response_token_ids INTEGER[],
    response_logprobs FLOAT[],
    loss_mask UTINYINT[],
    prompt_tokens INTEGER,
    completion_tokens INTEGER,
    total_tokens INTEGER,
    reward_name VARCHAR,
    reward_value DOUBLE,
    reward_call_span_id VARCHAR
);
CREATE TABLE IF NOT EXISTS resources (
    name VARCHAR NOT NULL,
    version INTEGER NOT NULL,
    kind VARCHAR NOT NULL,
    payload JSON,
    created_time DOUBLE NOT NULL,
    PRIMARY KEY (name, version)
);
CREATE TABLE IF NOT EXISTS train_metrics (
    -- long format (one row per metric per step) so new metrics need no migration and SQL can pivot
    run_id VARCHAR NOT NULL,
    algorithm VARCHAR NOT NULL,
    step INTEGER NOT NULL,
    name VARCHAR NOT NULL,
    value DOUBLE,
    time DOUBLE NOT NULL
);
"""

_S, _I, _F, _IDS = pa.string(), pa.int32(), pa.float64(), pa.list_(pa.int32())
SPAN_ARROW_SCHEMA = pa.schema([  # the spans table's columns, in its order (a test checks it)
    ("span_id", _S), ("rollout_id", _S), ("attempt_id", _S), ("sequence_id", _I), ("parent_id", _S), ("name", _S),
    ("kind", _S), ("start_time", _F), ("end_time", _F), ("status", _S), ("attributes", _S), ("model", _S),
    ("request_messages", _S), ("request_tools", _S), ("response_message", _S), ("finish_reason", _S),
    ("prompt_token_ids", _IDS), ("response_token_ids", _IDS), ("response_logprobs", pa.list_(pa.float32())),
    ("loss_mask", pa.list_(pa.uint8())), ("prompt_tokens", _I), ("completion_tokens", _I), ("total_tokens", _I),
    ("reward_name", _S), ("reward_value", _F), ("reward_call_span_id", _S),
])

SPAN_COLUMNS: tuple[str, ...] = tuple(SPAN_ARROW_SCHEMA.names)
JSON_SPAN_COLUMNS: tuple[str, ...] = ("attributes", "request_messages", "request_tools", "response_message")
