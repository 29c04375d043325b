"""CalcAgent end to end: runner Worker -> gateway -> real vLLM, calculator over real MCP stdio, real DuckDB.

The base model rarely calls the tool by itself, so the tool path is exercised two more ways: forcing
the first turn (``tool_choice="required"`` with a strict schema, so vLLM guides the JSON) and
continuing a demo-shaped history in which the calculator was already called. Both also check that
the demonstrations in ``demos.py`` render, token for token, to the prompts the SDK really sends.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import pytest

from spanlab.agents.calc.agent import CalcAgent, history_items, score
from spanlab.agents.calc.demos import calculator_tools, conversation, demonstration
from spanlab.agents.calc.mcp_server import evaluate
from spanlab.agents.calc.operations import EXTRA_OPS_METRIC, call_expression, count_operations, extra_operations
from spanlab.agents.calc.tasks import make_tasks
from spanlab.gateway import GatewayServer
from spanlab.runner import Worker
from spanlab.runner.agent import load_agent
from spanlab.store import SpanStore
from spanlab.types import Attempt, Rollout, RolloutConfig, Span


def _render(tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[int]:
    return list(tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True)["input_ids"])


def _spans(store: SpanStore, attempt_id: str) -> list[Span]:
    return sorted(store.iter_spans(attempt_ids=[attempt_id]), key=lambda s: s.sequence_id or 0)


def _metrics(spans: list[Span]) -> list[float]:
    """The ``calc.extra_ops`` values the agent recorded (it records one per rollout at most)."""
    return [s.attributes["metric"] for s in spans if s.kind == "custom" and s.name == EXTRA_OPS_METRIC]


def _evaluates(expression: str) -> bool:
    try:
        evaluate(expression)
    except ValueError:
        return False
    return True


def _server_pids() -> set[int]:
    """Live calculator server processes started by this test process."""
    pids = set()
    for proc in Path("/proc").iterdir():
        try:
            cmd = (proc / "cmdline").read_bytes()
            ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ppid == os.getpid() and b"spanlab.agents.calc.mcp_server" in cmd:
            pids.add(int(proc.name))
    return pids


def _run_worker(store: SpanStore, gateway: GatewayServer, agent: CalcAgent, tasks: list[dict[str, Any]]) -> Any:
    store.enqueue([Rollout(input=t, config=RolloutConfig(timeout_s=240, max_attempts=1)) for t in tasks])

    async def main() -> Any:
        try:
            return await Worker(store, agent, gateway_url=gateway.url, concurrency=len(tasks)).run()
        finally:
            await agent.aclose()

    stats = asyncio.run(main())
    assert gateway.flush(10)
    return stats


@pytest.mark.vllm
def test_rollouts_through_worker_are_recorded_with_token_ids_and_reward(
    store: SpanStore, gateway: GatewayServer, vllm_server: Any, tokenizer: Any
) -> None:
    agent = load_agent("calc", {"model": vllm_server.model, "temperature": 1.0, "max_tokens": 48})
    assert isinstance(agent, CalcAgent)
    tasks = make_tasks("test", 3, seed=0)[::2]  # a level-1 and a level-3 task
    stats = _run_worker(store, gateway, agent, tasks)
    assert stats.succeeded == 2 and stats.failed == 0

    for row in store.query("SELECT rollout_id, input FROM rollouts").to_pylist():
        task = json.loads(row["input"]) if isinstance(row["input"], str) else row["input"]
        (attempt,) = store.list_attempts(row["rollout_id"])
        spans = _spans(store, attempt.attempt_id)
        calls = [s for s in spans if s.kind == "llm_call"]
        (reward,) = [s.reward.value for s in spans if s.reward is not None]
        assert 1 <= len(calls) <= 3 and reward in (0.0, 1.0)
        assert all(len(c.llm.prompt_token_ids) > 100 and len(c.llm.response_token_ids) > 0 for c in calls)
        if not any(s.name == "no_final_answer" for s in spans):
            assert reward == score(calls[-1].llm.response_message.get("content"), task)
        # The agent's calc.extra_ops agrees with the calculator calls the gateway recorded.
        recorded = [call_expression(tc["function"]["arguments"]) for c in calls
                    for tc in (c.llm.response_message or {}).get("tool_calls") or []]
        expected = extra_operations([e for e in recorded if e is not None], task)
        assert _metrics(spans) == ([] if expected is None else [expected])

        # The first request is exactly the demonstration's prompt: messages, tools and token IDs.
        demo = demonstration(task)
        first = calls[0].llm
        assert first.request_messages == demo["messages"][:2]
        assert first.request_tools == demo["tools"] == calculator_tools()
        assert list(first.prompt_token_ids) == _render(tokenizer, demo["messages"][:2], demo["tools"])


@pytest.mark.vllm
def test_forced_calculator_call_is_a_real_mcp_round_trip(
    store: SpanStore, gateway: GatewayServer, vllm_server: Any, tokenizer: Any
) -> None:
    agent = CalcAgent(vllm_server.model, temperature=0.0, max_tokens=48, tool_choice="required", strict_tools=True)
    task = {"task_id": "t", "question": "What is 47 + 38?", "answer": 85, "level": 1, "split": "test",
            "expression": "47 + 38"}
    assert _run_worker(store, gateway, agent, [task]).succeeded == 1
    (row,) = store.query("SELECT rollout_id FROM rollouts").to_pylist()
    (attempt,) = store.list_attempts(row["rollout_id"])
    spans = _spans(store, attempt.attempt_id)
    calls = [s.llm for s in spans if s.kind == "llm_call"]
    (reward,) = [s.reward.value for s in spans if s.reward is not None]

    assert calls[0].finish_reason == "tool_calls" and len(calls) >= 2
    (tool_call,) = calls[0].response_message["tool_calls"]
    expression = json.loads(tool_call["function"]["arguments"])["expression"]
    result = evaluate(expression)  # the model's expression is valid arithmetic (guided JSON, greedy)

    # The second request replays the call and the MCP server's real result, in the demos' exact shapes.
    expected = conversation(task["question"], expression, task["answer"], call_id=tool_call["id"])[:4]
    assert calls[1].request_messages == expected
    assert calls[1].request_messages[3]["content"] == [{"type": "text", "text": result}]
    assert list(calls[1].prompt_token_ids) == _render(tokenizer, expected, calculator_tools(strict=True))
    assert reward == score(calls[-1].response_message.get("content"), task)
    # The forced call is a measured one: calc.extra_ops says whether it used more than the one operation needed
    # (when the model called again, the last call's expression is the answer's).
    expressions = [json.loads(tc["function"]["arguments"])["expression"] for c in calls
                   for tc in (c.response_message or {}).get("tool_calls") or []]
    answered = [e for e in expressions if _evaluates(e)]  # the first one does (checked above)
    assert _metrics(spans) == [float((count_operations(answered[-1]) or 0) > 1)]


@pytest.mark.vllm
def test_demo_shaped_history_continues_to_an_answer(
    store: SpanStore, gateway: GatewayServer, started: tuple[Rollout, Attempt], vllm_server: Any, tokenizer: Any
) -> None:
    """A conversation in which the calculator was already called reaches the model exactly as in the demos."""
    rollout, attempt = started
    task = make_tasks("test", 1, seed=0, levels=[2])[0]
    agent = CalcAgent(vllm_server.model, temperature=0.0, max_tokens=24)
    items = history_items(task["question"], task["expression"], str(task["answer"]))

    async def main() -> str | None:
        try:
            return await agent.solve(items, gateway.base_url(rollout.rollout_id, attempt.attempt_id))
        finally:
            await agent.aclose()

    output = asyncio.run(main())
    assert gateway.flush(10)
    (call,) = [s.llm for s in _spans(store, attempt.attempt_id) if s.kind == "llm_call"]
    demo = demonstration(task)
    assert call.request_messages == demo["messages"][:4]
    assert list(call.prompt_token_ids) == _render(tokenizer, demo["messages"][:4], demo["tools"])
    assert call.response_message["content"] == output and call.finish_reason in ("stop", "length")


def test_one_calculator_process_per_event_loop_closed_cleanly() -> None:
    """Concurrent rollouts share one server; aclose stops it; a loop that ends without aclose stops it too."""
    agent = CalcAgent("unused")
    before = _server_pids()

    async def share_then_close() -> None:
        servers = await asyncio.gather(*(agent._process().ready() for _ in range(4)))
        assert len({id(s) for s in servers}) == 1
        results = await asyncio.gather(
            *(servers[0].call_tool("calculator", {"expression": f"{i} * 7"}) for i in range(5))
        )
        assert [r.content[0].text for r in results] == [str(i * 7) for i in range(5)]
        assert len(_server_pids() - before) == 1
        await agent.aclose()
        assert _server_pids() == before

    async def leave_open() -> int:
        await agent._process().ready()
        return len(_server_pids() - before)

    asyncio.run(share_then_close())
    assert asyncio.run(leave_open()) == 1, "a new event loop gets its own server"
    assert _server_pids() == before, "asyncio.run's shutdown stopped the server it left running"


@pytest.mark.vllm
def test_a_prompt_resource_replaces_the_system_prompt(
    store: SpanStore, gateway: GatewayServer, vllm_server: Any
) -> None:
    """APO's prompt versions reach the agent: the POML resource's system part instructs, its question asks."""
    from spanlab.agents.calc.agent import default_template

    template = default_template().replace("<p>", "<p>Always show your work.</p>\n<p>", 1)
    store.add_resource("prompt", {"template": template}, kind="prompt_template")
    agent = CalcAgent(vllm_server.model, temperature=0.0, max_tokens=8, max_turns=1)
    task = {"task_id": "t", "question": "What is 47 + 38?", "answer": 85, "level": 1, "split": "test"}
    _run_worker(store, gateway, agent, [task])
    (row,) = store.query("SELECT rollout_id FROM rollouts").to_pylist()
    (attempt,) = store.list_attempts(row["rollout_id"])
    first = next(s.llm for s in _spans(store, attempt.attempt_id) if s.kind == "llm_call")
    assert first.request_messages[:2] == [
        {"role": "system", "content": "Always show your work.\n\n" + conversation("q", "1", 1)[0]["content"]},
        {"role": "user", "content": task["question"]},
    ]
