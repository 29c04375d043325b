"""Stable SQL views over the span store: the surface users query with ``spanlab sql``.

The tables may grow columns; these views keep their names and meanings. Times are epoch seconds
(``*_time``) with a TIMESTAMP twin (``*_at``) for readability.
"""

from __future__ import annotations

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

CREATE OR REPLACE VIEW rewards AS
SELECT
    rollout_id, attempt_id, sequence_id, span_id, reward_name AS name, reward_value AS value,
    reward_call_span_id AS call_span_id, start_time, to_timestamp(start_time) AS recorded_at
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
    SELECT attempt_id, sum(reward_value) AS total_reward,
           arg_max(reward_value, sequence_id) FILTER (WHERE reward_call_span_id IS NULL) AS final_reward
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
"""

VIEW_NAMES: tuple[str, ...] = ("llm_calls", "rewards", "rollout_summary", "tito_sessions")
