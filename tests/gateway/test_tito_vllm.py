"""TITO mode against a real vLLM: the session buffer is, call by call, what vLLM read and sampled.

The agent is the official ``openai`` client running a tool loop. SmolLM2-135M calls no tool on its own
(REFERENCE §8), so the conversation opens with two worked examples (question -> Hermes tool call -> result
-> answer); greedy, it then calls the tool too. Ground truth is vLLM itself: each span's prompt and
response IDs are the ones vLLM returned, and replaying the last prompt straight to vLLM samples the same
IDs. max_tokens stays small (2 shared CPU cores).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from openai import OpenAI

from spanlab.agents.calc.mcp_server import CalculatorError, evaluate
from spanlab.gateway import GatewayServer
from spanlab.store import SpanStore
from spanlab.types import Attempt, Rollout, Span
from tests.gateway.helpers import Upstream, root_url

pytestmark = pytest.mark.vllm

CALC: dict[str, Any] = {"type": "function", "function": {
    "name": "calc", "description": "evaluate arithmetic",
    "parameters": {"type": "object", "properties": {"expr": {"type": "string"}}, "required": ["expr"]}}}


def _demo(i: int, expr: str, result: str) -> list[dict[str, Any]]:
    call = {"id": f"demo{i}", "type": "function", "function": {"name": "calc", "arguments": json.dumps({"expr": expr})}}
    return [{"role": "user", "content": f"What is {expr}?"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"demo{i}", "name": "calc", "content": result},
            {"role": "assistant", "content": f"The answer is {result}."}]


FEW_SHOT: list[dict[str, Any]] = [
    {"role": "system", "content": "You answer arithmetic questions by calling the calc tool, then state the answer."},
    *_demo(1, "3 + 4", "7"), *_demo(2, "12 * 5", "60"),
]


@pytest.fixture(scope="module")
def tito_store() -> Iterator[SpanStore]:
    with SpanStore(":memory:") as s:
        yield s


@pytest.fixture(scope="module")
def tito_gw(tito_store: SpanStore, upstream: Upstream) -> Iterator[GatewayServer]:
    """One TITO gateway for the module, on the engine's primitives (the session server has --enable-scale-out)."""
    with GatewayServer(tito_store, upstream.base_url, tito=True) as gw:
        assert gw.gateway.tito is not None and gw.gateway.tito.engine is not None
        yield gw


@pytest.fixture(scope="module")
def local_gw(tito_store: SpanStore, upstream: Upstream) -> Iterator[GatewayServer]:
    """The fallback path (our renderer + hermes parser, /v1/completions), for an upstream without render routes."""
    with GatewayServer(tito_store, upstream.base_url, tito=True, tito_render="local") as gw:
        assert gw.gateway.tito is not None and gw.gateway.tito.engine is None
        yield gw


@pytest.fixture(params=["engine", "local"])
def any_gw(request: pytest.FixtureRequest) -> GatewayServer:
    """Both TITO paths: the engine's render / generate / derender (vLLM started with --enable-scale-out), and
    the fallback."""
    gw: GatewayServer = request.getfixturevalue("tito_gw" if request.param == "engine" else "local_gw")
    return gw


@pytest.fixture
def attempt(tito_store: SpanStore) -> tuple[Rollout, Attempt]:
    tito_store.enqueue_one({"task": "tito"})
    got = tito_store.dequeue(worker_id="w0")
    assert got is not None
    return got


def _client(gw: GatewayServer, attempt: tuple[Rollout, Attempt]) -> OpenAI:
    return OpenAI(base_url=gw.base_url(attempt[0].rollout_id, attempt[1].attempt_id), api_key="x", max_retries=0)


def _spans(gw: GatewayServer, store: SpanStore, attempt: tuple[Rollout, Attempt]) -> list[Span]:
    assert gw.flush()
    return sorted(store.iter_spans(attempt_ids=[attempt[1].attempt_id]), key=lambda s: s.sequence_id or 0)


def _tito(span: Span) -> dict[str, Any]:
    return span.attributes["tito"]


def _ids(v: Any) -> list[int]:
    return [int(x) for x in v]


def _calc(expr: str) -> str:
    """The calc tool: the tutorial calculator's safe evaluator (no eval), errors as text for the model."""
    try:
        return evaluate(expr)
    except CalculatorError:
        return "error"


