"""Anthropic Messages requests as chat completion requests: pure functions on JSON dicts, no I/O.

Why translate instead of forwarding to vLLM's own ``/v1/messages``: vLLM 0.32's Messages route builds its chat
request without ``return_token_ids`` and its ``AnthropicMessagesRequest`` / ``AnthropicMessagesResponse`` have
no field for token IDs (``vllm/entrypoints/anthropic/protocol.py``), so the exact prompt and sampled IDs never
come back from it, and it has no TITO counterpart. Served as chat, a Messages call gets exactly what a chat call
gets: ``return_token_ids`` on the chat route or the attempt's TITO buffer, the engine's tool-call parser, and the
same span (``request_messages`` in chat form, so adapters, the drift report and ``tito_sessions`` read it unchanged).

The mapping follows vLLM's own (``AnthropicServingMessages.to_chat_completion_request``) so that a conversation
renders to the same prompt on both: ``system`` (a string or text blocks, joined) becomes the first system message;
a user message's ``tool_result`` blocks become ``tool`` messages (in order, before the message's text); an
assistant message's ``tool_use`` blocks become ``tool_calls`` (``input`` as a JSON string, ``json.dumps``
spacing, as the OpenAI SDKs send it); ``thinking`` becomes ``reasoning``; tools map to function tools (``strict``
kept when given), ``tool_choice`` ``auto``/``any``/``tool``/``none`` to ``auto``/``required``/a named function/
``none``; ``max_tokens``, ``temperature``, ``top_p``, ``top_k``, ``stop_sequences`` (``stop``). Anything else
not listed below is passed on (vLLM's extra fields such as ``stop_token_ids`` or ``return_token_ids``).

Refused (:class:`MessagesError`, 400, nothing forwarded or stored): a malformed body or block (named by its path,
e.g. ``messages[2].content[0]``), content other than text / tool_use / tool_result / thinking, a ``tool_result``
whose ``tool_use_id`` no earlier ``tool_use`` made, server tools (``web_search_...``), thinking turned on,
``max_tokens`` missing, not a positive integer, or over the limit the route passes in, and a boolean field that is
not ``true`` or ``false`` (``stream``, ``tools[].strict``, ``tool_choice.disable_parallel_tool_use``, and the vLLM
extras the gateway reads, ``return_token_ids`` and ``logprobs``): ``"stream": "yes"`` or ``0`` is refused, never read
by its truthiness (``null`` is the field left out).
"""

from __future__ import annotations

import json
from typing import Any

from spanlab.gateway.protocol import BadRequestError

# Messages fields with no chat meaning that can be dropped without changing what is sampled.
_DROPPED = frozenset({"metadata", "service_tier", "cache_control", "inference_geo", "speed", "user_profile_id",
                      "workspace_id", "diagnostics"})
_REFUSED = {
    "container": "code-execution containers are not supported",
    "mcp_servers": "remote MCP servers are not supported; call the tools in the agent",
    "context_management": "server-side context management is not supported",
    "output_config": "output_config is not supported",
}
_MAPPED = frozenset({"model", "messages", "system", "tools", "tool_choice", "max_tokens", "stop_sequences", "stream",
                     "thinking"})
_TOOL_CHOICES = {"auto": "auto", "any": "required", "none": "none"}
_BOOLEANS = ("stream", "return_token_ids", "logprobs")  # top-level booleans (the last two: vLLM extras passed on)


class MessagesError(BadRequestError):
    """A Messages request the gateway refuses; answered as ``{"type": "error", "error": {...}}``."""

    def __init__(self, message: str, status_code: int = 400, err_type: str = "invalid_request_error") -> None:
        super().__init__(message, status_code, code=err_type)
        self.err_type = err_type


def _object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise MessagesError(f"{where} must be an object, not {type(value).__name__}")
    return value


