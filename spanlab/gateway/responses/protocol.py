"""The OpenAI Responses API as chat completions, and back: pure functions on JSON dicts, no I/O.

Why translate instead of forwarding to vLLM's own ``/v1/responses``: vLLM 0.32 returns token IDs there
only as ``input_messages``/``output_messages`` with ``enable_response_messages`` (not for background
requests), and its Responses route has no TITO counterpart. Served as chat, a Responses call gets exactly
what a chat call gets: ``return_token_ids`` on the chat route, or the attempt's TITO buffer, the hermes
tool-call parse, and the same span (``request_messages`` in chat form, so adapters and ``tito_sessions``
read it unchanged).

What maps: ``instructions`` (a system message first), ``input`` as a string or a list of items (messages
with text parts, ``function_call``, ``function_call_output``; ``reasoning`` items are dropped), function
tools, ``tool_choice``, ``max_output_tokens``, sampling parameters, ``text.format`` json_schema, and
``include: ["message.output_text.logprobs"]``. Unknown keys are passed on (vLLM's extra sampling fields,
``extra_body``). What is refused with a 400 naming the field: ``previous_response_id`` and ``conversation``
(the gateway keeps no response state: send the whole input), ``background``, stored ``prompt`` templates,
non-function tools and non-text content.
"""

from __future__ import annotations

import time
from typing import Any

from spanlab.gateway.protocol import BadRequestError

LOGPROBS_INCLUDE = "message.output_text.logprobs"
# Responses fields with no chat meaning that can be dropped without changing what is sampled.
_DROPPED = frozenset({"store", "metadata", "reasoning", "truncation", "user", "service_tier", "prompt_cache_key",
                      "prompt_cache_retention", "safety_identifier", "stream_options", "include", "text",
                      "max_tool_calls", "context_management"})
_REFUSED = {
    "previous_response_id": "the gateway keeps no response state; send the whole conversation as `input`",
    "conversation": "the gateway keeps no conversations; send the whole conversation as `input`",
    "background": "background responses are not supported",
    "prompt": "stored prompt templates are not supported",
}
_ROLES = {"user": "user", "system": "system", "developer": "system", "assistant": "assistant"}


