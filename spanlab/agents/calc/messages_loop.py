"""The calc agent's model loop on the Anthropic Messages API: the ``anthropic`` SDK pointed at spanlab's gateway.

``CalcAgent(api="messages")`` runs this loop instead of the OpenAI Agents SDK's: each model call is
``AsyncAnthropic(base_url=<the gateway's attributed URL>).messages.create`` with the calculator as an Anthropic
tool (its name, description and input schema as the MCP server lists them), each ``tool_use`` block is sent to
the same MCP calculator process the chat agent uses (``MCPServerStdio.call_tool``), and its result goes back as a
``tool_result`` block, until the model answers in text or ``max_turns`` calls were made. The gateway serves
``/v1/messages`` over its chat path, so the spans are ordinary ``llm_call`` spans with the exact IDs the engine
sampled, and the conversation renders to the prompts the chat agent's SDK sends (the tool declared with the same
``strict`` flag; ``tests/agents/test_calc_messages.py`` checks it token for token), so the warm start's
demonstrations (:mod:`spanlab.agents.calc.demos`) teach this agent too.

Left out: streaming (the agent needs only the final message), parallel tool use (each call is run in order).
The token travels as the SDK's ``auth_token`` (``Authorization: Bearer``), which the gateway's token check reads.
"""

from __future__ import annotations

import logging
from typing import Any

from agents.mcp import MCPServerStdio
from anthropic import AsyncAnthropic
from anthropic.types import Message

logger = logging.getLogger(__name__)


class NoFinalAnswer(RuntimeError):
    """The loop ended without a text answer: ``max_turns`` calls made, or a call to a tool the agent lacks."""


def anthropic_tools(server_tools: list[Any], strict: bool) -> list[dict[str, Any]]:
    """The MCP tools as Anthropic tools, as the Agents SDK converts them for chat (``strict`` adds
    ``additionalProperties: false``), so the engine renders the same tools list for both agents."""
    tools = []
    for tool in server_tools:
        schema = dict(tool.input_schema)
        schema.setdefault("properties", {})
        if strict:
            schema["additionalProperties"] = False
        tools.append({"name": tool.name, "description": tool.description or "", "input_schema": schema,
                      "strict": strict})
    return tools


def final_text(message: Message) -> str:
    return "".join(block.text for block in message.content if block.type == "text")


async def _tool_results(server: MCPServerStdio, message: Message, names: set[str]) -> list[dict[str, Any]]:
    results = []
    for block in message.content:
        if block.type != "tool_use":
            continue
        if block.name not in names:
            raise NoFinalAnswer(f"the model called {block.name!r}, which is not one of its tools {sorted(names)}")
        result = await server.call_tool(block.name, dict(block.input))
        content = [{"type": "text", "text": item.text} for item in result.content if item.type == "text"]
        results.append({"type": "tool_result", "tool_use_id": block.id, "content": content,
                        **({"is_error": True} if result.is_error else {})})
    return results


async def solve_with_messages(server: MCPServerStdio, question: str | list[dict[str, Any]], base_url: str, *,
                              model: str, system: str, settings: dict[str, Any], max_turns: int,
                              strict_tools: bool = False, api_key: str = "spanlab") -> str:
    """The final text for ``question`` (a string, or Messages-API messages to continue); raises NoFinalAnswer.

    ``base_url`` is the gateway's OpenAI-style base (``.../v1``); the SDK appends ``/v1/messages`` itself.
    ``settings``: ``max_tokens``, ``temperature``, ``tool_choice`` (the chat agent's ``auto``/``required``/``none``;
    ``required`` forces the first call only, as the Agents SDK does).
    """
    tools = anthropic_tools(await server.list_tools(), strict_tools)
    names = {t["name"] for t in tools}
    messages: list[dict[str, Any]] = [{"role": "user", "content": question}] if isinstance(question, str) \
        else list(question)
    choice = settings.get("tool_choice")
    # anthropic 2.14's create() takes no sampling arguments; the gateway reads them from the body.
    sampling = {"temperature": settings["temperature"]} if settings.get("temperature") is not None else None
    async with AsyncAnthropic(base_url=base_url.removesuffix("/v1"), auth_token=api_key, api_key=None,
                              max_retries=0) as client:
        for _ in range(max_turns):
            extra = {"tool_choice": {"type": {"required": "any"}.get(choice, choice)}} if choice else {}
            reply = await client.messages.create(model=model, system=system, messages=messages, tools=tools,
                                                 max_tokens=settings["max_tokens"], extra_body=sampling, **extra)
            results = await _tool_results(server, reply, names)
            if not results:
                return final_text(reply)
            messages += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in reply.content]},
                         {"role": "user", "content": results}]
            if choice == "required":
                choice = None  # forced once: the model must be free to answer after the tool ran
    raise NoFinalAnswer(f"no final answer after {max_turns} model calls")
