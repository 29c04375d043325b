"""A tiny random model built in the test, served by real vLLM, driven by an OpenAI Agents SDK tool loop.

What it proves (the issue's acceptance test): with a model that is *not* the default one (a random
2-layer Llama with head_dim 64, written to a temp folder here), an Agents SDK agent with a function
tool, pointed at the gateway, runs a multi-turn tool loop; afterwards the store holds every call, in
call order, with token IDs identical to what vLLM returns for the same request, and decoding
``response_token_ids`` reproduces the text the agent saw.

Making a random model behave (each choice is part of the request the agent sends, so the gateway
records it and the ground-truth replay sends it again; nothing is mocked):

* ``tool_choice="required"`` makes vLLM constrain the first turn to a Hermes tool call
  (``<tool_call>{"name": "add", "arguments": {...}}</tool_call>``, an xgrammar structural tag);
* that grammar allows any JSON whitespace, and greedy decoding of random weights picks a long run of
  spaces after ``{`` until max_tokens (seen with max_tokens 48 and 128). A ``logit_bias`` of -100 on every
  whitespace-only token steers it to ``"a"`` instead;
* unbounded integers run to max_tokens the same way (``"a":3333...``), so the tool takes digits
  (``ge=0, le=9``: the schema's bounds are part of the grammar);
* ``parallel_tool_calls=False`` makes the grammar allow exactly one call, after which the model must
  stop (it emits ``<|im_end|>``; vLLM reports ``finish_reason="tool_calls"``, the ID is kept);
* after the tool ran, the SDK resets ``tool_choice`` (``Agent.reset_tool_choice``) and the model
  writes unconstrained random text until ``max_tokens``; a text answer ends the run.

Ground truth: each recorded request is sent again straight to vLLM with ``return_token_ids``
(temperature 0, so both runs sample the same tokens). As a precaution the tiny server runs without
prefix caching, so the replay computes exactly as the original did: a random model's logits are flat,
and the slightly different arithmetic of a cache hit could flip a near-tie.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

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
from pydantic import Field

from spanlab.engine.config import EngineConfig
from spanlab.engine.server import VLLMServer
from spanlab.gateway import GatewayServer
from spanlab.store import SpanStore
from spanlab.types import Span
from tests.gateway.helpers import direct

pytestmark = pytest.mark.vllm

SERVED_NAME = "tiny-llama-hd64"
CALLS: list[tuple[int, int]] = []
Digit = Annotated[int, Field(ge=0, le=9)]


@function_tool
def add(a: Digit, b: Digit) -> int:
    """Add two digits and return the sum."""
    CALLS.append((a, b))
    return a + b


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def tiny_server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMServer]:
    """The session's tiny model (tests/engine_fixtures.py) served for this module."""
    pytest.importorskip("vllm", reason="vLLM is not installed")
    config = EngineConfig(
        model=str(tiny_model_dir),
        served_model_name=SERVED_NAME,
        max_model_len=1024,
        kv_cache_gib=1,
        log_path=tmp_path_factory.mktemp("tiny-vllm-log") / "vllm.log",
        extra_args=("--no-enable-prefix-caching",),  # see the module docstring: exact replays
    )
    server = VLLMServer(config)
    server.start()
    try:
        yield server
    finally:
        server.stop()
        assert server.pids() == [], "the tiny vLLM server left processes behind"


def _no_whitespace_bias(tokenizer: Any) -> dict[str, int]:
    """logit_bias -100 for every token that decodes to whitespace only (166 of SmolLM2's 49,152)."""
    return {str(i): -100 for i in range(len(tokenizer)) if (s := tokenizer.decode([i])) and not s.strip()}


def _agent(client: AsyncOpenAI, tokenizer: Any) -> Agent:
    set_tracing_disabled(True)
    return Agent(
        name="calculator",
        instructions="You are a calculator. Use the add tool, then state the result.",
        tools=[add],
        model=OpenAIChatCompletionsModel(model=SERVED_NAME, openai_client=client),
        model_settings=ModelSettings(
            tool_choice="required",
            parallel_tool_calls=False,
            temperature=0.0,
            max_tokens=48,  # the forced call takes ~37 tokens (the model spells the tags in pieces)
            extra_body={"logit_bias": _no_whitespace_bias(tokenizer)},
        ),
    )


def _replay(server: VLLMServer, span: Span) -> dict[str, Any]:
    """The recorded request, sent again straight to vLLM (asking for token IDs and logprobs).

    Streamed calls are replayed unstreamed: the sampled tokens do not depend on how they are delivered.
    """
    params = {k: v for k, v in span.attributes["request_params"].items() if k not in ("stream", "stream_options")}
    body = {**params, "messages": span.llm.request_messages}
    if span.llm.request_tools is not None:
        body["tools"] = span.llm.request_tools
    return direct(server, "/v1/chat/completions", body)


