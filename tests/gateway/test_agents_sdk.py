"""An OpenAI Agents SDK agent runs a tool loop through the gateway; the store holds every call, in order.

The small default model (SmolLM2-135M) almost never emits a tool call on its own (REFERENCE.md §8:
0 of 200 first turns). So the first turn is forced with ``ModelSettings(tool_choice="required")``;
vLLM (hermes parser) then constrains the output to a tool call. After the tool ran, the SDK resets
``tool_choice`` (``Agent.reset_tool_choice``, on by default) and the model answers in text, which
ends the run. That makes the loop deterministic enough: temperature 0, two model calls expected.
If the model ever chose to call the tool again, the run would just have more calls; the assertions
compare the store against what the SDK itself saw, call by call, not against a fixed count.

Needs the engine started with ``--enable-auto-tool-choice --tool-call-parser hermes`` (the engine's
default): without a parser vLLM rejects any request that carries ``tool_choice``.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    Runner,
    RunResult,
    RunResultStreaming,
    function_tool,
    set_tracing_disabled,
)
from openai import AsyncOpenAI

from spanlab.gateway import GatewayServer
from spanlab.store import SpanStore
from spanlab.types import Attempt, Rollout, Span
from tests.gateway.helpers import Upstream, detokenize

pytestmark = pytest.mark.vllm

CALLS: list[tuple[int, int]] = []


@function_tool
def add(a: int, b: int) -> int:
    """Add two integers and return the sum."""
    CALLS.append((a, b))
    return a + b


def _agent(client: AsyncOpenAI, model: str) -> Agent:
    set_tracing_disabled(True)
    return Agent(
        name="calculator",
        instructions="You are a calculator. Use the add tool, then state the result.",
        tools=[add],
        model=OpenAIChatCompletionsModel(model=model, openai_client=client),
        model_settings=ModelSettings(tool_choice="required", temperature=0.0, max_tokens=48),
    )


def _check(store: SpanStore, attempt: Attempt, result: RunResult | RunResultStreaming, upstream: Upstream) -> None:
    spans: list[Span] = list(store.iter_spans(attempt_ids=[attempt.attempt_id]))
    assert len(spans) == len(result.raw_responses) >= 2, "one span per model call the SDK made"
    assert [s.sequence_id for s in spans] == list(range(len(spans)))
    assert all(s.status == "ok" and s.llm.prompt_token_ids and s.llm.response_token_ids for s in spans)

    first, last = spans[0], spans[-1]
    (tool_call,) = first.llm.response_message["tool_calls"]
    assert first.llm.finish_reason == "tool_calls" and tool_call["function"]["name"] == "add"
    args = json.loads(tool_call["function"]["arguments"])
    assert CALLS[-1] == (args["a"], args["b"]), "the recorded call is the one the tool received"
    sdk_call = result.raw_responses[0].output[0]
    assert (sdk_call.name, json.loads(sdk_call.arguments)) == ("add", args)

    # The second request carries the tool call and its result; each prompt extends the conversation.
    tool_msgs = [m for m in spans[1].llm.request_messages if m.get("role") == "tool"]
    assert tool_msgs and str(args["a"] + args["b"]) in str(tool_msgs[0]["content"])
    assert len(spans[1].llm.prompt_token_ids) > len(first.llm.prompt_token_ids)
    assert first.llm.request_tools[0]["function"]["name"] == "add"

    # The final answer the agent returned is exactly the decoded sampled IDs (minus the stop token).
    ids = last.llm.response_token_ids
    text_ids = ids[:-1] if last.llm.finish_reason == "stop" else ids
    assert detokenize(upstream, text_ids) == last.llm.response_message["content"] == result.final_output


def _client(gw: GatewayServer, started: tuple[Rollout, Attempt]) -> AsyncOpenAI:
    rollout, attempt = started
    return AsyncOpenAI(base_url=gw.base_url(rollout.rollout_id, attempt.attempt_id), api_key="unused", max_retries=0)


def test_agent_tool_loop_is_recorded_call_by_call(
    store: SpanStore, gateway: GatewayServer, started: tuple[Rollout, Attempt], upstream: Upstream
) -> None:
    async def run() -> RunResult:
        async with _client(gateway, started) as client:
            return await Runner.run(_agent(client, upstream.model), "What is 12 + 30?", max_turns=4)

    result = asyncio.run(run())
    assert gateway.flush(10)
    _check(store, started[1], result, upstream)


def test_streamed_agent_tool_loop_is_recorded_call_by_call(
    store: SpanStore, gateway: GatewayServer, started: tuple[Rollout, Attempt], upstream: Upstream
) -> None:
    async def run() -> RunResultStreaming:
        async with _client(gateway, started) as client:
            result = Runner.run_streamed(_agent(client, upstream.model), "What is 7 + 5?", max_turns=4)
            async for _ in result.stream_events():
                pass
            return result

    result = asyncio.run(run())
    assert gateway.flush(10)
    spans = list(store.iter_spans(attempt_ids=[started[1].attempt_id]))
    assert all(s.attributes["stream"] is True for s in spans)
    _check(store, started[1], result, upstream)
