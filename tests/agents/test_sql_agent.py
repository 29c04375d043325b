"""SQLAgent end to end: runner Worker -> TITO gateway -> real vLLM, the queries run on the real SQLite databases.

Checks the multi-agent attribution (each role's calls are spans with ``attributes.agent``, the writer
first, one TITO session per role), that the role metrics each rollout records are what its real replies and
their real results say, and that the writer demonstrations render, token for token, to the prompt the live
writer sends.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest

from spanlab.agents.sql import SQLAgent, demonstration, make_tasks
from spanlab.agents.sql.execution import execution_match, extract_sql
from spanlab.agents.sql.prompts import WRITER_PROMPT, verdict_given, verdict_ok, verdict_right
from spanlab.agents.sql.roles import (
    CHECKER_ACCURACY,
    CHECKER_VERDICT,
    DRAFT_RIGHT,
    REWRITER_FIX,
    RIGHT_DRAFT_KEPT,
    WRONG_DRAFT_FIXED,
    role_metrics,
)
from spanlab.gateway import GatewayServer
from spanlab.jobs.rollouts import rollout_metrics
from spanlab.runner import Worker
from spanlab.runner.agent import load_agent
from spanlab.store import SpanStore
from spanlab.types import Rollout, RolloutConfig, Span

logger = logging.getLogger(__name__)


@pytest.fixture
def tito_gateway(store: SpanStore, vllm_server: Any) -> Iterator[GatewayServer]:
    with GatewayServer(store, vllm_server.base_url, tito=True) as gw:
        yield gw


def _prompt_ids(tokenizer: Any, messages: list[dict[str, Any]]) -> list[int]:
    return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True)["input_ids"])


def _run(store: SpanStore, gateway: GatewayServer, agent: SQLAgent, tasks: list[dict[str, Any]]) -> dict[str, Any]:
    """Run ``tasks`` through a Worker; the spans of each task's single attempt, by task_id."""
    store.enqueue([Rollout(input=t, config=RolloutConfig(timeout_s=300, max_attempts=1)) for t in tasks])
    stats = asyncio.run(Worker(store, agent, gateway_url=gateway.url, concurrency=len(tasks)).run())
    assert stats.succeeded == len(tasks) and stats.failed == 0
    assert gateway.flush(10)
    by_task = {}
    for row in store.query("SELECT rollout_id, input FROM rollouts").to_pylist():
        task = json.loads(row["input"]) if isinstance(row["input"], str) else row["input"]
        (attempt,) = store.list_attempts(row["rollout_id"])
        spans = sorted(store.iter_spans(attempt_ids=[attempt.attempt_id]), key=lambda s: s.sequence_id or 0)
        by_task[task["task_id"]] = (task, attempt.attempt_id, spans)
    return by_task


def _last_call_before(spans: list[Span], span: Span) -> Span:
    return [s for s in spans if s.kind == "llm_call" and (s.sequence_id or 0) < (span.sequence_id or 0)][-1]


def _custom(spans: list[Span], name: str) -> list[dict[str, Any]]:
    return [s.attributes for s in spans if s.name == name]


def _replies(spans: list[Span], role: str) -> list[str]:
    return [s.llm.response_message["content"] or "" for s in spans
            if s.kind == "llm_call" and s.attributes.get("agent") == role]


def _check_role_metrics(store: SpanStore, task: dict[str, Any], spans: list[Span]) -> dict[str, float]:
    """The metrics the rollout recorded are the ones its real replies give, each judged by running its SQL here,
    and the ones :func:`role_metrics` reads off its ``sql.*`` spans as the store returns them."""
    def right(sql: str | None) -> bool:
        return execution_match(task["db"], sql, task["gold_sql"])

    (reward,) = [s.reward.value for s in spans if s.reward is not None and s.reward.name == "reward"]
    draft = right(extract_sql(_replies(spans, "writer")[0]))
    checks = [(reply, right(check["sql"])) for reply, check in zip(_replies(spans, "checker"),
                                                                    _custom(spans, "sql.check"), strict=True)]
    rewrites = [right(extract_sql(reply)) for reply in _replies(spans, "rewriter")]
    expected = {DRAFT_RIGHT: float(draft)}
    if checks:
        expected[CHECKER_VERDICT] = sum(verdict_given(r) for r, _ in checks) / len(checks)
        expected[CHECKER_ACCURACY] = sum(verdict_right(r, m) for r, m in checks) / len(checks)
        expected[RIGHT_DRAFT_KEPT if draft else WRONG_DRAFT_FIXED] = reward
    if rewrites:
        expected[REWRITER_FIX] = sum(rewrites) / len(rewrites)
    rollout_id = spans[0].rollout_id
    assert rollout_id is not None
    recorded = rollout_metrics(store, [rollout_id])[rollout_id]
    assert recorded == expected
    assert role_metrics([(s.name, s.attributes) for s in spans if s.name.startswith("sql.")]) == recorded
    for ex in _custom(spans, "sql.exec"):
        assert ex["match"] == right(ex["sql"])
    return recorded


