"""Calls through the gateway to a real vLLM are recorded with exactly the IDs vLLM produced.

Ground truth is the same request sent straight to vLLM with ``return_token_ids`` (greedy, so both
runs sample the same tokens). The agent side uses the official ``openai`` client, so "the agent sees a
normal OpenAI response" is checked by the client that agents really use. max_tokens stays tiny.
"""

from __future__ import annotations

import json
import time

import httpx
import pytest
from openai import OpenAI

from spanlab.gateway import GatewayServer
from spanlab.store import SpanStore
from spanlab.types import Attempt, Rollout, Span
from tests.gateway.helpers import Upstream, detokenize, direct

pytestmark = pytest.mark.vllm

MESSAGES = [{"role": "user", "content": "Name three colors."}]


def _spans(store: SpanStore, attempt: Attempt) -> list[Span]:
    return list(store.iter_spans(attempt_ids=[attempt.attempt_id]))


def _client(gw: GatewayServer, started: tuple[Rollout, Attempt]) -> OpenAI:
    rollout, attempt = started
    return OpenAI(base_url=gw.base_url(rollout.rollout_id, attempt.attempt_id), api_key="unused", max_retries=0)


@pytest.fixture
def greedy_stop(upstream: Upstream) -> dict:
    """A greedy request that ends on a stop token after a few tokens, whatever the model.

    A small model rarely emits EOS within a tiny max_tokens, so we probe the greedy continuation
    and declare its third (or latest new) token a stop token (``stop_token_ids``): vLLM then stops there and, as for
    EOS, includes that ID in ``token_ids`` but not in the text.
    """
    body = {"model": upstream.model, "messages": MESSAGES, "max_tokens": 6, "temperature": 0}
    probe = direct(upstream, "/v1/chat/completions", body)["choices"][0]["token_ids"]
    fresh = [i for i, t in enumerate(probe) if t not in probe[:i]]  # a stop token must not occur earlier
    stop_at = next((i for i in fresh if i >= 2), fresh[-1])
    return {**body, "stop_token_ids": [probe[stop_at]]}


def _sdk(body: dict) -> dict:
    """OpenAI client kwargs: vLLM-only sampling fields travel in ``extra_body``, as agents send them."""
    extra = {k: body[k] for k in ("stop_token_ids", "ignore_eos") if k in body}
    return {**{k: v for k, v in body.items() if k not in extra}, "extra_body": extra}


def _check_against_truth(upstream: Upstream, span: Span, truth: dict, content: str | None) -> None:
    choice = truth["choices"][0]
    assert span.status == "ok"
    assert span.llm.prompt_token_ids == truth["prompt_token_ids"]
    assert span.llm.response_token_ids == choice["token_ids"]
    assert span.llm.response_logprobs == pytest.approx([e["logprob"] for e in choice["logprobs"]["content"]], abs=1e-3)
    assert span.llm.finish_reason == choice["finish_reason"] == "stop"
    assert span.llm.response_token_ids[-1] == choice["stop_reason"]  # the stop token is kept
    assert content == choice["message"]["content"] == span.llm.response_message["content"]
    assert detokenize(upstream, span.llm.response_token_ids[:-1]) == content
    assert span.llm.usage.completion_tokens == len(choice["token_ids"])


def test_chat_call_is_recorded_with_the_ids_vllm_returned(
    gateway: GatewayServer, store: SpanStore, started: tuple[Rollout, Attempt], upstream: Upstream, greedy_stop: dict
) -> None:
    truth = direct(upstream, "/v1/chat/completions", greedy_stop)
    resp = _client(gateway, started).chat.completions.create(**_sdk(greedy_stop))
    extra = resp.model_extra or {}
    assert "prompt_token_ids" not in extra and resp.choices[0].logprobs is None  # the agent did not ask
    assert "token_ids" not in (resp.choices[0].model_extra or {})
    assert gateway.flush(10)
    (span,) = _spans(store, started[1])
    _check_against_truth(upstream, span, truth, resp.choices[0].message.content)
    assert span.llm.request_messages == MESSAGES and span.attributes["request_params"]["temperature"] == 0


def test_streamed_call_reaches_the_agent_in_chunks_and_is_recorded_whole(
    gateway: GatewayServer, store: SpanStore, started: tuple[Rollout, Attempt], upstream: Upstream, greedy_stop: dict
) -> None:
    truth = direct(upstream, "/v1/chat/completions", greedy_stop)
    chunks = list(_client(gateway, started).chat.completions.create(**_sdk(greedy_stop), stream=True))
    # The role chunk, then content chunks (a loaded vLLM may put several tokens in one chunk).
    assert len(chunks) >= 2
    assert all("token_ids" not in (c.choices[0].model_extra or {}) for c in chunks if c.choices)
    assert all("prompt_token_ids" not in (c.model_extra or {}) for c in chunks)
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert gateway.flush(10)
    (span,) = _spans(store, started[1])
    _check_against_truth(upstream, span, truth, content)
    assert span.attributes["stream"] is True


def test_calls_of_an_attempt_are_stored_in_call_order(
    gateway: GatewayServer, store: SpanStore, started: tuple[Rollout, Attempt], upstream: Upstream
) -> None:
    client = _client(gateway, started)
    for k in (1, 2, 3):
        kwargs = {"model": upstream.model, "messages": MESSAGES, "max_tokens": k, "temperature": 0}
        if k == 2:
            list(client.chat.completions.create(**kwargs, stream=True))
        else:
            client.chat.completions.create(**kwargs)
    gateway.flush(10)
    spans = _spans(store, started[1])
    assert [s.sequence_id for s in spans] == [0, 1, 2]
    assert [len(s.llm.response_token_ids) for s in spans] == [1, 2, 3]
    assert [s.attributes["stream"] for s in spans] == [False, True, False]


