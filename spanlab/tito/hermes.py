"""Hermes tool calls (``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``) from sampled text.

Why the gateway parses them itself: in TITO mode it sends the session buffer as a token-ID prompt to
vLLM's completions route, which returns plain text; the agent still expects an OpenAI chat message with
``tool_calls``. This mirrors vLLM's ``hermes`` tool parser (``Hermes2ProToolParser.extract_tool_calls``)
so an agent sees the same message in both gateway modes: the content is the text before the first
``<tool_call>`` (None when empty), ``arguments`` is ``json.dumps(arguments, ensure_ascii=False)``, a
call without its closing tag is still read to the end of the text, and any JSON error leaves the whole
text as content with no calls. Left out: ``<scratch_pad>`` and streaming (the gateway parses the
finished text only).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

TOOL_CALL_START = "<tool_call>"
_TOOL_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", re.DOTALL)


@dataclass(frozen=True)
class ParsedTurn:
    """A sampled turn as an agent sees it: ``content`` and OpenAI ``tool_calls`` (empty: none)."""

    content: str | None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)


def parse_hermes(text: str, new_call_id: Callable[[], str]) -> ParsedTurn:
    """Split ``text`` into content and tool calls the way vLLM's hermes parser does."""
    if TOOL_CALL_START not in text:
        return ParsedTurn(text)
    try:
        raw = [json.loads(closed or open_) for closed, open_ in _TOOL_CALL_RE.findall(text)]
        calls = [
            {
                "id": new_call_id(),
                "type": "function",
                "function": {"name": _name(c), "arguments": json.dumps(c["arguments"], ensure_ascii=False)},
            }
            for c in raw
        ]
    except (ValueError, KeyError, TypeError):  # vLLM logs and returns the text as content
        return ParsedTurn(text)
    content = text[: text.find(TOOL_CALL_START)]
    return ParsedTurn(content or None, calls)


def _name(call: Any) -> str:
    name = call["name"]
    if not isinstance(name, str):
        raise TypeError(f"tool call name must be a string, not {type(name).__name__}")
    return name