def _sampled_text(tokenizer: Any, span: Span) -> str:
    """Decode the sampled IDs; the last one is the stop token unless the call ran out of max_tokens.

    With tools in the request vLLM's hermes parser turns ``skip_special_tokens`` off, so special
    tokens the random model samples are part of the text the agent gets: decode them too.
    """
    ids = list(span.llm.response_token_ids)
    if span.llm.finish_reason in ("stop", "tool_calls"):
        assert ids[-1] == tokenizer.eos_token_id, "a stopped call ends with the stop token, kept in the IDs"
        ids = ids[:-1]
    return tokenizer.decode(ids, skip_special_tokens=False)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_agents_sdk_tool_loop_on_a_tiny_model_is_recorded_with_vllms_ids(
    tiny_server: VLLMServer, tokenizer: Any, tmp_path: Path, stream: bool
) -> None:
    assert json.loads((Path(tiny_server.model_path or "") / "config.json").read_text())["head_dim"] == 64
    CALLS.clear()
    with SpanStore(tmp_path / "spans.duckdb") as store:
        store.enqueue_one({"question": "What is 2 + 3?"})
        started = store.dequeue(worker_id="w-tiny")
        assert started is not None
        rollout, attempt = started
        with GatewayServer(store, tiny_server.base_url) as gateway:

            async def run() -> RunResult | RunResultStreaming:
                url = gateway.base_url(rollout.rollout_id, attempt.attempt_id)
                async with AsyncOpenAI(base_url=url, api_key="x", max_retries=0) as client:
                    agent = _agent(client, tokenizer)
                    if not stream:
                        return await Runner.run(agent, "What is 2 + 3?", max_turns=4)
                    streamed = Runner.run_streamed(agent, "What is 2 + 3?", max_turns=4)
                    async for _ in streamed.stream_events():
                        pass
                    return streamed

            t0 = time.monotonic()
            result = asyncio.run(run())
            agent_s = time.monotonic() - t0
            assert gateway.flush(30)
        spans = list(store.iter_spans(attempt_ids=[attempt.attempt_id]))

    # Every model call the SDK made is one span of this attempt, in call order.
    assert len(spans) == len(result.raw_responses) >= 2, f"one span per model call ({agent_s:.1f}s)"
    assert all(s.kind == "llm_call" and s.status == "ok" for s in spans)
    assert [s.sequence_id for s in spans] == list(range(len(spans)))
    assert all(a.start_time <= b.start_time for a, b in itertools.pairwise(spans))
    assert all(s.attributes["stream"] is stream for s in spans)
    for span in spans:
        llm = span.llm
        assert llm.model == SERVED_NAME
        assert len(llm.prompt_token_ids) > 0 and len(llm.response_token_ids) > 0
        assert all(isinstance(t, int) for t in [*llm.prompt_token_ids, *llm.response_token_ids])
        assert llm.response_logprobs is not None and len(llm.response_logprobs) == len(llm.response_token_ids)

    # The tool really ran, with the arguments the recorded call carries.
    first = spans[0]
    (tool_call,) = first.llm.response_message["tool_calls"]
    args = json.loads(tool_call["function"]["arguments"])
    assert first.llm.finish_reason == "tool_calls" and tool_call["function"]["name"] == "add"
    assert CALLS and CALLS[0] == (args["a"], args["b"])
    sdk_call = result.raw_responses[0].output[0]
    assert (sdk_call.name, json.loads(sdk_call.arguments)) == ("add", args)

    # Only the first call was forced; the second request carries the tool result, and its prompt is
    # longer (the conversation grew).
    assert first.attributes["request_params"]["tool_choice"] == "required"
    assert spans[1].attributes["request_params"].get("tool_choice") != "required"
    tool_msgs = [m for m in spans[1].llm.request_messages if m.get("role") == "tool"]
    assert tool_msgs and str(args["a"] + args["b"]) in str(tool_msgs[0]["content"])
    assert len(spans[1].llm.prompt_token_ids) > len(first.llm.prompt_token_ids)

    # Identical to what vLLM returns: the same request again, straight to vLLM.
    for span in spans:
        truth = _replay(tiny_server, span)
        choice = truth["choices"][0]
        assert span.llm.prompt_token_ids == truth["prompt_token_ids"]
        assert span.llm.response_token_ids == choice["token_ids"]
        assert span.llm.finish_reason == choice["finish_reason"]
        assert span.llm.response_logprobs == pytest.approx(
            [e["logprob"] for e in choice["logprobs"]["content"]], abs=1e-4
        )
        assert span.llm.usage is not None and span.llm.usage.completion_tokens == len(choice["token_ids"])

    # Decoding the sampled IDs reproduces what the agent saw. For the tool call that is the Hermes text
    # the model wrote; vLLM's parser re-serialised its arguments (whitespace differs), so compare as JSON.
    raw_call = _sampled_text(tokenizer, first)
    assert raw_call.startswith("<tool_call>") and raw_call.endswith("</tool_call>")
    parsed = json.loads(raw_call.removeprefix("<tool_call>").removesuffix("</tool_call>").strip())
    assert parsed == {"name": "add", "arguments": args}
    for span, raw in zip(spans[1:-1], result.raw_responses[1:-1], strict=True):  # any further tool calls
        assert _sampled_text(tokenizer, span).startswith("<tool_call>") and raw.output
    last = spans[-1]
    assert not last.llm.response_message.get("tool_calls")
    assert _sampled_text(tokenizer, last) == last.llm.response_message["content"] == result.final_output
