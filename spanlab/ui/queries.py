"""The web UI's reads: every one bounded (LIMIT/OFFSET, a key lookup, or one run's metrics), filters as parameters.

Why not ``SELECT ... FROM rollout_summary LIMIT 50``: that view aggregates every span of the store before the
LIMIT applies, and reading ``len(prompt_token_ids)`` for all spans reads every token list (gigabytes on a
100k-span store). Here the page of rollouts is chosen from the small ``rollouts`` table first, then only its
last attempts' spans are summarized (an ``IN`` list of constants, which DuckDB pushes into the scan). The
columns and their meaning are those of ``rollout_summary`` (calls, tokens and rewards of the last attempt).

Reads of token columns go in two steps (:func:`_span_rowids`): the matching rows' ``rowid``s from the scalar
key columns, then the token lists by ``rowid``. A filter on ``attempt_id`` cannot skip row groups (IDs are
random), and DuckDB then loads every row group's list segments: 170 ms on a freshly opened 100k-span file,
against 25 ms by rowid (the UI opens the file per request, so its reads are always cold).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import duckdb

from spanlab.errors import NotFoundError
from spanlab.store.schema import ON_TIME, final_reward_sql
from spanlab.ui.db import fetch, fetch_arrow, objects

RolloutSort = Literal["newest", "oldest"]
_ORDER: dict[RolloutSort, str] = {"newest": "enqueue_time DESC, rollout_id", "oldest": "enqueue_time, rollout_id"}

# the final reward of each rollout's last attempt, as in rollout_summary; only built when a reward filter asks
_FINAL_REWARD_SQL = f"""
SELECT la.rollout_id FROM (
    SELECT rollout_id, arg_max(attempt_id, sequence_id) AS attempt_id FROM attempts GROUP BY rollout_id
) la JOIN (
    SELECT attempt_id, {final_reward_sql()} AS reward
    FROM spans WHERE kind = 'reward' GROUP BY attempt_id
) w USING (attempt_id) WHERE w.reward >= ? AND w.reward <= ?
"""


@dataclass(frozen=True)
class RolloutFilter:
    """Filters of the rollouts table; ``None`` means not filtered."""

    status: str | None = None
    mode: str | None = None
    version: str | None = None
    search: str | None = None  # substring of the rollout ID or its input JSON
    min_reward: float | None = None
    max_reward: float | None = None

    def where(self) -> tuple[str, list[Any]]:
        parts: list[str] = []
        params: list[Any] = []
        for column, value in (("status", self.status), ("mode", self.mode), ("resources_version", self.version)):
            if value:
                parts.append(f"{column} = ?")
                params.append(value)
        if self.search:
            parts.append("(contains(rollout_id, ?) OR contains(CAST(input AS VARCHAR), ?))")
            params += [self.search, self.search]
        if self.min_reward is not None or self.max_reward is not None:
            lo = self.min_reward if self.min_reward is not None else float("-inf")
            hi = self.max_reward if self.max_reward is not None else float("inf")
            parts.append(f"rollout_id IN ({_FINAL_REWARD_SQL})")
            params += [lo, hi]
        return ("WHERE " + " AND ".join(parts) if parts else ""), params


def _placeholders(n: int) -> str:
    return ", ".join("?" * n)


def _span_rowids(conn: duckdb.DuckDBPyConnection, condition: str, params: list[Any]) -> str:
    """``rowid IN (...)`` for the spans matching ``condition`` (which may end in ORDER BY/LIMIT): see the
    module docstring. Valid on this connection only; ``rowid IN (NULL)`` when nothing matches."""
    ids = [r["rowid"] for r in fetch(conn, f"SELECT rowid FROM spans WHERE {condition}", params)]
    return f"rowid IN ({', '.join(str(int(i)) for i in ids) or 'NULL'})"


def _attempt_summaries(conn: duckdb.DuckDBPyConnection, attempt_ids: list[str]) -> dict[str, dict[str, Any]]:
    if not attempt_ids:
        return {}
    rows = _span_rowids(conn, f"attempt_id IN ({_placeholders(len(attempt_ids))})", attempt_ids)
    found = fetch(conn, f"""
        SELECT attempt_id, count(*) FILTER (WHERE kind = 'llm_call') AS llm_calls,
               coalesce(sum(len(prompt_token_ids)) FILTER (WHERE kind = 'llm_call'), 0)::BIGINT AS prompt_tokens,
               coalesce(sum(len(response_token_ids)) FILTER (WHERE kind = 'llm_call'), 0)::BIGINT AS response_tokens,
               sum(reward_value) FILTER (WHERE kind = 'reward' AND {ON_TIME}) AS total_reward,
               {final_reward_sql(where="kind = 'reward'")} AS final_reward
        FROM spans WHERE {rows} GROUP BY attempt_id""")
    return {r.pop("attempt_id"): r for r in found}


def rollouts_page(conn: duckdb.DuckDBPyConnection, flt: RolloutFilter, *, sort: RolloutSort = "newest",
                  offset: int = 0, limit: int = 50) -> dict[str, Any]:
    """One page of rollouts with their last attempt's calls, tokens and rewards, plus the filtered total."""
    where, params = flt.where()
    total = fetch(conn, f"SELECT count(*) AS n FROM rollouts {where}", params)[0]["n"]
    page = fetch(conn, f"""
        SELECT rollout_id, mode, status, num_attempts AS attempts, resources_version, enqueue_time,
               end_time - start_time AS duration_s, left(CAST(input AS VARCHAR), 160) AS input
        FROM rollouts {where} ORDER BY {_ORDER[sort]} LIMIT ? OFFSET ?""", [*params, limit, offset])
    ids = [r["rollout_id"] for r in page]
    last = {} if not ids else {r["rollout_id"]: r for r in fetch(conn, f"""
        SELECT rollout_id, arg_max(attempt_id, sequence_id) AS last_attempt_id,
               arg_max(worker_id, sequence_id) AS worker_id
        FROM attempts WHERE rollout_id IN ({_placeholders(len(ids))}) GROUP BY rollout_id""", ids)}
    summaries = _attempt_summaries(conn, [r["last_attempt_id"] for r in last.values()])
    empty = {"llm_calls": 0, "prompt_tokens": 0, "response_tokens": 0, "total_reward": None, "final_reward": None}
    for row in page:
        att = last.get(row["rollout_id"], {"last_attempt_id": None, "worker_id": None})
        row.update(last_attempt_id=att["last_attempt_id"], worker_id=att["worker_id"])
        row.update(summaries.get(att["last_attempt_id"] or "", empty))
    return {"total": total, "offset": offset, "limit": limit, "rows": page}