def _text(content: Any, where: str) -> str:
    """A message's content as one string (text parts joined), else a 400 naming where."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise BadRequestError(f"{where}.content must be a string or a list of text parts")
    texts = []
    for part in content:
        if not isinstance(part, dict) or part.get("type") not in ("input_text", "output_text", "text"):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise BadRequestError(f"{where}: content part {kind!r} is not supported (text only)")
        texts.append(str(part.get("text") or ""))
    return "".join(texts)


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    if body.get("instructions"):
        messages.append({"role": "system", "content": str(body["instructions"])})
    items = body.get("input")
    if isinstance(items, str):
        return [*messages, {"role": "user", "content": items}]
    if not isinstance(items, list):
        raise BadRequestError("`input` must be a string or a list of items")
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise BadRequestError(f"{where} must be an object")
        kind = item.get("type", "message")
        if kind == "message":
            role = _ROLES.get(item.get("role"))
            if role is None:
                raise BadRequestError(f"{where}.role must be one of {sorted(_ROLES)}, not {item.get('role')!r}")
            messages.append({"role": role, "content": _text(item.get("content"), where)})
        elif kind == "function_call":
            call = {"id": item.get("call_id"), "type": "function",
                    "function": {"name": item.get("name"), "arguments": item.get("arguments") or "{}"}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)  # the text and calls of one turn: one message
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            messages.append({"role": "tool", "tool_call_id": item.get("call_id"),
                             "content": output if isinstance(output, str) else _text(output, where)})
        elif kind == "reasoning":
            continue
        else:
            raise BadRequestError(f"{where}: input items of type {kind!r} are not supported")
    return messages


def _tools(tools: Any) -> list[dict[str, Any]] | None:
    if not tools:
        return None
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else type(tool).__name__
            raise BadRequestError(f"tools[{i}]: tool type {kind!r} is not supported (function tools only)")
        fn = {k: tool[k] for k in ("name", "description", "parameters", "strict") if tool.get(k) is not None}
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(choice: Any) -> Any:
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    if choice is not None and choice not in ("auto", "none", "required"):
        raise BadRequestError(f"tool_choice {choice!r} is not supported (auto, none, required or a function)")
    return choice


def to_chat(body: dict[str, Any]) -> dict[str, Any]:
    """The chat request; a streamed one asks for usage in its last chunk (the response carries it)."""
    for key, why in _REFUSED.items():
        if body.get(key):
            raise BadRequestError(f"`{key}` is not supported: {why}", code="unsupported_parameter")
    chat: dict[str, Any] = {k: v for k, v in body.items()
                            if k not in _DROPPED and k not in _REFUSED and k not in ("input", "instructions")}
    chat["messages"] = _messages(body)
    for key in ("tools", "tool_choice", "max_output_tokens", "top_logprobs"):
        chat.pop(key, None)
    if body.get("stream"):
        chat["stream_options"] = {"include_usage": True}
    if (tools := _tools(body.get("tools"))) is not None:
        chat["tools"] = tools
    if (choice := _tool_choice(body.get("tool_choice"))) is not None:
        chat["tool_choice"] = choice
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = body["max_output_tokens"]
    if LOGPROBS_INCLUDE in (body.get("include") or ()):
        chat["logprobs"] = True
        chat["top_logprobs"] = int(body.get("top_logprobs") or 0)
    fmt = (body.get("text") or {}).get("format") if isinstance(body.get("text"), dict) else None
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        chat["response_format"] = {"type": "json_schema", "json_schema": {
            k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}}
    elif isinstance(fmt, dict) and fmt.get("type") == "json_object":
        chat["response_format"] = {"type": "json_object"}
    return chat


def _usage(usage: dict[str, Any] | None) -> dict[str, Any]:
    usage = usage or {}
    prompt, completion = int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
    return {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": completion, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + completion}


def _logprobs(lp: dict[str, Any] | None) -> list[dict[str, Any]]:
    return [{"token": e["token"], "bytes": e.get("bytes") or [], "logprob": e["logprob"],
             "top_logprobs": e.get("top_logprobs") or []} for e in ((lp or {}).get("content") or ())]


def base_id(chat_id: Any) -> str:
    """The suffix of a chat completion's ID that names its output items (``msg_``, ``fc_``, ``rs_`` + it)."""
    return str(chat_id or f"{time.time_ns():x}").removeprefix("chatcmpl-")


def to_response(chat: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
    """A chat.completion as the ``response`` object the Responses API returns."""
    choice = (chat.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    base = base_id(chat.get("id"))
    output: list[dict[str, Any]] = []
    if reasoning := message.get("reasoning") or message.get("reasoning_content"):
        output.append({"type": "reasoning", "id": f"rs_{base}", "summary": [],
                       "content": [{"type": "reasoning_text", "text": reasoning}]})
    if message.get("content"):
        part = {"type": "output_text", "text": message["content"], "annotations": [],
                "logprobs": _logprobs(choice.get("logprobs"))}
        output.append({"type": "message", "id": f"msg_{base}", "role": "assistant", "status": "completed",
                       "content": [part]})
    for i, call in enumerate(message.get("tool_calls") or ()):
        fn = call.get("function") or {}
        output.append({"type": "function_call", "id": f"fc_{base}_{i}", "call_id": call.get("id"),
                       "name": fn.get("name"), "arguments": fn.get("arguments") or "", "status": "completed"})
    cut = choice.get("finish_reason") == "length"
    response: dict[str, Any] = {
        "id": f"resp_{base}", "object": "response", "created_at": chat.get("created") or int(time.time()),
        "model": chat.get("model") or body.get("model"), "status": "incomplete" if cut else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None, "error": None,
        "instructions": body.get("instructions"), "output": output,
        "parallel_tool_calls": body.get("parallel_tool_calls", True), "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools") or [], "temperature": body.get("temperature"), "top_p": body.get("top_p"),
        "max_output_tokens": body.get("max_output_tokens"), "metadata": body.get("metadata") or {},
        "text": body.get("text") or {"format": {"type": "text"}}, "truncation": "disabled",
        "usage": _usage(chat.get("usage")),
    }
    if "prompt_token_ids" in chat:  # the agent asked for token IDs itself (return_token_ids)
        response["prompt_token_ids"] = chat["prompt_token_ids"]
        response["output_token_ids"] = choice.get("token_ids")
    return response
