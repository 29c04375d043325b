"""Pure functions of the gateway on vLLM-shaped payloads (copied from real vLLM 0.32 output).

No server here: these pin the folding of streams, the n>1 shape and what is removed for the agent.
End-to-end behaviour against a real vLLM lives in test_gateway_vllm.py.
"""

from __future__ import annotations

import copy
import math

import pytest

from spanlab.gateway.protocol import AgentAsked, BadRequestError, prepare_upstream, strip_for_agent
from spanlab.gateway.recording import CallContext, spans_from_record
from spanlab.gateway.records import StreamAccumulator, record_from_response

PROMPT = [151644, 872, 198, 6023, 151645, 198, 151644, 77091, 198]

CHAT_RESPONSE = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "model": "m",
    "choices": [
        {
            "index": 1,
            "message": {"role": "assistant", "content": "b", "refusal": None, "tool_calls": []},
            "logprobs": {
                "content": [
                    {"token": "b", "logprob": -0.5, "top_logprobs": []},
                    {"token": "<|im_end|>", "logprob": -0.1, "top_logprobs": []},
                ]
            },
            "finish_reason": "stop",
            "stop_reason": None,
            "token_ids": [65, 151645],
        },
        {
            "index": 0,
            "message": {"role": "assistant", "content": "a", "refusal": None},
            "logprobs": {"content": [{"token": "a", "logprob": -1.0, "top_logprobs": []}]},
            "finish_reason": "length",
            "stop_reason": None,
            "token_ids": [64],
        },
    ],
    "usage": {"prompt_tokens": 9, "total_tokens": 12, "completion_tokens": 3},
    "prompt_token_ids": PROMPT,
}


def _ctx(endpoint: str = "chat", n: int = 1, stream: bool = False) -> CallContext:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "n": n, "temperature": 0.7}
    return CallContext(
        endpoint=endpoint,
        rollout_id=None,
        attempt_id=None,
        body=body,
        asked=AgentAsked(logprobs=False, token_ids=False, stream=stream, n=n),
        span_ids=[f"sp-{i}" for i in range(n)],
        start_time=1.0,
    )


def test_prepare_upstream_adds_token_ids_and_logprobs_and_remembers_what_the_agent_asked() -> None:
    body = {"model": "m", "messages": [], "temperature": 0}
    up, asked = prepare_upstream("chat", body)
    assert up == {**body, "return_token_ids": True, "logprobs": True}
    assert asked == AgentAsked(logprobs=False, token_ids=False, stream=False, n=1)
    assert "return_token_ids" not in body  # the agent's body is not mutated
    up, asked = prepare_upstream("completions", {"model": "m", "prompt": [1, 2], "logprobs": 0, "stream": True})
    assert up["logprobs"] == 0 and asked.logprobs and asked.stream  # completions: 0 means "asked"
    up, _ = prepare_upstream("completions", {"model": "m", "prompt": "x"})
    assert up["logprobs"] == 0
    with pytest.raises(BadRequestError, match="messages"):
        prepare_upstream("chat", {"model": "m"})
    with pytest.raises(BadRequestError, match="`n`"):
        prepare_upstream("chat", {"model": "m", "messages": [], "n": 0})


def test_strip_for_agent_removes_only_what_the_gateway_added() -> None:
    resp = copy.deepcopy(CHAT_RESPONSE)
    out = strip_for_agent(resp, "chat", AgentAsked(logprobs=False, token_ids=False, stream=False, n=2))
    assert "prompt_token_ids" not in out
    assert all("token_ids" not in c and c["logprobs"] is None for c in out["choices"])
    assert out["choices"][0]["message"] == CHAT_RESPONSE["choices"][0]["message"]
    kept = strip_for_agent(copy.deepcopy(CHAT_RESPONSE), "chat", AgentAsked(True, True, False, 2))
    assert kept == CHAT_RESPONSE


def test_n2_response_gives_one_span_per_choice_sharing_the_prompt() -> None:
    spans = spans_from_record(_ctx(n=2), record_from_response("chat", CHAT_RESPONSE), end_time=2.0)
    assert [s.span_id for s in spans] == ["sp-0", "sp-1"]
    assert [s.attributes["choice_index"] for s in spans] == [0, 1]
    assert all(s.attributes["n"] == 2 and s.llm.prompt_token_ids == PROMPT for s in spans)
    assert spans[1].llm.response_token_ids == [65, 151645]  # stop token kept, as vLLM returns it
    assert spans[1].llm.response_logprobs == [-0.5, -0.1]
    assert spans[1].llm.response_message == {"role": "assistant", "content": "b", "tool_calls": []}
    assert spans[0].llm.usage.completion_tokens == 1 and spans[1].llm.usage.completion_tokens == 2
    assert spans[0].attributes["upstream_usage"]["completion_tokens"] == 3
    assert spans[0].attributes["request_params"] == {"model": "m", "n": 2, "temperature": 0.7}


def _chunk(choices: list[dict], **top: object) -> dict:
    return {"id": "chatcmpl-2", "object": "chat.completion.chunk", "model": "m", "choices": choices, **top}