def facets(conn: duckdb.DuckDBPyConnection) -> dict[str, list[Any]]:
    """Values for the filter drop-downs (small: GROUP BY over the rollouts table only, capped)."""
    out: dict[str, list[Any]] = {}
    for key, column in (("status", "status"), ("mode", "mode"), ("version", "resources_version")):
        rows = fetch(conn, f"SELECT {column} AS v FROM rollouts WHERE {column} IS NOT NULL GROUP BY 1 ORDER BY 1 "
                           "LIMIT 200")
        out[key] = [r["v"] for r in rows]
    return out


def rollout_detail(conn: duckdb.DuckDBPyConnection, rollout_id: str, attempt_id: str | None = None, *,
                   offset: int = 0, limit: int = 200) -> dict[str, Any]:
    """A rollout, its attempts, one attempt's spans in order (a page of them) and its TITO segments."""
    found = fetch(conn, "SELECT * EXCLUDE (retry_on), list_aggregate(retry_on, 'string_agg', ',') AS retry_on "
                        "FROM rollouts WHERE rollout_id = ?", [rollout_id])
    if not found:
        raise NotFoundError(f"no rollout {rollout_id!r}")
    attempts = fetch(conn, "SELECT attempt_id, sequence_id, worker_id, status, start_time, end_time, "
                           "end_time - start_time AS duration_s FROM attempts WHERE rollout_id = ? "
                           "ORDER BY sequence_id LIMIT 1000", [rollout_id])
    if attempt_id is None and attempts:
        attempt_id = attempts[-1]["attempt_id"]
    elif attempt_id is not None and all(a["attempt_id"] != attempt_id for a in attempts):
        raise NotFoundError(f"rollout {rollout_id!r} has no attempt {attempt_id!r}")
    spans, total, segments = [], 0, []
    if attempt_id is not None:
        total = fetch(conn, "SELECT count(*) AS n FROM spans WHERE attempt_id = ?", [attempt_id])[0]["n"]
        rows = _span_rowids(conn, "attempt_id = ? ORDER BY sequence_id LIMIT ? OFFSET ?", [attempt_id, limit, offset])
        spans = fetch(conn, f"""
            SELECT span_id, sequence_id, name, kind, status, model, finish_reason, start_time,
                   end_time - start_time AS latency_s, len(prompt_token_ids) AS prompt_len,
                   len(response_token_ids) AS response_len, reward_name, reward_value, reward_call_span_id,
                   attributes->>'$.tito.mode' AS tito_mode, attributes->>'$.tito.segment' AS tito_segment,
                   attributes->>'$.agent' AS role, attributes->>'$.policy' AS policy,
                   attributes->>'$.policy_version' AS policy_version,
                   left(coalesce(response_message->>'$.content', CAST(response_message->'$.tool_calls' AS VARCHAR),
                                 CAST(attributes AS VARCHAR)), 200) AS preview
            FROM spans WHERE {rows} ORDER BY sequence_id""")
        if "tito_sessions" in objects(conn):
            segments = fetch(conn, "SELECT agent, segment, segment_start, calls, num_tokens, num_sampled, "
                                   "finish_reason FROM tito_sessions WHERE attempt_id = ? "
                                   "ORDER BY agent NULLS FIRST, segment LIMIT 1000",
                             [attempt_id])
    return {"rollout": found[0], "attempts": attempts, "attempt_id": attempt_id, "spans": spans,
            "spans_total": total, "offset": offset, "limit": limit, "tito_segments": segments}


