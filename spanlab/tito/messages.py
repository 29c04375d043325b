"""Chat messages in the form vLLM hands them to the chat template, for renders that must match the engine's.

Why: vLLM parses each assistant tool call's JSON-string ``arguments`` into an object before rendering
(``vllm/renderers/chat_utils.py::_postprocess_messages``; malformed JSON becomes ``{}``), so a template
writes them with its own ``tojson`` spacing. A render here must do the same, or a delta or re-render would
differ from the engine's for no real reason.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

Message = dict[str, Any]


def engine_form(messages: Sequence[Message]) -> list[Message]:
    """Messages the way vLLM hands them to the template: JSON-string tool-call arguments become objects.

    (vLLM's ``_postprocess_messages``.) Used for the local delta renders, so a delta renders new messages
    the way the engine would have.
    """
    out = []
    for message in messages:
        calls = message.get("tool_calls") if isinstance(message, dict) else None
        if message.get("role") == "assistant" and isinstance(calls, list) and calls:
            message = {**message, "tool_calls": [_dict_arguments(c) for c in calls]}
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