def test_tool_session_buffer_is_what_vllm_read_and_sampled(
    any_gw: GatewayServer, tito_store: SpanStore, attempt: tuple[Rollout, Attempt], upstream: Upstream
) -> None:
    tito_gw = any_gw
    client = _client(tito_gw, attempt)
    messages: list[dict[str, Any]] = [*FEW_SHOT, {"role": "user", "content": "What is 47 + 38?"}]
    seen_calls = 0
    for question in ("What is 9 * 8?", "What is 100 - 1?", None):
        reply = client.chat.completions.create(model=upstream.model, messages=messages, tools=[CALC],
                                               temperature=0, max_tokens=40)
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))  # what an agent sends back
        if message.tool_calls:
            assert reply.choices[0].finish_reason == "tool_calls"
            seen_calls += len(message.tool_calls)
            for tc in message.tool_calls:
                expr = json.loads(tc.function.arguments).get("expr", "")
                messages.append({"role": "tool", "tool_call_id": tc.id, "name": tc.function.name,
                                 "content": _calc(str(expr))})
        elif question is not None:
            messages.append({"role": "user", "content": question})
    assert seen_calls >= 1, "the model made no tool call: the session did not exercise the Hermes parse"

    spans = _spans(tito_gw, tito_store, attempt)
    assert len(spans) == 3 and all(s.status == "ok" and s.name == "chat.completions" for s in spans)
    assert [_tito(s)["event"] for s in spans] == ["start", "extend", "extend"]
    assert {_tito(s)["segment"] for s in spans} == {0}  # no call was re-rendered into a new segment
    last = spans[-1].llm
    final = _ids(last.prompt_token_ids) + _ids(last.response_token_ids)
    expected_mask = [0] * len(final)
    for span in spans:  # call by call: vLLM's own prompt and sampled IDs sit verbatim in the final buffer
        prompt, sampled = _ids(span.llm.prompt_token_ids), _ids(span.llm.response_token_ids)
        assert final[: len(prompt)] == prompt
        assert final[len(prompt) : len(prompt) + len(sampled)] == sampled
        expected_mask[len(prompt) : len(prompt) + len(sampled)] = [1] * len(sampled)
        assert _ids(span.llm.loss_mask) == expected_mask[: len(prompt) + len(sampled)]
        assert len(span.llm.response_logprobs) == len(sampled)
    assert any(s.llm.response_message.get("tool_calls") for s in spans)
    # The agent's echo of a call is recorded as it sent it; the buffer kept the sampled IDs of the call.
    assert spans[1].llm.request_messages[len(FEW_SHOT) + 1]["role"] == "assistant"

    # Replaying the last prompt straight to vLLM samples the same IDs (greedy): the spans hold vLLM's truth.
    truth = httpx.post(root_url(upstream) + "/v1/completions", timeout=120, json={
        "model": upstream.model, "prompt": _ids(last.prompt_token_ids), "max_tokens": 40, "temperature": 0,
        "return_token_ids": True, "skip_special_tokens": False}).json()["choices"][0]
    assert truth["prompt_token_ids"] == _ids(last.prompt_token_ids)
    assert truth["token_ids"] == _ids(last.response_token_ids)

    rows = tito_store.query(  # the whole session, as a trainer reads it
        "SELECT segment, segment_start, calls, token_ids, loss_mask, len(logprobs) AS n_lp, num_sampled "
        f"FROM tito_sessions WHERE attempt_id = '{attempt[1].attempt_id}'"
    ).to_pylist()
    assert len(rows) == 1
    row = rows[0]
    assert (row["segment"], row["segment_start"], row["calls"]) == (0, 0, 3)
    assert row["token_ids"] == final and row["loss_mask"] == expected_mask
    assert row["n_lp"] == row["num_sampled"] == sum(expected_mask)


def test_rewritten_history_starts_a_new_segment_with_the_engines_render(
    tito_gw: GatewayServer, tito_store: SpanStore, attempt: tuple[Rollout, Attempt], upstream: Upstream
) -> None:
    client = _client(tito_gw, attempt)
    first = [{"role": "user", "content": "Name a color."}]
    reply = client.chat.completions.create(model=upstream.model, messages=first, temperature=0, max_tokens=8)
    answer = reply.choices[0].message.model_dump(exclude_none=True)
    edited = [{"role": "user", "content": "Name a fruit."}, answer, {"role": "user", "content": "Another?"}]
    client.chat.completions.create(model=upstream.model, messages=edited, temperature=0, max_tokens=8)
    s1, s2 = _spans(tito_gw, tito_store, attempt)
    seg0 = _ids(s1.llm.prompt_token_ids) + _ids(s1.llm.response_token_ids)
    assert _tito(s2) == {**_tito(s2), "event": "new_segment", "reason": "history_rewritten", "segment": 1,
                         "offset": len(seg0)}
    engine = httpx.post(root_url(upstream) + "/tokenize", timeout=60, json={
        "model": upstream.model, "messages": edited, "add_generation_prompt": True}).json()["tokens"]
    assert _ids(s2.llm.prompt_token_ids) == engine  # the new segment starts from the engine's own render
    assert _ids(s2.llm.loss_mask) == [0] * len(engine) + [1] * len(s2.llm.response_token_ids)
    rows = tito_store.query(
        "SELECT segment, segment_start, token_ids, loss_mask FROM tito_sessions "
        f"WHERE attempt_id = '{attempt[1].attempt_id}' ORDER BY segment"
    ).to_pylist()
    assert [(r["segment"], r["segment_start"]) for r in rows] == [(0, 0), (1, len(seg0))]
    assert rows[0]["token_ids"] == seg0  # the old segment is kept as it was (frozen)
    assert rows[0]["loss_mask"] == _ids(s1.llm.loss_mask)


