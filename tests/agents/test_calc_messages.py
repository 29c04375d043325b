"""CalcAgent(api="messages"): the anthropic SDK's loop against the gateway's ``/v1/messages``, the calculator over
real MCP stdio, real vLLM, real DuckDB.

The conversation must reach the engine as the chat agent's does, token for token, so that the warm start's
demonstrations (written in the chat agent's exact request shapes) teach this agent too: the first prompt, and,
after a forced calculator call (``tool_choice="required"`` with a strict schema: vLLM guides the JSON), the second
prompt with the MCP server's real result, both equal the demonstrations' render.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from spanlab.agents.calc.agent import CalcAgent, score
from spanlab.agents.calc.demos import calculator_tools, conversation, demonstration
from spanlab.agents.calc.mcp_server import evaluate
from spanlab.gateway import GatewayServer
from spanlab.store import SpanStore
from tests.agents.test_calc_agent import _render, _run_worker, _spans

pytestmark = pytest.mark.vllm
TASK = {"task_id": "t", "question": "What is 47 + 38?", "answer": 85, "level": 1, "split": "test",
        "expression": "47 + 38"}


def _calls(store: SpanStore) -> list[Any]:
    (row,) = store.query("SELECT rollout_id FROM rollouts").to_pylist()
    (attempt,) = store.list_attempts(row["rollout_id"])
    spans = [s for s in _spans(store, attempt.attempt_id) if s.kind == "llm_call"]
    assert {s.name for s in spans} == {"messages"} and all(s.status == "ok" for s in spans)
    assert {s.attributes["endpoint"] for s in spans} == {"/v1/messages"}
    return spans


def test_the_first_prompt_is_the_chat_agents(
    store: SpanStore, gateway: GatewayServer, vllm_server: Any, tokenizer: Any
) -> None:
    agent = CalcAgent(vllm_server.model, temperature=0.0, max_tokens=8, max_turns=1, api="messages")
    assert _run_worker(store, gateway, agent, [TASK]).succeeded == 1
    first = _calls(store)[0].llm
    demo = demonstration(TASK)
    assert first.request_messages == demo["messages"][:2]
    assert first.request_tools == calculator_tools()  # the MCP tool, declared as the Agents SDK declares it
    assert list(first.prompt_token_ids) == _render(tokenizer, demo["messages"][:2], demo["tools"])


def test_a_forced_calculator_call_is_a_real_mcp_round_trip(
    store: SpanStore, gateway: GatewayServer, vllm_server: Any, tokenizer: Any
) -> None:
    agent = CalcAgent(vllm_server.model, temperature=0.0, max_tokens=48, tool_choice="required", strict_tools=True,
                      api="messages")
    assert _run_worker(store, gateway, agent, [TASK]).succeeded == 1
    spans = _calls(store)
    calls = [s.llm for s in spans]
    (reward,) = [s.reward.value for s in store.iter_spans() if s.reward is not None]
    assert calls[0].finish_reason == "tool_calls" and len(calls) >= 2
    (tool_call,) = calls[0].response_message["tool_calls"]
    expression = json.loads(tool_call["function"]["arguments"])["expression"]
    result = evaluate(expression)
    # The tool_use echo and the MCP result (a tool_result block) reach the engine as the demos' conversation.
    expected = conversation(TASK["question"], expression, TASK["answer"], call_id=tool_call["id"])[:4]
    assert calls[1].request_messages[3] == {"role": "tool", "tool_call_id": tool_call["id"], "content": result}
    assert list(calls[1].prompt_token_ids) == _render(tokenizer, expected, calculator_tools(strict=True))
    assert reward == score(calls[-1].response_message.get("content"), TASK)