def _string(block: dict[str, Any], key: str, where: str) -> str:
    value = block.get(key)
    if not isinstance(value, str):
        raise MessagesError(f"{where}.{key} must be a string, not {type(value).__name__}")
    return value


def _boolean(block: dict[str, Any], key: str, where: str = "") -> bool | None:
    """A strict boolean field: ``true``/``false``, or None when absent or null; anything else is refused."""
    value = block.get(key)
    if value is not None and not isinstance(value, bool):
        raise MessagesError(f"`{where}{key}` must be true or false, not {value!r:.100}")
    return value


def _texts(content: Any, where: str) -> str:
    """Text content (a string or text blocks) as one string, blocks joined by newlines as vLLM joins them."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise MessagesError(f"{where} must be a string or a list of text blocks")
    parts = []
    for j, block in enumerate(content):
        block = _object(block, f"{where}[{j}]")
        if block.get("type") != "text":
            raise MessagesError(f"{where}[{j}]: block type {block.get('type')!r} is not supported here (text only)")
        parts.append(_string(block, "text", f"{where}[{j}]"))
    return "\n".join(parts)


def _system(system: Any) -> list[dict[str, Any]]:
    if system is None or system == "" or system == []:
        return []
    if isinstance(system, list):  # text blocks are joined without a separator, as vLLM does
        blocks = [_object(b, f"system[{j}]") for j, b in enumerate(system)]
        if any(b.get("type") != "text" for b in blocks):
            raise MessagesError("system: only text blocks are supported")
        return [{"role": "system", "content": "".join(_string(b, "text", "system[]") for b in blocks)}]
    if not isinstance(system, str):
        raise MessagesError("system must be a string or a list of text blocks")
    return [{"role": "system", "content": system}]


def _assistant(content: list[Any], where: str, calls_made: set[str]) -> dict[str, Any]:
    texts: list[str] = []
    reasoning: list[str] = []
    tool_calls: list[dict[str, Any]] = []
    for j, block in enumerate(content):
        at = f"{where}.content[{j}]"
        block = _object(block, at)
        kind = block.get("type")
        if kind == "text":
            texts.append(_string(block, "text", at))
        elif kind == "tool_use":
            call_id, name = _string(block, "id", at), _string(block, "name", at)
            arguments = _object(block.get("input"), f"{at}.input")
            calls_made.add(call_id)
            tool_calls.append({"id": call_id, "type": "function",
                               "function": {"name": name, "arguments": json.dumps(arguments)}})
        elif kind == "thinking":
            reasoning.append(_string(block, "thinking", at))
        elif kind != "redacted_thinking":
            raise MessagesError(f"{at}: block type {kind!r} is not supported in an assistant message "
                                "(text, tool_use, thinking)")
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts else None}
    if tool_calls:
        message["tool_calls"] = tool_calls
    if reasoning:
        message["reasoning"] = "".join(reasoning)
    return message


def _user(content: list[Any], where: str, calls_made: set[str]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    texts: list[str] = []
    for j, block in enumerate(content):
        at = f"{where}.content[{j}]"
        block = _object(block, at)
        kind = block.get("type")
        if kind == "text":
            texts.append(_string(block, "text", at))
        elif kind == "tool_result":
            call_id = _string(block, "tool_use_id", at)
            if call_id not in calls_made:
                raise MessagesError(f"{at}: tool_result for unknown tool_use_id {call_id!r} (no earlier "
                                    "assistant tool_use block has that id)")
            result = block.get("content")
            out.append({"role": "tool", "tool_call_id": call_id,
                        "content": "" if result is None else _texts(result, f"{at}.content")})
        else:
            raise MessagesError(f"{at}: block type {kind!r} is not supported in a user message (text, tool_result)")
    if texts:
        out.append({"role": "user", "content": "\n".join(texts)})
    return out


def _messages(messages: Any) -> list[dict[str, Any]]:
    if not isinstance(messages, list) or not messages:
        raise MessagesError("`messages` must be a non-empty list")
    out: list[dict[str, Any]] = []
    calls_made: set[str] = set()
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        message = _object(message, where)
        role, content = message.get("role"), message.get("content")
        if role not in ("user", "assistant"):
            raise MessagesError(f"{where}.role must be 'user' or 'assistant', not {role!r}")
        if isinstance(content, str):
            out.append({"role": role, "content": content})
        elif isinstance(content, list):
            if role == "assistant":
                out.append(_assistant(content, where, calls_made))
            else:
                out += _user(content, where, calls_made)
        else:
            raise MessagesError(f"{where}.content must be a string or a list of content blocks")
    return out


def _tools(tools: Any) -> list[dict[str, Any]] | None:
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise MessagesError("`tools` must be a list")
    out = []
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        tool = _object(tool, where)
        if tool.get("type") not in (None, "custom"):
            raise MessagesError(f"{where}: tool type {tool.get('type')!r} is not supported (custom tools only)")
        fn: dict[str, Any] = {"name": _string(tool, "name", where)}
        if tool.get("description") is not None:
            fn["description"] = _string(tool, "description", where)
        fn["parameters"] = _object(tool.get("input_schema"), f"{where}.input_schema")
        if (strict := _boolean(tool, "strict", f"{where}.")) is not None:
            fn["strict"] = strict
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(choice: Any, chat: dict[str, Any]) -> None:
    if choice is None:
        return
    choice = _object(choice, "tool_choice")
    kind = choice.get("type")
    if kind == "tool":
        chat["tool_choice"] = {"type": "function", "function": {"name": _string(choice, "name", "tool_choice")}}
    elif kind in _TOOL_CHOICES:
        chat["tool_choice"] = _TOOL_CHOICES[kind]
    else:
        raise MessagesError(f"tool_choice.type must be one of auto, any, tool, none, not {kind!r}")
    if _boolean(choice, "disable_parallel_tool_use", "tool_choice."):
        chat["parallel_tool_calls"] = False


def max_tokens(body: dict[str, Any], limit: int | None) -> int:
    """The request's ``max_tokens``: required, a positive integer, at most ``limit`` (the engine's context)."""
    value = body.get("max_tokens")
    if value is None:
        raise MessagesError("`max_tokens` is required")
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise MessagesError(f"`max_tokens` must be a positive integer, not {value!r}")
    if limit is not None and value > limit:
        raise MessagesError(f"`max_tokens` is {value}, over the model's limit of {limit} tokens (its context length)")
    return value


def to_chat(body: dict[str, Any], max_tokens_limit: int | None = None) -> dict[str, Any]:
    """The chat request for a Messages request; a streamed one asks for usage in its last chunk."""
    for key, why in _REFUSED.items():
        if body.get(key) is not None:
            raise MessagesError(f"`{key}` is not supported: {why}")
    thinking = body.get("thinking")
    if thinking is not None and _object(thinking, "thinking").get("type") != "disabled":
        raise MessagesError("`thinking` is not supported (only {\"type\": \"disabled\"}): the gateway records the "
                            "engine's reasoning parser output, which it cannot budget")
    for key in _BOOLEANS:
        _boolean(body, key)
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise MessagesError("`model` is required (a string)")
    chat: dict[str, Any] = {k: v for k, v in body.items() if k not in _DROPPED and k not in _MAPPED}
    chat["model"] = body["model"]
    chat["messages"] = _system(body.get("system")) + _messages(body.get("messages"))
    chat["max_tokens"] = max_tokens(body, max_tokens_limit)
    stop = body.get("stop_sequences")
    if stop is not None:
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
            raise MessagesError("`stop_sequences` must be a list of strings")
        chat["stop"] = stop
    if (tools := _tools(body.get("tools"))) is not None:
        chat["tools"] = tools
    _tool_choice(body.get("tool_choice"), chat)
    if body.get("stream"):
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    return chat
