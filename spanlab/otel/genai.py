"""GenAI semantic-convention attributes as the fields of an ``llm_call`` span (chat-form messages).

Read, newest convention first (OpenTelemetry semconv ``gen_ai.*``):

* messages: ``gen_ai.input.messages`` / ``gen_ai.output.messages`` (JSON: ``{"role", "parts": [...]}``
  with ``text``, ``tool_call``, ``tool_call_response`` and ``reasoning`` parts), ``gen_ai.system_instructions``;
  else the older flattened ``gen_ai.prompt.{i}.role|content|tool_call_id`` and
  ``gen_ai.completion.{i}.role|content|finish_reason|tool_calls.{j}.id|name|arguments``;
* the model: ``gen_ai.response.model``, else ``gen_ai.request.model``; tools: ``gen_ai.tool.definitions``;
* usage: ``gen_ai.usage.input_tokens|output_tokens`` (or the older ``prompt_tokens|completion_tokens``);
* token IDs, which no convention defines: ``spanlab.prompt_token_ids``, ``spanlab.response_token_ids``
  (integer arrays or JSON strings) and ``spanlab.response_logprobs``.

Parts that are not text, tool calls or reasoning (images, blobs) are kept as the message's ``parts``.
"""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np

from spanlab.jsonpolicy import JSONPolicyError, decode

LLM_OPERATIONS = frozenset({"chat", "text_completion", "generate_content"})
# Attributes that become first-class fields; they are not repeated in ``attributes``.
CONSUMED = frozenset({
    "gen_ai.input.messages", "gen_ai.output.messages", "gen_ai.system_instructions", "gen_ai.tool.definitions",
    "spanlab.prompt_token_ids", "spanlab.response_token_ids", "spanlab.response_logprobs",
})
_FLAT = re.compile(r"^gen_ai\.(prompt|completion)\.(\d+)\.(.+)$")


def consumed(key: str) -> bool:
    """Whether an attribute became a first-class field (then it is not repeated in ``attributes``)."""
    return key in CONSUMED or _FLAT.match(key) is not None


def _json(value: Any) -> Any:
    """An attribute that may hold JSON text, decoded by the policy; text that is not (accepted) JSON stays text."""
    if isinstance(value, str):
        try:
            return decode(value)
        except JSONPolicyError:
            return value
    return value


def _messages(attrs: dict[str, Any], key: str) -> list[dict[str, Any]]:
    """A semconv messages attribute (JSON text or an array of maps) as chat messages; ``ValueError`` naming
    ``key`` for anything else (text that is not JSON, JSON nested too deep, a list of non-objects)."""
    value = attrs.get(key)
    if isinstance(value, str):
        try:
            value = decode(value, what=key)
        except JSONPolicyError as exc:
            raise ValueError(str(exc)) from None
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(m, dict) for m in value):
        raise ValueError(f"{key} must be a JSON list of message objects, not {str(value)[:80]!r}")
    return [_chat_message(m) for m in value]


def is_llm_call(attrs: dict[str, Any]) -> bool:
    op = attrs.get("gen_ai.operation.name")
    if op is not None:
        return op in LLM_OPERATIONS
    return "gen_ai.request.model" in attrs or "gen_ai.input.messages" in attrs or "gen_ai.prompt.0.role" in attrs