@pytest.mark.vllm
def test_roles_are_recorded_as_separate_agents_with_a_reward(
    store: SpanStore, tito_gateway: GatewayServer, vllm_server: Any, tokenizer: Any
) -> None:
    agent = load_agent("sql", {"model": vllm_server.model, "temperature": 0.0, "max_tokens": 64})
    assert isinstance(agent, SQLAgent)
    tasks = make_tasks("val", 3, seed=0)  # one task per level
    results = _run(store, tito_gateway, agent, tasks)
    assert len(results) == 3

    for task, attempt_id, spans in results.values():
        calls = [s for s in spans if s.kind == "llm_call"]
        roles = [c.attributes.get("agent") for c in calls]
        rewards = {s.reward.name: s for s in spans if s.reward is not None}
        reward = rewards["reward"].reward.value  # the final reward, recorded last
        assert reward in (0.0, 1.0) and spans[-1] is rewards["reward"]
        assert roles[0] == "writer" and roles.count("writer") == 1 and set(roles) <= {"writer", "checker", "rewriter"}
        assert roles.count("checker") == 1 and roles.count("rewriter") <= 1  # rounds=1

        # What the orchestrator did follows from what the model said and what the database answered.
        (check,) = _custom(spans, "sql.check")
        execs = _custom(spans, "sql.exec")
        replies = [c.llm.response_message["content"] for c in calls]
        assert execs[0]["author"] == "writer" and execs[0]["sql"] == extract_sql(replies[0])
        assert check["ok"] == verdict_ok(replies[1])
        rewrote = not (execs[0]["ok"] and check["ok"])
        assert ("rewriter" in roles) == rewrote
        (final,) = _custom(spans, "sql.final")
        # a rewrite without SQL, or one that fails where the draft ran, never wins
        kept_draft = len(execs) == 1 or execs[1]["sql"] is None or (execs[0]["ok"] and not execs[1]["ok"])
        assert final["sql"] == execs[0 if kept_draft else 1]["sql"]
        assert final["match"] == bool(reward) == execution_match(task["db"], final["sql"], task["gold_sql"])

        # The intermediate rewards judge the call right before them: the verdict against the draft's real
        # outcome, the rewrite by whether it fixed a query that did not match.
        draft_matches = execution_match(task["db"], execs[0]["sql"], task["gold_sql"])
        verdict = rewards["sql.verdict"]
        assert verdict.reward.value == float(verdict_right(replies[1], draft_matches))
        assert _last_call_before(spans, verdict).attributes["agent"] == "checker"
        assert ("sql.fix" in rewards) == rewrote
        if rewrote:
            fix = rewards["sql.fix"]
            rewrite = execs[1]["sql"]  # None when the rewriter's reply had no SQL: still recorded
            fixed = rewrite is not None and execution_match(task["db"], rewrite, task["gold_sql"])
            assert fix.reward.value == float(fixed and not draft_matches)
            assert _last_call_before(spans, fix).attributes["agent"] == "rewriter"

        # The writer's request is exactly the demonstration's prompt: messages and token IDs.
        demo = demonstration(task)
        writer = calls[0].llm
        assert writer.request_messages == demo["messages"][:2]
        assert list(writer.prompt_token_ids) == _prompt_ids(tokenizer, demo["messages"][:2])
        _check_role_metrics(store, task, spans)
        assert demo["messages"][0]["content"] == WRITER_PROMPT

        # One TITO token buffer per role.
        sessions = store.query(
            f"SELECT agent, token_ids FROM tito_sessions WHERE attempt_id = '{attempt_id}' ORDER BY agent"
        ).to_pylist()
        assert sorted(s["agent"] for s in sessions) == sorted(set(roles))
        (writer_session,) = [s for s in sessions if s["agent"] == "writer"]
        assert writer_session["token_ids"] == list(writer.prompt_token_ids) + list(writer.response_token_ids)