@pytest.mark.parametrize("stream", [False, True])
def test_n2_records_one_span_per_choice_sharing_the_prompt(
    gateway: GatewayServer, store: SpanStore, started: tuple[Rollout, Attempt], upstream: Upstream, stream: bool
) -> None:
    body = {
        "model": upstream.model,
        "messages": MESSAGES,
        "max_tokens": 4,
        "temperature": 1.0,
        "n": 2,
        "stream": stream,
        "return_token_ids": True,
        "logprobs": True,
    }  # the agent asks: it can compare
    url = gateway.base_url(started[0].rollout_id, started[1].attempt_id) + "/chat/completions"
    seen: dict[int, list[int]] = {0: [], 1: []}
    prompt_ids = None
    if stream:
        with httpx.stream("POST", url, json=body, timeout=60) as resp:
            span_ids = resp.headers["x-spanlab-span-ids"].split(",")
            for line in resp.iter_lines():
                if line.startswith("data: {"):
                    chunk = json.loads(line[6:])
                    prompt_ids = prompt_ids or chunk.get("prompt_token_ids")
                    for c in chunk["choices"]:
                        seen[c["index"]] += c.get("token_ids") or []
    else:
        resp = httpx.post(url, json=body, timeout=60)
        span_ids = resp.headers["x-spanlab-span-ids"].split(",")
        data = resp.json()
        prompt_ids = data["prompt_token_ids"]
        seen = {c["index"]: c["token_ids"] for c in data["choices"]}
    gateway.flush(10)
    spans = _spans(store, started[1])
    assert [s.attributes["choice_index"] for s in spans] == [0, 1]
    assert [s.span_id for s in spans] == span_ids
    assert all(s.llm.prompt_token_ids == prompt_ids for s in spans)
    assert [s.llm.response_token_ids for s in spans] == [seen[0], seen[1]]
    assert all(len(s.llm.response_logprobs) == len(s.llm.response_token_ids) for s in spans)


def test_token_in_completions_are_recorded(
    gateway: GatewayServer, store: SpanStore, started: tuple[Rollout, Attempt], upstream: Upstream
) -> None:
    prompt = direct(upstream, "/v1/chat/completions", {"model": upstream.model, "messages": MESSAGES, "max_tokens": 1})[
        "prompt_token_ids"
    ]
    body = {"model": upstream.model, "prompt": prompt, "max_tokens": 3, "temperature": 0}
    truth = direct(upstream, "/v1/completions", body)["choices"][0]
    resp = _client(gateway, started).completions.create(**body)
    gateway.flush(10)
    (span,) = _spans(store, started[1])
    assert span.name == "completions" and span.llm.prompt_token_ids == prompt
    assert span.llm.response_token_ids == truth["token_ids"]
    assert span.llm.response_message["content"] == resp.choices[0].text == truth["text"]
    assert resp.choices[0].logprobs is None


def test_vllm_400_passes_through_and_is_recorded(
    gateway: GatewayServer, store: SpanStore, started: tuple[Rollout, Attempt], upstream: Upstream
) -> None:
    body = {"model": upstream.model, "messages": MESSAGES, "max_tokens": 10**7}
    raw = httpx.post(gateway.base_url(started[0].rollout_id, started[1].attempt_id) + "/chat/completions", json=body)
    assert raw.status_code == 400 and "max_tokens" in raw.json()["error"]["message"]
    gateway.flush(10)
    (span,) = _spans(store, started[1])
    assert span.status == "error" and span.attributes["upstream_status"] == 400
    assert span.attributes["error"]["body"] == raw.json()


def test_unattributed_calls_are_recorded_without_ids(
    gateway: GatewayServer, store: SpanStore, upstream: Upstream
) -> None:
    client = OpenAI(base_url=gateway.base_url(), api_key="unused", max_retries=0)
    client.chat.completions.create(model=upstream.model, messages=MESSAGES, max_tokens=1)
    assert client.models.list().data[0].id == upstream.model
    gateway.flush(10)
    (span,) = store.iter_spans()
    assert span.rollout_id is None and span.attempt_id is None and len(span.llm.response_token_ids) == 1


def test_agent_leaving_mid_stream_records_what_was_generated_as_an_error(
    gateway: GatewayServer, store: SpanStore, started: tuple[Rollout, Attempt], upstream: Upstream
) -> None:
    body = {
        "model": upstream.model,
        "messages": MESSAGES,
        "max_tokens": 200,
        "temperature": 1.0,
        "stream": True,
        "ignore_eos": True,
    }
    url = gateway.base_url(started[0].rollout_id, started[1].attempt_id) + "/chat/completions"
    with httpx.stream("POST", url, json=body, timeout=60) as resp:
        events = 0
        for line in resp.iter_lines():
            events += line.startswith("data: ")
            if events == 3:
                break  # leaving the block closes the connection mid-stream
    deadline = time.monotonic() + 10
    while not (spans := _spans(store, started[1])) and time.monotonic() < deadline:
        gateway.flush(1)
        time.sleep(0.05)
    (span,) = spans
    assert span.status == "error" and span.attributes["error"]["type"] == "client_disconnected"
    assert 1 <= len(span.llm.response_token_ids) < 200
    assert len(span.llm.response_logprobs) == len(span.llm.response_token_ids)