def _arguments(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _chat_message(message: dict[str, Any]) -> dict[str, Any]:
    """One semconv message (``role`` + ``parts``) in chat form."""
    out: dict[str, Any] = {"role": message.get("role", "user")}
    texts: list[str] = []
    other: list[Any] = []
    for part in message.get("parts") or ():
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text":
            texts.append(str(part.get("content") or ""))
        elif kind == "tool_call":
            out.setdefault("tool_calls", []).append({"id": part.get("id"), "type": "function", "function": {
                "name": part.get("name"), "arguments": _arguments(part.get("arguments") or {})}})
        elif kind == "tool_call_response":
            out["role"] = "tool"
            out["tool_call_id"] = part.get("id")
            response = part.get("response")
            texts.append(response if isinstance(response, str) else json.dumps(response))
        elif kind == "reasoning":
            out["reasoning"] = str(part.get("content") or "")
        else:
            other.append(part)
    out["content"] = "".join(texts) if texts else None
    if other:
        out["parts"] = other
    if message.get("finish_reason") is not None:
        out["finish_reason"] = message["finish_reason"]
    return out


def _flat_messages(attrs: dict[str, Any], which: str) -> list[dict[str, Any]]:
    """The older ``gen_ai.prompt.{i}.*`` / ``gen_ai.completion.{i}.*`` attributes, as chat messages."""
    found: dict[int, dict[str, Any]] = {}
    for key, value in attrs.items():
        m = _FLAT.match(key)
        if m is None or m.group(1) != which:
            continue
        message = found.setdefault(int(m.group(2)), {})
        field = m.group(3)
        if field.startswith("tool_calls."):
            _, j, name = field.split(".", 2)
            calls = message.setdefault("_calls", {})
            call = calls.setdefault(int(j), {"id": None, "type": "function", "function": {}})
            if name == "id":
                call["id"] = value
            elif name in ("name", "arguments"):
                call["function"][name] = value if name == "name" else _arguments(value)
        else:
            message[field] = value
    out = []
    for i in sorted(found):
        message = found[i]
        if calls := message.pop("_calls", None):
            message["tool_calls"] = [calls[j] for j in sorted(calls)]
        message.setdefault("role", "assistant" if which == "completion" else "user")
        message.setdefault("content", None)
        out.append(message)
    return out


def _ids(key: str, value: Any, dtype: type) -> np.ndarray | None:
    """A token-ID (or logprob) attribute as a NumPy array: the store checks arrays without per-element Python."""
    value = _json(value)
    if value is None:
        return None
    try:
        arr = np.asarray(value)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{key} is not a list of numbers: {str(value)[:80]!r}") from exc
    kinds = "iu" if dtype is np.int64 else "iuf"
    if arr.size and (arr.ndim != 1 or arr.dtype.kind not in kinds):
        what = "integers" if kinds == "iu" else "numbers"
        raise ValueError(f"{key} must be a flat list of {what}, not {str(value)[:80]!r}")
    return arr.astype(dtype)


def llm_fields(attrs: dict[str, Any]) -> dict[str, Any]:
    """The ``LLMCall`` keyword arguments of a GenAI span (validated by ``LLMCall`` itself)."""
    if "gen_ai.input.messages" in attrs or "gen_ai.output.messages" in attrs:
        request = _messages(attrs, "gen_ai.input.messages")
        outputs = _messages(attrs, "gen_ai.output.messages")
    else:
        request, outputs = _flat_messages(attrs, "prompt"), _flat_messages(attrs, "completion")
    if system := _json(attrs.get("gen_ai.system_instructions")):
        parts = system if isinstance(system, list) else [{"type": "text", "content": str(system)}]
        request.insert(0, _chat_message({"role": "system", "parts": parts}))
    response = outputs[0] if outputs else None
    finish = response.pop("finish_reason", None) if response else None
    if finish is None and (reasons := attrs.get("gen_ai.response.finish_reasons")):
        finish = reasons[0] if isinstance(reasons, list) else str(reasons)
    fields: dict[str, Any] = {
        "model": str(attrs.get("gen_ai.response.model") or attrs.get("gen_ai.request.model") or ""),
        "request_messages": request, "response_message": response, "finish_reason": finish,
        "request_tools": _json(attrs.get("gen_ai.tool.definitions")),
    }
    for key, dtype in (("prompt_token_ids", np.int64), ("response_token_ids", np.int64),
                       ("response_logprobs", np.float32)):
        if (ids := _ids(f"spanlab.{key}", attrs.get(f"spanlab.{key}"), dtype)) is not None:
            fields[key] = ids
    inputs = attrs.get("gen_ai.usage.input_tokens", attrs.get("gen_ai.usage.prompt_tokens"))
    outputs_n = attrs.get("gen_ai.usage.output_tokens", attrs.get("gen_ai.usage.completion_tokens"))
    if inputs is not None or outputs_n is not None:
        p, c = int(inputs or 0), int(outputs_n or 0)
        fields["usage"] = {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}
    return fields