def test_cut_turn_is_kept_and_closed_then_a_streamed_call_continues(
    tito_gw: GatewayServer, tito_store: SpanStore, attempt: tuple[Rollout, Attempt], upstream: Upstream
) -> None:
    client = _client(tito_gw, attempt)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Count from one to twenty in words."}]
    reply = client.chat.completions.create(model=upstream.model, messages=messages, temperature=0, max_tokens=4)
    assert reply.choices[0].finish_reason == "length"
    messages += [reply.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "Go on."}]
    stream = client.chat.completions.create(model=upstream.model, messages=messages, temperature=0, max_tokens=6,
                                            stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    s1, s2 = _spans(tito_gw, tito_store, attempt)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == len(s2.llm.response_token_ids)
    assert len(chunks) >= 3  # role, content, finish (+ usage): the agent's SDK parsed a real event stream
    assert _tito(s2)["event"] == "extend" and s2.attributes["stream"] is True
    assert s2.llm.response_message["content"] == text
    cut = _ids(s1.llm.prompt_token_ids) + _ids(s1.llm.response_token_ids)
    prompt2 = _ids(s2.llm.prompt_token_ids)
    im_end, newline = 2, 198  # SmolLM2's <|im_end|> and "\n": the template's end of turn and stop gap
    assert prompt2[: len(cut)] == cut and prompt2[len(cut) : len(cut) + 2] == [im_end, newline]
    assert _ids(s2.llm.loss_mask)[len(cut) - 4 : len(cut) + 2] == [1, 1, 1, 1, 0, 0]


def test_max_tokens_16_is_honoured_on_both_paths(
    any_gw: GatewayServer, tito_store: SpanStore, attempt: tuple[Rollout, Attempt], upstream: Upstream
) -> None:
    """16 is vLLM SamplingParams' default, which the render's JSON leaves out (omit_defaults): the engine path
    must still cap the call there, not at the rest of the context (docs/tito.md)."""
    messages = [{"role": "user", "content": "Write a long essay on the history of Rome, with many details."}]
    reply = _client(any_gw, attempt).chat.completions.create(model=upstream.model, messages=messages,
                                                             temperature=0, max_tokens=16)
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage is not None and reply.usage.completion_tokens == 16
    (span,) = _spans(any_gw, tito_store, attempt)
    assert len(span.llm.response_token_ids) == 16


def test_calls_tito_cannot_serve_are_recorded_per_call(
    tito_gw: GatewayServer, tito_store: SpanStore, attempt: tuple[Rollout, Attempt], upstream: Upstream
) -> None:
    client = _client(tito_gw, attempt)
    msgs = [{"role": "user", "content": "Say hi."}]
    reply = client.chat.completions.create(model=upstream.model, messages=msgs, temperature=1.0,
                                           max_tokens=3, n=2)
    assert len(reply.choices) == 2
    OpenAI(base_url=tito_gw.base_url(), api_key="x").chat.completions.create(
        model=upstream.model, messages=msgs, temperature=0, max_tokens=3)
    spans = _spans(tito_gw, tito_store, attempt)
    assert len(spans) == 2 and {_tito(s)["mode"] for s in spans} == {"per_call"}
    assert _tito(spans[0])["reason"].startswith("n > 1")
    assert spans[0].llm.loss_mask is None and spans[0].llm.prompt_token_ids is not None
    unattributed = tito_store.query(
        "SELECT attributes->>'$.tito.reason' AS reason FROM spans WHERE attempt_id IS NULL").to_pylist()
    assert {"reason": "unattributed"} in unattributed


def test_a_tokenizer_that_is_not_the_served_models_is_refused(store: SpanStore, upstream: Upstream) -> None:
    from spanlab.tito.readiness import TitoUnavailableError
    from tests.conftest import SHARED

    qwen = SHARED / "fixtures" / "tokenizers" / "qwen2.5"
    if not (qwen / "tokenizer.json").exists():
        pytest.skip(f"Qwen2.5 tokenizer fixture not found at {qwen}")
    with pytest.raises(TitoUnavailableError, match="renders other token IDs than the engine"):
        GatewayServer(store, upstream.base_url, tito=True, tokenizer=qwen, tito_render="local")
