"""The answer agent's optional tools: the calc agent's MCP calculator (a stdio subprocess), offered as an OpenAI
function tool, and the chat loop that runs its calls until the model answers in text."""

from __future__ import annotations

import json
import logging
from typing import Any

from openai import AsyncOpenAI

logger = logging.getLogger(__name__)

TOOLS = ("calculator",)  # what ``tools:`` may name


def openai_tools(server_tools: list[Any]) -> list[dict[str, Any]]:
    """The MCP server's tools as OpenAI chat tools (name, description, input schema as the server lists them)."""
    return [{"type": "function", "function": {"name": t.name, "description": t.description or "",
                                              "parameters": dict(t.input_schema)}} for t in server_tools]


async def call_tool(server: Any, name: str, arguments: str) -> str:
    """One call's result text; a bad call returns an error the model can read (it is not the rollout's end)."""
    try:
        args = json.loads(arguments or "{}")
        if not isinstance(args, dict):
            raise ValueError("arguments must be a JSON object")
    except ValueError as exc:
        return f"error: {name}: {exc}"
    result = await server.call_tool(name, args)
    text = "".join(item.text for item in result.content if item.type == "text")
    return f"error: {text}" if result.is_error else text


async def chat_with_tools(client: AsyncOpenAI, server: Any, messages: list[dict[str, Any]], *, max_turns: int,
                          **create: Any) -> tuple[str | None, list[dict[str, str]]]:
    """The final text after at most ``max_turns`` model calls (None: the last call still asked for a tool) and
    the tool calls made, each as ``{tool, arguments, result}``."""
    tools = openai_tools(await server.list_tools())
    names = {t["function"]["name"] for t in tools}
    calls: list[dict[str, str]] = []
    for turn in range(max_turns):
        last = turn == max_turns - 1
        response = await client.chat.completions.create(messages=messages, tools=tools,
                                                        tool_choice="none" if last else "auto", **create)
        msg = response.choices[0].message
        if not msg.tool_calls or last:
            return msg.content, calls
        messages.append(msg.model_dump(include={"role", "content", "tool_calls"}, exclude_none=True))
        for call in msg.tool_calls:
            name = call.function.name
            result = await call_tool(server, name, call.function.arguments) if name in names else \
                f"error: unknown tool {name!r}; tools: {', '.join(sorted(names))}"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
            calls.append({"tool": name, "arguments": call.function.arguments, "result": result})
    return None, calls