@dataclass(frozen=True)
class TokenSequence:
    """Token IDs with their loss mask (1 = sampled), segment starts and sampled-token logprobs."""

    title: dict[str, Any]
    ids: list[int]
    mask: list[int]
    segment_starts: list[int]
    logprobs: list[float | None]  # one per token; None on mask-0 tokens


def call_tokens(conn: duckdb.DuckDBPyConnection, span_id: str) -> TokenSequence:
    """One LLM call: its prompt (mask 0, or the recorded TITO mask) then its response (mask 1)."""
    rows = _span_rowids(conn, "span_id = ? AND kind = 'llm_call' LIMIT 1", [span_id])
    tbl = fetch_arrow(conn, f"""
        SELECT span_id, rollout_id, attempt_id, sequence_id, model, finish_reason, attributes->>'$.tito.mode'
               AS tito_mode, prompt_token_ids, response_token_ids, response_logprobs, loss_mask
        FROM spans WHERE {rows}""")
    if tbl.num_rows == 0:
        raise NotFoundError(f"no LLM call span {span_id!r}")
    row = tbl.to_pylist()[0]
    prompt, response = row.pop("prompt_token_ids") or [], row.pop("response_token_ids") or []
    recorded, lps = row.pop("loss_mask"), row.pop("response_logprobs") or []
    mask = list(recorded) if recorded and len(recorded) == len(prompt) + len(response) else \
        [0] * len(prompt) + [1] * len(response)
    logprobs: list[float | None] = [None] * len(prompt) + [*lps, *([None] * (len(response) - len(lps)))]
    return TokenSequence({"kind": "call", **row}, [*prompt, *response], mask, [0], logprobs[: len(mask)])


