"""The real ``anthropic`` SDK against the gateway's ``/v1/messages`` and the session's real vLLM (SmolLM2-135M).

Through a TITO gateway (the attempt's token buffer, on the engine's render / generate / derender): a plain call, a
streamed call, and a tool-use round trip (``tool_use`` -> ``tool_result`` -> final text), streamed and not. In
each, every span's ``response_token_ids`` decode to what the SDK returned (the text, or the tool call's name and
input), and ``tito_sessions`` holds one sequence for the attempt in which each call's prompt and sampled IDs sit
verbatim. SmolLM2 does not call tools on its own; two worked examples in the conversation (few-shot, as in
tests/gateway/test_tito_vllm.py) make it call the tool greedily, without a forced ``tool_choice`` (which TITO
serves per call, outside the buffer). Per call (no TITO): a plain call records exactly the IDs vLLM's chat route
samples for the same greedy request, and returns them to an agent that asks (``return_token_ids``); a
``max_tokens`` over the engine's context length is refused before anything is stored.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from anthropic import Anthropic, BadRequestError
from anthropic.types import Message

from spanlab.agents.calc.mcp_server import CalculatorError, evaluate
from spanlab.gateway import GatewayServer
from spanlab.store import SpanStore
from spanlab.types import Attempt, Rollout, Span
from tests.gateway.helpers import Upstream, detokenize, direct

pytestmark = pytest.mark.vllm

CALC = {"name": "calc", "description": "evaluate arithmetic",
        "input_schema": {"type": "object", "properties": {"expr": {"type": "string"}}, "required": ["expr"]}}
SYSTEM = "You answer arithmetic questions by calling the calc tool, then state the answer."
# anthropic 2.14's create() has no sampling arguments (temperature, top_p, top_k); the body carries them.
GREEDY = {"temperature": 0.0}
_TOOL_CALL = re.compile(r"<tool_call>\s*(\{.*\})\s*</tool_call>", re.DOTALL)


def _demo(i: int, expr: str, result: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"What is {expr}?"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": f"demo{i}", "name": "calc",
                                               "input": {"expr": expr}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"demo{i}", "content": result}]},
            {"role": "assistant", "content": f"The answer is {result}."}]


FEW_SHOT = [*_demo(1, "3 + 4", "7"), *_demo(2, "12 * 5", "60")]


@pytest.fixture
def tito_gateway(store: SpanStore, upstream: Upstream) -> Iterator[GatewayServer]:
    with GatewayServer(store, upstream.base_url, tito=True) as gw:
        assert gw.gateway.tito is not None and gw.gateway.tito.engine is not None
        yield gw


def _client(gw: GatewayServer, started: tuple[Rollout, Attempt] | None) -> Anthropic:
    base = gw.base_url(*(None, None) if started is None else (started[0].rollout_id, started[1].attempt_id))
    return Anthropic(base_url=base.removesuffix("/v1"), api_key="unused", max_retries=0)


def _create(client: Anthropic, stream: bool, **kwargs: Any) -> tuple[Message, set[str]]:
    """The SDK's message, and the delta types it streamed (empty unstreamed)."""
    if not stream:
        return client.messages.create(**kwargs), set()
    deltas: set[str] = set()
    with client.messages.stream(**kwargs) as events:
        for event in events:
            if event.type == "content_block_delta":
                deltas.add(event.delta.type)
        return events.get_final_message(), deltas


def _spans(gw: GatewayServer, store: SpanStore, attempt: Attempt) -> list[Span]:
    assert gw.flush(10)
    return sorted(store.iter_spans(attempt_ids=[attempt.attempt_id]), key=lambda s: s.sequence_id or 0)


def _check_decoded(span: Span, reply: Message, upstream: Upstream) -> None:
    """The sampled IDs (minus the stop token the engine stopped on) decode to what the SDK returned."""
    ids = [int(t) for t in span.llm.response_token_ids]
    assert ids and reply.usage.output_tokens == len(ids)
    text = detokenize(upstream, ids[:-1] if reply.stop_reason in ("end_turn", "tool_use") else ids)
    tool_uses = [b for b in reply.content if b.type == "tool_use"]
    if tool_uses:
        assert [json.loads(m) for m in _TOOL_CALL.findall(text)] == [
            {"name": b.name, "arguments": b.input} for b in tool_uses], text
    else:
        (block,) = reply.content
        assert block.type == "text" and block.text == text


def _check_one_sequence(store: SpanStore, attempt: Attempt, spans: list[Span]) -> None:
    """``tito_sessions`` holds one sequence for the attempt: every call's prompt and sampled IDs, in place."""
    rows = store.query("SELECT segment, calls, token_ids, loss_mask FROM tito_sessions "
                       f"WHERE attempt_id = '{attempt.attempt_id}'").to_pylist()
    assert len(rows) == 1 and rows[0]["calls"] == len(spans), rows
    sequence, mask = rows[0]["token_ids"], rows[0]["loss_mask"]
    assert [s.attributes["tito"]["event"] for s in spans] == ["start"] + ["extend"] * (len(spans) - 1)
    for span in spans:
        prompt, sampled = list(span.llm.prompt_token_ids), list(span.llm.response_token_ids)
        assert sequence[: len(prompt)] == prompt
        assert sequence[len(prompt): len(prompt) + len(sampled)] == sampled
        assert set(mask[len(prompt): len(prompt) + len(sampled)]) == {1}
    assert sum(mask) == sum(len(s.llm.response_token_ids) for s in spans)


