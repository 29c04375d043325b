"""The Responses <-> chat translation (pure functions), checked against the openai SDK's own types."""

from __future__ import annotations

import json

import pytest
from openai.types.responses import Response

from spanlab.gateway.protocol import BadRequestError
from spanlab.gateway.responses.protocol import to_chat, to_response
from spanlab.gateway.responses.stream import ResponsesStream
from spanlab.gateway.tito.protocol import sse_events as tito_sse_events

TOOL = {"type": "function", "name": "add", "description": "add", "parameters": {"type": "object"}, "strict": False}


def test_a_tool_loop_input_becomes_the_chat_conversation() -> None:
    body = {
        "model": "m", "instructions": "be brief", "tools": [TOOL], "tool_choice": "required", "max_output_tokens": 9,
        "temperature": 0.0, "store": False, "include": ["message.output_text.logprobs"], "top_k": 5,
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "What is "},
                                         {"type": "input_text", "text": "2+3?"}]},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Let me add."}]},
            {"type": "function_call", "call_id": "c1", "name": "add", "arguments": '{"a": 2, "b": 3}'},
            {"type": "function_call_output", "call_id": "c1", "output": "5"},
            {"type": "reasoning", "id": "rs_1", "summary": []},
        ],
    }
    chat = to_chat(body)
    assert chat["messages"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "What is 2+3?"},
        {"role": "assistant", "content": "Let me add.", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "5"},
    ]
    assert chat["tools"] == [{"type": "function", "function": {
        "name": "add", "description": "add", "parameters": {"type": "object"}, "strict": False}}]
    assert (chat["tool_choice"], chat["max_tokens"], chat["logprobs"], chat["top_k"]) == ("required", 9, True, 5)
    assert not {"input", "instructions", "store", "include", "max_output_tokens", "stream"} & chat.keys()


@pytest.mark.parametrize(("body", "named"), [
    ({"input": "x", "previous_response_id": "resp_1"}, "previous_response_id"),
    ({"input": "x", "tools": [{"type": "web_search"}]}, "tools[0]"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]}, "input[0]"),
    ({"input": [{"role": "robot", "content": "x"}]}, "input[0].role"),
    ({"input": 3}, "`input`"),
])
def test_requests_it_cannot_serve_faithfully_are_refused_naming_the_field(body: dict, named: str) -> None:
    with pytest.raises(BadRequestError, match=named.replace("[", r"\[").replace("]", r"\]")):
        to_chat(body)


CHAT: dict = {
    "id": "chatcmpl-abc", "object": "chat.completion", "created": 7, "model": "m",
    "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
        "role": "assistant", "content": "Adding.", "tool_calls": [
            {"id": "c9", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}]}}],
    "usage": {"prompt_tokens": 11, "completion_tokens": 4, "total_tokens": 15},
}


def test_a_chat_completion_becomes_a_response_the_sdk_parses() -> None:
    out = Response.model_validate(to_response(CHAT, {"model": "m", "input": "x", "tools": [TOOL]}))
    message, call = out.output
    assert message.type == "message" and message.content[0].text == "Adding."
    assert (call.type, call.call_id, call.name, call.arguments) == ("function_call", "c9", "add", '{"a": 1}')
    assert (out.usage.input_tokens, out.usage.output_tokens, out.status) == (11, 4, "completed")
    cut = {**CHAT, "choices": [{**CHAT["choices"][0], "finish_reason": "length"}]}
    assert to_response(cut, {})["incomplete_details"] == {"reason": "max_output_tokens"}


def _events(raw: bytes) -> list[dict]:
    frames = [f for f in raw.decode().split("\n\n") if f]
    events = [json.loads(f.split("data: ", 1)[1]) for f in frames]
    assert all(f.startswith("event: " + e["type"] + "\n") for f, e in zip(frames, events, strict=True))
    return events


def test_chat_chunks_become_responses_events_ending_with_the_whole_response() -> None:
    """The chunks vLLM's chat route would stream for CHAT (as TITO synthesizes them) through the translator."""
    chat = {**CHAT, "choices": [{**CHAT["choices"][0], "logprobs": None, "stop_reason": None}]}
    stream = ResponsesStream({"model": "m", "stream": True}, "resp_x")
    raw = stream.start()
    for frame in tito_sse_events(chat, include_usage=True).split(b"\n\n"):
        data = frame.removeprefix(b"data: ")
        if data and data != b"[DONE]":
            raw += stream.add(json.loads(data))
    events = _events(raw + stream.finish())
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[0]["type"] == "response.created" and events[-1]["type"] == "response.completed"
    final = events[-1]["response"]
    created = events[0]["response"]["created_at"]
    assert final == {**to_response({**chat, "created": created}, {"model": "m", "stream": True}), "id": "resp_x"}
    Response.model_validate(final)
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    args = "".join(e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta")
    assert (text, args) == ("Adding.", '{"a": 1}')
    added = [e["item"]["id"] for e in events if e["type"] == "response.output_item.added"]
    assert added == [item["id"] for item in final["output"]] == ["msg_abc", "fc_abc_0"]
    assert final["usage"]["total_tokens"] == 15


def test_an_error_inside_the_chat_stream_ends_the_events_with_an_error() -> None:
    stream = ResponsesStream({"model": "m"}, "resp_y")
    stream.start()
    stream.add({"error": {"message": "the stream ended without [DONE]", "code": "upstream_stream_truncated"}})
    (event,) = _events(stream.finish())
    assert (event["type"], event["code"]) == ("error", "upstream_stream_truncated")