def test_stream_accumulator_folds_content_tool_calls_token_ids_and_logprobs() -> None:
    lp = lambda *xs: {"content": [{"token": "t", "logprob": x, "top_logprobs": []} for x in xs]}  # noqa: E731
    chunks = [
        _chunk(
            [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}],
            prompt_token_ids=PROMPT,
        ),
        _chunk(
            [{"index": 1, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}],
            prompt_token_ids=PROMPT,
        ),
        _chunk(
            [
                {
                    "index": 0,
                    "delta": {
                        "tool_calls": [
                            {
                                "index": 0,
                                "id": "call_1",
                                "type": "function",
                                "function": {"name": "add", "arguments": ""},
                            }
                        ]
                    },
                    "logprobs": lp(-0.1, -0.2),
                    "token_ids": [10, 11],
                }
            ]
        ),
        _chunk([{"index": 1, "delta": {"content": "he"}, "logprobs": lp(-1.0), "token_ids": [20]}]),
        _chunk(
            [
                {
                    "index": 0,
                    "delta": {"tool_calls": [{"index": 0, "function": {"arguments": '{"a": 1, '}}]},
                    "logprobs": lp(-0.3),
                    "token_ids": [12],
                }
            ]
        ),
        _chunk(
            [
                {
                    "index": 0,
                    "delta": {"tool_calls": [{"index": 0, "function": {"arguments": '"b": 2}'}}]},
                    "logprobs": lp(-0.4),
                    "token_ids": [13],
                }
            ]
        ),
        _chunk([{"index": 0, "delta": {}, "logprobs": lp(-0.5), "finish_reason": "tool_calls", "token_ids": [151645]}]),
        _chunk(
            [
                {
                    "index": 1,
                    "delta": {"content": "y"},
                    "logprobs": lp(-2.0),
                    "finish_reason": "length",
                    "token_ids": [21],
                }
            ]
        ),
    ]
    acc = StreamAccumulator("chat")
    for c in chunks:
        acc.add(c)
    rec = acc.result()
    assert rec.prompt_token_ids == PROMPT and acc.error is None
    c0, c1 = rec.choices
    assert c0.token_ids == [10, 11, 12, 13, 151645] and c0.logprobs == [-0.1, -0.2, -0.3, -0.4, -0.5]
    assert c0.finish_reason == "tool_calls"
    assert c0.message == {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}
        ],
    }
    assert c1.token_ids == [20, 21] and c1.message == {"role": "assistant", "content": "hey"}
    spans = spans_from_record(_ctx(n=2, stream=True), rec, end_time=2.0)
    assert [s.llm.response_token_ids for s in spans] == [[10, 11, 12, 13, 151645], [20, 21]]
    assert spans[0].llm.usage.model_dump() == {"prompt_tokens": 9, "completion_tokens": 5, "total_tokens": 14}


def test_completions_stream_takes_prompt_ids_from_the_first_chunk_per_choice() -> None:
    acc = StreamAccumulator("completions")
    acc.add(
        {
            "id": "c",
            "choices": [
                {
                    "index": 0,
                    "text": "re",
                    "logprobs": {"token_logprobs": [-1.5]},
                    "prompt_token_ids": [6023, 1052],
                    "token_ids": [23319],
                }
            ],
        }
    )
    acc.add(
        {
            "id": "c",
            "choices": [
                {
                    "index": 0,
                    "text": "po",
                    "logprobs": {"token_logprobs": [-2.5]},
                    "prompt_token_ids": None,
                    "token_ids": [93991],
                    "finish_reason": "length",
                }
            ],
        }
    )
    acc.add({"id": "c", "choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 2, "total_tokens": 4}})
    (span,) = spans_from_record(_ctx("completions"), acc.result(), end_time=2.0)
    assert span.llm.prompt_token_ids == [6023, 1052] and span.llm.response_token_ids == [23319, 93991]
    assert span.llm.response_logprobs == [-1.5, -2.5] and span.llm.response_message["content"] == "repo"
    assert span.name == "completions" and span.llm.request_messages == []


def test_a_field_that_fails_validation_is_dropped_not_the_call() -> None:
    resp = copy.deepcopy(CHAT_RESPONSE)
    resp["choices"][0]["logprobs"]["content"][0]["logprob"] = math.nan  # the choice with index 1
    spans = spans_from_record(_ctx(n=2), record_from_response("chat", resp), end_time=2.0)
    assert spans[1].status == "ok" and spans[1].llm.response_logprobs is None
    assert spans[1].llm.response_token_ids == [65, 151645]
    assert "response_logprobs" in spans[1].attributes["recording_error"]


def test_stream_error_event_is_kept() -> None:
    acc = StreamAccumulator("chat")
    acc.add(_chunk([{"index": 0, "delta": {"content": "x"}, "token_ids": [5]}], prompt_token_ids=PROMPT))
    acc.add({"error": {"message": "engine died", "type": "InternalServerError", "code": 500}})
    assert acc.error == {"message": "engine died", "type": "InternalServerError", "code": 500}
    (span,) = spans_from_record(_ctx(), acc.result(), end_time=2.0, error={"type": "upstream_stream_error"})
    assert span.status == "error" and span.llm.response_token_ids == [5]
