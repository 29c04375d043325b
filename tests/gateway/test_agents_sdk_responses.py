"""The Agents SDK's default model class (``OpenAIResponsesModel``, ``/v1/responses``) recorded like chat.

The same tool loop as tests/gateway/test_agents_sdk.py (forced first call, then a text answer; see its
docstring for why that is deterministic enough), with the SDK speaking the Responses API to the gateway.
The gateway serves it over its chat path, so the store must hold what the chat test's store holds: one
``llm_call`` span per model call with the exact prompt and sampled IDs, tool calls in chat form, each
prompt extending the last, and the answer the agent returned equal to the decoded sampled IDs. Streamed
and not. A plain Responses call records exactly the IDs vLLM's chat route returns for the same greedy request
(and returns them to an agent that asks with ``return_token_ids``), and a two-turn conversation through a
TITO gateway continues the first call's token buffer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import pytest
from agents import (
    Agent,
    ModelSettings,
    OpenAIResponsesModel,
    Runner,
    RunResult,
    RunResultStreaming,
    set_tracing_disabled,
)
from openai import AsyncOpenAI, OpenAI

from spanlab.gateway import GatewayServer
from spanlab.store import SpanStore
from spanlab.types import Attempt, Rollout
from tests.gateway.helpers import Upstream, direct, root_url
from tests.gateway.test_agents_sdk import _check, add

pytestmark = pytest.mark.vllm


def _newline_id(upstream: Upstream) -> int:
    resp = httpx.post(root_url(upstream) + "/tokenize", json={"model": upstream.model, "prompt": "\n",
                                                              "add_special_tokens": False}, timeout=30)
    (token,) = resp.json()["tokens"]
    return token


def _agent(client: AsyncOpenAI, upstream: Upstream) -> Agent:
    """The chat test's agent on the Responses model class. The answer after the tool ends at its first line
    (``stop_token_ids``): this model rambles past 48 tokens, and a cut response is ``incomplete``, which the
    SDK raises on (the chat SDK accepts a cut answer)."""
    set_tracing_disabled(True)
    return Agent(
        name="calculator",
        instructions="You are a calculator. Use the add tool, then state the result.",
        tools=[add],
        model=OpenAIResponsesModel(model=upstream.model, openai_client=client),
        model_settings=ModelSettings(tool_choice="required", temperature=0.0, max_tokens=48,
                                     extra_body={"stop_token_ids": [_newline_id(upstream)]}),
    )


def _client(gw: GatewayServer, started: tuple[Rollout, Attempt]) -> AsyncOpenAI:
    rollout, attempt = started
    return AsyncOpenAI(base_url=gw.base_url(rollout.rollout_id, attempt.attempt_id), api_key="unused", max_retries=0)


def _check_responses(store: SpanStore, attempt: Attempt, result: RunResult | RunResultStreaming, stream: bool) -> None:
    spans = list(store.iter_spans(attempt_ids=[attempt.attempt_id]))
    assert {s.name for s in spans} == {"responses"}
    assert all(s.attributes["endpoint"] == "/v1/responses" and s.attributes["stream"] is stream for s in spans)
    assert [s.attributes["responses"]["response_id"] for s in spans] == [r.response_id for r in result.raw_responses]
    for span, raw in zip(spans, result.raw_responses, strict=True):
        assert raw.usage.output_tokens == len(span.llm.response_token_ids)
        assert raw.usage.input_tokens == len(span.llm.prompt_token_ids)


def test_responses_agent_tool_loop_is_recorded_call_by_call(
    store: SpanStore, gateway: GatewayServer, started: tuple[Rollout, Attempt], upstream: Upstream
) -> None:
    async def run() -> RunResult:
        async with _client(gateway, started) as client:
            return await Runner.run(_agent(client, upstream), "What is 12 + 30?", max_turns=4)

    result = asyncio.run(run())
    assert gateway.flush(10)
    _check(store, started[1], result, upstream)
    _check_responses(store, started[1], result, stream=False)


def test_streamed_responses_agent_tool_loop_is_recorded_call_by_call(
    store: SpanStore, gateway: GatewayServer, started: tuple[Rollout, Attempt], upstream: Upstream
) -> None:
    async def run() -> RunResultStreaming:
        async with _client(gateway, started) as client:
            result = Runner.run_streamed(_agent(client, upstream), "What is 7 + 5?", max_turns=4)
            raw = [e.data.type async for e in result.stream_events() if e.type == "raw_response_event"]
            # Deltas as the engine streamed them (the tool call's arguments, then the answer's text).
            assert {"response.function_call_arguments.delta", "response.output_text.delta"} <= set(raw)
            assert raw.count("response.completed") == len(result.raw_responses)
            return result

    result = asyncio.run(run())
    assert gateway.flush(10)
    _check(store, started[1], result, upstream)
    _check_responses(store, started[1], result, stream=True)


@pytest.fixture
def tito_gateway(store: SpanStore, upstream: Upstream) -> Iterator[GatewayServer]:
    with GatewayServer(store, upstream.base_url, tito=True) as gw:
        yield gw


def test_a_responses_conversation_continues_its_tito_buffer(
    store: SpanStore, tito_gateway: GatewayServer, started: tuple[Rollout, Attempt], upstream: Upstream
) -> None:
    set_tracing_disabled(True)

    async def run() -> tuple[RunResult, RunResult]:
        async with _client(tito_gateway, started) as client:
            agent = Agent(name="chat", instructions="Answer in one short sentence.",
                          model=OpenAIResponsesModel(model=upstream.model, openai_client=client),
                          model_settings=ModelSettings(temperature=0.0, max_tokens=32,
                                                       extra_body={"stop_token_ids": [_newline_id(upstream)]}))
            first = await Runner.run(agent, "Name a colour.")
            second = await Runner.run(agent, [*first.to_input_list(), {"role": "user", "content": "Another one?"}])
            return first, second

    _, second = asyncio.run(run())
    assert tito_gateway.flush(10)
    s1, s2 = store.iter_spans(attempt_ids=[started[1].attempt_id])
    assert (s1.attributes["tito"]["event"], s2.attributes["tito"]["event"]) == ("start", "extend")
    # The second prompt is the first prompt + exactly the sampled IDs + the new turn's delta.
    sampled = s1.llm.prompt_token_ids + s1.llm.response_token_ids
    assert s2.llm.prompt_token_ids[: len(sampled)] == sampled
    assert s2.llm.response_message["content"] == second.final_output


def test_a_plain_responses_call_records_the_ids_vllm_samples_for_the_same_chat_request(
    store: SpanStore, gateway: GatewayServer, started: tuple[Rollout, Attempt], upstream: Upstream
) -> None:
    client = OpenAI(base_url=gateway.base_url(started[0].rollout_id, started[1].attempt_id),
                    api_key="unused", max_retries=0)
    reply = client.responses.create(model=upstream.model, instructions="Be brief.", input="Name a fruit.",
                                    temperature=0.0, max_output_tokens=8, extra_body={"return_token_ids": True})
    assert gateway.flush(10)
    (span,) = store.iter_spans(attempt_ids=[started[1].attempt_id])
    truth = direct(upstream, "/v1/chat/completions", {
        "model": upstream.model, "temperature": 0.0, "max_tokens": 8,
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a fruit."}]})
    assert span.llm.prompt_token_ids == truth["prompt_token_ids"] == reply.model_extra["prompt_token_ids"]
    assert span.llm.response_token_ids == truth["choices"][0]["token_ids"] == reply.model_extra["output_token_ids"]
    assert reply.output_text == truth["choices"][0]["message"]["content"] == span.llm.response_message["content"]