@pytest.mark.parametrize("stream", [False, True])
def test_a_call_is_recorded_with_the_ids_that_decode_to_the_sdks_text(
    store: SpanStore, tito_gateway: GatewayServer, started: tuple[Rollout, Attempt], upstream: Upstream,
    stream: bool
) -> None:
    reply, deltas = _create(_client(tito_gateway, started), stream, model=upstream.model, max_tokens=24,
                            extra_body=GREEDY, system="Be brief.",
                            messages=[{"role": "user", "content": "Name a fruit."}])
    (span,) = _spans(tito_gateway, store, started[1])
    assert (span.name, span.status, span.attributes["endpoint"], span.attributes["stream"]) == \
           ("messages", "ok", "/v1/messages", stream)
    assert span.attributes["messages"]["message_id"] == reply.id
    assert reply.usage.input_tokens == len(span.llm.prompt_token_ids)
    assert deltas == ({"text_delta"} if stream else set())
    _check_decoded(span, reply, upstream)
    _check_one_sequence(store, started[1], [span])


def _calc(expr: str) -> str:
    try:
        return evaluate(expr)
    except CalculatorError:
        return "error"


@pytest.mark.parametrize("stream", [False, True])
def test_a_tool_use_round_trip_is_one_sequence_of_the_sampled_ids(
    store: SpanStore, tito_gateway: GatewayServer, started: tuple[Rollout, Attempt], upstream: Upstream,
    stream: bool
) -> None:
    client = _client(tito_gateway, started)
    messages: list[dict[str, Any]] = [*FEW_SHOT, {"role": "user", "content": "What is 47 + 38?"}]
    ask = {"model": upstream.model, "max_tokens": 40, "extra_body": GREEDY, "system": SYSTEM, "tools": [CALC]}
    first, deltas1 = _create(client, stream, messages=messages, **ask)
    assert first.stop_reason == "tool_use", first  # the few-shot examples make the greedy model call the tool
    (call,) = [b for b in first.content if b.type == "tool_use"]
    # The greedy call's name and arguments are the model's (SmolLM2 may name it after the operation): the tool
    # answers whatever it was asked, as an agent's tool would.
    result = _calc(str(next(iter(call.input.values()), "")))
    messages += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": result}]}]
    final, deltas2 = _create(client, stream, messages=messages, **ask)
    assert final.stop_reason == "end_turn" and final.content[0].type == "text" and final.content[0].text
    if stream:  # the tool call's input and the answer's text arrived as deltas
        assert "input_json_delta" in deltas1 and deltas2 == {"text_delta"}
    spans = _spans(tito_gateway, store, started[1])
    assert [s.name for s in spans] == ["messages", "messages"] and all(s.status == "ok" for s in spans)
    for span, reply in zip(spans, (first, final), strict=True):
        _check_decoded(span, reply, upstream)
    # The tool_use echo and the tool_result reached the engine as a chat conversation.
    assert spans[1].llm.request_messages[-2]["tool_calls"][0]["id"] == call.id
    assert spans[1].llm.request_messages[-1] == {"role": "tool", "tool_call_id": call.id, "content": result}
    _check_one_sequence(store, started[1], spans)


def test_a_plain_call_records_the_ids_vllm_samples_for_the_same_chat_request(
    store: SpanStore, gateway: GatewayServer, started: tuple[Rollout, Attempt], upstream: Upstream
) -> None:
    reply = _client(gateway, started).messages.create(
        model=upstream.model, max_tokens=8, system="Be brief.", messages=[{"role": "user", "content": "Name a fruit."}],
        extra_body={**GREEDY, "return_token_ids": True})
    (span,) = _spans(gateway, store, started[1])
    truth = direct(upstream, "/v1/chat/completions", {
        "model": upstream.model, "temperature": 0.0, "max_tokens": 8,
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a fruit."}]})
    assert span.llm.prompt_token_ids == truth["prompt_token_ids"] == reply.model_extra["prompt_token_ids"]
    assert span.llm.response_token_ids == truth["choices"][0]["token_ids"] == reply.model_extra["output_token_ids"]
    assert reply.content[0].text == truth["choices"][0]["message"]["content"] == span.llm.response_message["content"]
    assert reply.stop_reason == {"length": "max_tokens", "stop": "end_turn"}[truth["choices"][0]["finish_reason"]]


def test_max_tokens_over_the_context_length_is_refused_and_not_stored(
    store: SpanStore, gateway: GatewayServer, started: tuple[Rollout, Attempt], upstream: Upstream
) -> None:
    with pytest.raises(BadRequestError) as err:
        _client(gateway, started).messages.create(model=upstream.model, max_tokens=5000,  # the context: 4096
                                                  messages=[{"role": "user", "content": "hi"}])
    assert err.value.body["error"]["type"] == "invalid_request_error"
    assert "over the model's limit of" in err.value.body["error"]["message"]
    assert gateway.flush(10) and list(store.iter_spans()) == []