def session_tokens(conn: duckdb.DuckDBPyConnection, attempt_id: str) -> TokenSequence:
    """A TITO session: its segments (``tito_sessions`` rows) in order, with their boundaries."""
    if "tito_sessions" not in objects(conn):
        raise NotFoundError("this store has no tito_sessions view (written by an older spanlab; open it once "
                            "with a current spanlab to add the views)")
    segs = fetch_arrow(conn, "SELECT rollout_id, segment, segment_start, token_ids, loss_mask, logprobs "
                             "FROM tito_sessions WHERE attempt_id = ? ORDER BY agent NULLS FIRST, segment LIMIT 10000",
                       [attempt_id]).to_pylist()
    if not segs:
        raise NotFoundError(f"attempt {attempt_id!r} has no TITO session")
    ids: list[int] = []
    mask: list[int] = []
    logprobs: list[float | None] = []
    starts: list[int] = []
    for seg in segs:
        starts.append(len(ids))
        seg_mask = list(seg["loss_mask"] or [0] * len(seg["token_ids"]))
        lps = iter(seg["logprobs"] or [])
        ids += seg["token_ids"]
        mask += seg_mask
        logprobs += [next(lps, None) if m else None for m in seg_mask]
    title = {"kind": "session", "attempt_id": attempt_id, "rollout_id": segs[0]["rollout_id"], "segments": len(segs)}
    return TokenSequence(title, ids, mask, starts, logprobs)


def runs(conn: duckdb.DuckDBPyConnection, limit: int = 200) -> list[dict[str, Any]]:
    """Training runs in ``train_metrics``, newest first (empty for stores without the table)."""
    if "train_metrics" not in objects(conn):
        return []
    return fetch(conn, """
        SELECT run_id, any_value(algorithm) AS algorithm, count(DISTINCT step) AS steps, max(step) AS last_step,
               min(time) AS started, max(time) AS updated, list(DISTINCT name ORDER BY name) AS metrics
        FROM train_metrics GROUP BY run_id ORDER BY max(time) DESC LIMIT ?""", [limit])


def run_metrics(conn: duckdb.DuckDBPyConnection, run_id: str, names: list[str],
                max_points: int = 5000) -> dict[str, dict[str, list[Any]]]:
    """Per metric name, ``{"step": [...], "value": [...]}`` of one run, strided to at most ``max_points``."""
    if "train_metrics" not in objects(conn) or not names:
        return {}
    rows = fetch(conn, f"""
        WITH m AS (
            SELECT name, step, value, row_number() OVER (PARTITION BY name ORDER BY step, time) - 1 AS i,
                   count(*) OVER (PARTITION BY name) AS n
            FROM train_metrics WHERE run_id = ? AND name IN ({_placeholders(len(names))})
        )
        SELECT name, list(step ORDER BY step) AS step, list(value ORDER BY step) AS value
        FROM m WHERE i % greatest(1, ceil(n / ?))::BIGINT = 0 OR i = n - 1 GROUP BY name""",
                 [run_id, *names, max_points])
    return {r["name"]: {"step": r["step"], "value": r["value"]} for r in rows}


def run_roles(conn: duckdb.DuckDBPyConnection, run_id: str, limit: int = 2000) -> list[dict[str, Any]]:
    """One run's rows of ``role_summary`` (per step, mode, role and policy: calls, sampled tokens, mean final and
    intermediate reward, the policy versions that answered), in step order. Empty for a run whose rollouts name no
    run (``metadata.run_id``) and for stores without the view (written by an older spanlab).

    The view aggregates the whole store's last attempts before the ``run_id`` filter applies; the UI reads it
    anyway, so the page and ``spanlab sql`` give the same numbers from one definition."""
    if "role_summary" not in objects(conn):
        return []
    columns = {r["c"] for r in fetch(conn, "SELECT column_name AS c FROM duckdb_columns() "
                                           "WHERE table_name = 'role_summary'")}
    # a view written before policy versions were recorded (a read-only open cannot update it): none to show
    versions = "policy_versions" if "policy_versions" in columns else "NULL::VARCHAR[] AS policy_versions"
    return fetch(conn, f"""
        SELECT step, mode, role, policy, {versions}, rollouts, llm_calls, response_tokens, final_reward_mean,
               final_rewards, intermediate_reward_mean, intermediate_rewards
        FROM role_summary WHERE run_id = ?
        ORDER BY step NULLS LAST, mode, role NULLS FIRST, policy NULLS FIRST LIMIT ?""", [run_id, limit])
