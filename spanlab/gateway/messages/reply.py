"""Chat completions as Anthropic ``message`` objects, and errors in the Messages API's shape: pure functions.

A chat choice maps to content blocks in the order the Messages API uses (``thinking``, ``text``, then one
``tool_use`` per call, its ``input`` the parsed arguments), ``finish_reason`` to ``stop_reason`` the way vLLM's
own Messages route maps it (``length`` -> ``max_tokens``, a matched stop string -> ``stop_sequence``, tool calls
-> ``tool_use``, else ``end_turn``), and usage to ``input_tokens`` / ``output_tokens`` (the recorded ID counts:
``output_tokens`` includes the stop token). Every error the agent gets from this route, the gateway's own
refusals and the engine's, is ``{"type": "error", "error": {"type", "message"}}`` with the status it had.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

from spanlab.gateway.protocol import dumps, loads

# The Messages API's error type per HTTP status (docs.anthropic.com/en/api/errors).
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 413: "request_too_large", 422: "invalid_request_error",
               429: "rate_limit_error", 529: "overloaded_error"}


_MESSAGES_PATH = re.compile(r"(^|/)v1/messages(/|$)")


def is_messages_path(path: str) -> bool:
    """Whether a request path is on the Messages API (``/v1/messages`` and below, under any attribution prefix):
    every answer there, the gateway's refusals and unknown routes included, is in Anthropic's error shape."""
    return _MESSAGES_PATH.search(path) is not None


class ToolArgumentsError(ValueError):
    """The engine's tool call has arguments that are not a JSON object, which a ``tool_use`` block cannot hold."""


def error_type(status: int) -> str:
    return ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")


def error_body(message: str, status: int, err_type: str | None = None) -> bytes:
    return dumps({"type": "error", "error": {"type": err_type or error_type(status), "message": message}})


def from_openai_error(content: bytes, status: int) -> bytes:
    """An OpenAI-shaped (or vLLM, or plain) error body as a Messages error with the same message."""
    try:
        body: Any = loads(content)
    except ValueError:
        body = None
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict) and error.get("message"):
        message = str(error["message"])
    elif isinstance(body, dict) and body.get("detail"):
        message = str(body["detail"])
    else:
        message = content[:2000].decode("utf-8", "replace") or f"HTTP {status}"
    return error_body(message, status)


def stop_reason(finish_reason: str | None, stop: Any, tool_used: bool) -> tuple[str | None, str | None]:
    """``(stop_reason, stop_sequence)`` for a chat choice's ``finish_reason`` and vLLM's ``stop_reason``."""
    if finish_reason == "length":
        return "max_tokens", None
    if tool_used or finish_reason == "tool_calls":
        return "tool_use", None
    if isinstance(stop, str):  # vLLM reports the matched stop string here (a stop token is an int)
        return "stop_sequence", stop
    return ("end_turn", None) if finish_reason is not None else (None, None)


def tool_input(arguments: str | None) -> dict[str, Any]:
    try:
        value = json.loads(arguments or "{}")
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise ToolArgumentsError(f"the model's tool-call arguments are not a JSON object: {arguments!r:.200}")
    return value


def usage(chat_usage: dict[str, Any] | None) -> dict[str, int]:
    chat_usage = chat_usage or {}
    return {"input_tokens": int(chat_usage.get("prompt_tokens") or 0),
            "output_tokens": int(chat_usage.get("completion_tokens") or 0)}


def message_id(chat_id: Any) -> str:
    """``msg_`` + the chat completion's ID suffix (the tool-call and message IDs stay traceable to the span)."""
    return "msg_" + str(chat_id or f"{time.time_ns():x}").removeprefix("chatcmpl-")


def content_blocks(message: dict[str, Any]) -> list[dict[str, Any]]:
    """The content of a chat message as Messages blocks; an empty answer is one empty text block (as vLLM's)."""
    blocks: list[dict[str, Any]] = []
    if reasoning := message.get("reasoning") or message.get("reasoning_content"):
        blocks.append({"type": "thinking", "thinking": reasoning, "signature": ""})
    if message.get("content"):
        blocks.append({"type": "text", "text": message["content"]})
    for call in message.get("tool_calls") or ():
        fn = call.get("function") or {}
        blocks.append({"type": "tool_use", "id": call.get("id"), "name": fn.get("name"),
                       "input": tool_input(fn.get("arguments"))})
    return blocks or [{"type": "text", "text": ""}]


def to_message(chat: dict[str, Any], body: dict[str, Any], message_name: str) -> dict[str, Any]:
    """A chat.completion as the ``message`` object the Messages API returns (``message_name``: its ``id``)."""
    choice = (chat.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    reason, sequence = stop_reason(choice.get("finish_reason"), choice.get("stop_reason"),
                                   bool(message.get("tool_calls")))
    reply: dict[str, Any] = {
        "id": message_name, "type": "message", "role": "assistant", "model": chat.get("model") or body.get("model"),
        "content": content_blocks(message), "stop_reason": reason, "stop_sequence": sequence,
        "usage": usage(chat.get("usage")),
    }
    if "prompt_token_ids" in chat:  # the agent asked for token IDs itself (return_token_ids)
        reply["prompt_token_ids"] = chat["prompt_token_ids"]
        reply["output_token_ids"] = choice.get("token_ids")
    return reply