@pytest.mark.vllm
def test_role_metrics_over_sampled_rollouts_of_two_rounds(
    store: SpanStore, tito_gateway: GatewayServer, vllm_server: Any
) -> None:
    """Sampled replies and two rounds take the rollouts down more paths (verdicts or not, rewrites, a second
    check); every rollout's metrics are still what its replies give."""
    agent = SQLAgent(vllm_server.model, temperature=1.0, max_tokens=48, rounds=2)
    results = _run(store, tito_gateway, agent, make_tasks("val", 6, seed=1))
    seen = [_check_role_metrics(store, task, spans) for task, _, spans in results.values()]
    logger.info("role metrics of the sampled rollouts: %s", seen)  # which paths this run took (-o log_cli=true)
    assert all(CHECKER_VERDICT in m for m in seen)  # the checker judges every draft


@pytest.mark.vllm
def test_writer_alone(store: SpanStore, tito_gateway: GatewayServer, vllm_server: Any) -> None:
    agent = SQLAgent(vllm_server.model, temperature=0.0, max_tokens=48, roles=["writer"], rounds=2)
    ((task, _, spans),) = _run(store, tito_gateway, agent, make_tasks("test", 1, levels=[1])).values()
    assert [s.attributes.get("agent") for s in spans if s.kind == "llm_call"] == ["writer"]
    assert len(_custom(spans, "sql.exec")) == 1 and not _custom(spans, "sql.check")
    (reward,) = [s.reward.value for s in spans if s.reward is not None]
    assert reward == float(_custom(spans, "sql.final")[0]["match"])
    assert _check_role_metrics(store, task, spans).keys() == {DRAFT_RIGHT}  # no checker, no rewriter: no rates


def test_demonstration_is_the_writer_turn_with_the_gold_query(tokenizer: Any) -> None:
    for task in make_tasks("train", 6, seed=2):
        demo = demonstration(task)
        assert demo["tools"] is None and json.loads(json.dumps(demo)) == demo
        assert [m["role"] for m in demo["messages"]] == ["system", "user", "assistant"]
        answer = demo["messages"][-1]["content"]
        assert answer == f"```sql\n{task['gold_sql']}\n```" and extract_sql(answer) == task["gold_sql"]
        assert execution_match(task["db"], extract_sql(answer), task["gold_sql"])
        assert task["question"] in demo["messages"][1]["content"] and "CREATE TABLE" in demo["messages"][1]["content"]
        full = list(tokenizer.apply_chat_template(demo["messages"])["input_ids"])
        prompt = _prompt_ids(tokenizer, demo["messages"][:2])
        assert full[: len(prompt)] == prompt and len(prompt) < 400, "a short prompt for a 2048-token model"


def test_roles_are_validated() -> None:
    for roles in (["checker"], ["writer", "judge"], []):
        with pytest.raises(ValueError, match="roles must include"):
            SQLAgent("m", roles=roles)
    with pytest.raises(ValueError, match="rounds"):
        SQLAgent("m", rounds=-1)


@pytest.mark.parametrize(("verdict", "draft_matches", "right"), [
    ("OK", True, True), ("**OK** it answers", True, True), ("OK", False, False),
    ("WRONG: misses the filter", False, True), ("incorrect, the join is wrong", False, True),
    ("WRONG: x", True, False), ("The query selects names.", False, False), ("", True, False), (None, False, False),
])
def test_a_verdict_is_right_only_when_it_is_a_verdict_that_matches_the_draft(
        verdict: str | None, draft_matches: bool, right: bool) -> None:
    assert verdict_right(verdict, draft_matches) is right
