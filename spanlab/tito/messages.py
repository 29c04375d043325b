"""Chat messages in the form vLLM hands them to the chat template, for renders that must match the engine's.

Why: vLLM normalizes messages before the template sees them, and a local render must do the same, or a delta
or re-render would differ from the engine's (or fail where the engine's succeeds) for no real reason:

* each assistant tool call's JSON-string ``arguments`` becomes an object
  (``vllm/renderers/chat_utils.py::_postprocess_messages``; malformed JSON becomes ``{}``), so a template
  writes them with its own ``tojson`` spacing;
* a ``content`` that is ``None`` or missing becomes ``""`` (``_parse_chat_message_content``: None -> no parts
  -> the parts joined, for templates that take content as a string). Qwen3's template, for one, tests
  ``'</think>' in message.content`` and cannot render a tool-call turn whose content is None.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

Message = dict[str, Any]


def engine_form(messages: Sequence[Message]) -> list[Message]:
    """Messages the way vLLM hands them to the template: JSON-string tool-call arguments become objects, and
    a None or missing ``content`` becomes ``""``.

    (vLLM's ``_parse_chat_message_content`` and ``_postprocess_messages``, "string" content format.) Every
    local render goes through it (:func:`~spanlab.tito.render.render_ids`), so the fallback path renders new
    messages the way the engine would have. Idempotent. Not mirrored: templates vLLM detects as taking
    OpenAI content parts (it then hands them lists); the fallback renders those with string content.
    """
    out = []
    for message in messages:
        if not isinstance(message, dict):
            out.append(message)
            continue
        calls = message.get("tool_calls")
        if message.get("role") == "assistant" and isinstance(calls, list) and calls:
            message = {**message, "tool_calls": [_dict_arguments(c) for c in calls]}
        if message.get("content") is None:
            message = {**message, "content": ""}
        out.append(message)
    return out


def _dict_arguments(call: Any) -> Any:
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("arguments"), str):
        return call
    try:
        parsed = json.loads(fn["arguments"]) if fn["arguments"] else {}
    except ValueError:
        parsed = {}
    return {**call, "function": {**fn, "arguments": parsed if isinstance(parsed, dict) else {}}}
