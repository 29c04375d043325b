"""The Messages <-> chat translation without an engine: requests against vLLM's own Messages -> chat conversion
(so a conversation renders to the prompt vLLM's ``/v1/messages`` would use), answers and stream events against the
``anthropic`` SDK's own types and stream fold, and the refusals (each names what is wrong)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from anthropic.lib.streaming._messages import accumulate_event
from anthropic.types import Message, RawMessageStreamEvent
from pydantic import TypeAdapter

from spanlab.gateway.messages.protocol import MessagesError, to_chat
from spanlab.gateway.messages.reply import ToolArgumentsError, from_openai_error, to_message
from spanlab.gateway.messages.stream import MessagesStream

TOOL = {"name": "add", "description": "Add two integers.",
        "input_schema": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}
CONVERSATION = {
    "model": "m", "max_tokens": 30, "temperature": 0.5, "top_p": 0.9, "top_k": 5, "stop_sequences": ["\n\n"],
    "system": [{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}],
    "tools": [TOOL], "tool_choice": {"type": "tool", "name": "add", "disable_parallel_tool_use": True},
    "messages": [
        {"role": "user", "content": "What is 2+3?"},
        {"role": "assistant", "content": [{"type": "text", "text": "Let me add."},
                                          {"type": "tool_use", "id": "t1", "name": "add", "input": {"a": 2, "b": 3}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text",
                                                                                              "text": "5"}]},
                                     {"type": "text", "text": "And now?"}]},
    ],
}


def test_a_conversation_maps_as_vllms_own_messages_route_maps_it() -> None:
    pytest.importorskip("vllm")
    from vllm.entrypoints.anthropic.protocol import AnthropicMessagesRequest
    from vllm.entrypoints.anthropic.serving import AnthropicServingMessages

    ref = AnthropicServingMessages.to_chat_completion_request(AnthropicMessagesRequest(**CONVERSATION))
    chat = to_chat(CONVERSATION)
    assert chat["messages"] == ref.messages  # same roles, contents, tool calls and JSON argument strings
    assert [t["function"] for t in chat["tools"]] == [t.function.model_dump(exclude_none=True) for t in ref.tools]
    assert chat["tool_choice"] == ref.tool_choice.model_dump() == {"type": "function", "function": {"name": "add"}}
    assert chat["parallel_tool_calls"] is ref.parallel_tool_calls is False
    assert (chat["max_tokens"], chat["stop"], chat["temperature"], chat["top_p"], chat["top_k"]) == \
           (ref.max_tokens, ref.stop, ref.temperature, ref.top_p, ref.top_k)


def test_streaming_asks_for_usage_and_unknown_fields_pass_on() -> None:
    chat = to_chat({"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}], "stream": True,
                    "metadata": {"user_id": "u"}, "stop_token_ids": [2], "return_token_ids": True})
    assert chat == {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}], "stream": True,
                    "stream_options": {"include_usage": True}, "stop_token_ids": [2], "return_token_ids": True}


@pytest.mark.parametrize(("change", "needle"), [
    ({"max_tokens": None}, "`max_tokens` is required"),
    ({"max_tokens": 0}, "`max_tokens` must be a positive integer"),
    ({"max_tokens": "8"}, "`max_tokens` must be a positive integer"),
    ({"max_tokens": 4097}, "over the model's limit of 4096"),
    ({"messages": []}, "`messages` must be a non-empty list"),
    ({"messages": [{"role": "system", "content": "x"}]}, "messages[0].role must be 'user' or 'assistant'"),
    ({"messages": [{"role": "user", "content": [{"type": "text"}]}]}, "messages[0].content[0].text must be a string"),
    ({"messages": [{"role": "user", "content": ["hi"]}]}, "messages[0].content[0] must be an object"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "block type 'image'"),
    ({"messages": [{"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "add", "input": "{}"}]}]},
     "messages[0].content[0].input must be an object"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "nope", "content": "5"}]}]},
     "tool_result for unknown tool_use_id 'nope'"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tool type 'web_search_20250305'"),
    ({"tools": [{"name": "add"}]}, "tools[0].input_schema must be an object"),
    ({"tool_choice": {"type": "sometimes"}}, "tool_choice.type must be one of"),
    ({"thinking": {"type": "enabled", "budget_tokens": 10}}, "`thinking` is not supported"),
    ({"stop_sequences": "\n"}, "`stop_sequences` must be a list of strings"),
    ({"mcp_servers": [{"url": "x"}]}, "`mcp_servers` is not supported"),
])
def test_refusals_name_what_is_wrong(change: dict[str, Any], needle: str) -> None:
    body = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]} | change
    body = {k: v for k, v in body.items() if v is not None}
    with pytest.raises(MessagesError) as err:
        to_chat(body, max_tokens_limit=4096)
    assert needle in str(err.value) and err.value.status_code == 400


def _chat(message: dict[str, Any], finish: str, stop: Any = None) -> dict[str, Any]:
    return {"id": "chatcmpl-abc", "model": "m", "usage": {"prompt_tokens": 11, "completion_tokens": 7},
            "choices": [{"index": 0, "message": message, "finish_reason": finish, "stop_reason": stop}]}


@pytest.mark.parametrize(("message", "finish", "stop", "reason", "sequence"), [
    ({"role": "assistant", "content": "Hi."}, "stop", None, "end_turn", None),
    ({"role": "assistant", "content": "Hi"}, "length", None, "max_tokens", None),
    ({"role": "assistant", "content": "Hi"}, "stop", "\n\n", "stop_sequence", "\n\n"),
    ({"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}]},
     "tool_calls", None, "tool_use", None),
    ({"role": "assistant", "content": ""}, "stop", 2, "end_turn", None),
])
def test_a_chat_completion_is_an_sdk_message(message: dict[str, Any], finish: str, stop: Any, reason: str,
                                             sequence: str | None) -> None:
    reply = Message.model_validate(to_message(_chat(message, finish, stop), {"model": "m"}, "msg_1"))
    assert (reply.id, reply.stop_reason, reply.stop_sequence) == ("msg_1", reason, sequence)
    assert (reply.usage.input_tokens, reply.usage.output_tokens) == (11, 7)
    if message.get("tool_calls"):
        (block,) = reply.content
        assert (block.type, block.id, block.name, block.input) == ("tool_use", "c1", "add", {"a": 1})
    else:
        assert [b.model_dump(exclude_none=True) for b in reply.content] == [
            {"type": "text", "text": message["content"] or ""}]


def test_tool_arguments_that_are_no_object_are_an_error_not_a_guess() -> None:
    bad = {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "function": {"name": "f",
                                                                                          "arguments": "[1]"}}]}
    with pytest.raises(ToolArgumentsError):
        to_message(_chat(bad, "tool_calls"), {}, "msg_1")


def test_engine_errors_become_messages_errors() -> None:
    body = json.loads(from_openai_error(b'{"error": {"message": "too long", "type": "BadRequestError"}}', 400))
    assert body == {"type": "error", "error": {"type": "invalid_request_error", "message": "too long"}}
    assert json.loads(from_openai_error(b"gateway down", 502))["error"] == {"type": "api_error",
                                                                             "message": "gateway down"}


def _chunks() -> list[dict[str, Any]]:
    """A vLLM-shaped chat stream: text, then a tool call whose arguments arrive in pieces, then usage."""
    def chunk(delta: dict[str, Any], **extra: Any) -> dict[str, Any]:
        return {"id": "chatcmpl-abc", "model": "m", "choices": [{"index": 0, "delta": delta, **extra}]}
    call = {"index": 0, "id": "c1", "type": "function", "function": {"name": "add", "arguments": ""}}
    return [chunk({"role": "assistant", "content": ""}), chunk({"content": "Let me"}), chunk({"content": " add."}),
            chunk({"tool_calls": [call]}), chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"a": '}}]}),
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": "1}"}}]}),
            chunk({}, finish_reason="tool_calls", stop_reason=None),
            {"id": "chatcmpl-abc", "model": "m", "choices": [], "usage": {"prompt_tokens": 11, "completion_tokens": 7}}]


def _events(raw: bytes) -> list[dict[str, Any]]:
    events = []
    for frame in raw.split(b"\n\n"):
        if frame:
            name, data = frame.split(b"\n")
            event = json.loads(data.removeprefix(b"data: "))
            assert name == b"event: " + event["type"].encode()
            events.append(event)
    return events


def test_a_chat_stream_becomes_the_events_the_sdk_folds_into_the_same_message() -> None:
    stream = MessagesStream({"model": "m"}, "msg_1")
    raw = stream.start() + b"".join(stream.add(c) for c in _chunks()) + stream.finish()
    events = _events(raw)
    assert [e["type"] for e in events] == [
        "message_start", "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",
        "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop", "message_delta",
        "message_stop"]
    adapter: TypeAdapter[Any] = TypeAdapter(RawMessageStreamEvent)
    snapshot, bufs = None, {}
    for event in events:
        snapshot = accumulate_event(event=adapter.validate_python(event), current_snapshot=snapshot, json_bufs=bufs)
    whole = _chat({"role": "assistant", "content": "Let me add.", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}]}, "tool_calls")
    assert snapshot is not None
    assert snapshot.model_dump(exclude_none=True) == Message.model_validate(
        to_message(whole, {"model": "m"}, "msg_1")).model_dump(exclude_none=True)


def test_an_error_inside_the_chat_stream_ends_with_an_error_event() -> None:
    stream = MessagesStream({"model": "m"}, "msg_1")
    raw = stream.start() + stream.add(_chunks()[1]) + stream.add({"error": {"message": "engine died", "code": 500}})
    raw += stream.finish()
    assert _events(raw)[-1] == {"type": "error", "error": {"type": "api_error", "message": "engine died"}}


def test_an_empty_stream_still_has_one_text_block() -> None:
    stream = MessagesStream({"model": "m"}, "msg_1")
    raw = stream.start() + stream.add(_chunks()[-2]) + stream.finish()
    assert [e["type"] for e in _events(raw)][1:4] == ["content_block_start", "content_block_stop", "message_delta"]
