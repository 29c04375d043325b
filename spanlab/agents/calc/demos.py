"""Demonstrations for an SFT warm start of the calculator agent, in the agent's exact request shapes.

SmolLM2-135M never calls the calculator on its own (REFERENCE.md §8); a short SFT on
question -> calculator call -> result -> "The answer is N." fixes that. For the warm start to train
the prompt the live agent produces, the messages and tools here copy, key for key, what the OpenAI
Agents SDK (0.24) sends through the gateway for :class:`~spanlab.agents.calc.agent.CalcAgent`, as
recorded in the store: the system message from ``instructions``, the user question, an assistant
message with ``content: None`` and one ``tool_calls`` entry whose ``arguments`` is a JSON string,
the tool message with MCP list content ``[{"type": "text", "text": "85"}]``, then the final answer.
The tools list is the SDK's conversion of the MCP tool (``strict`` false unless the agent converts
schemas to strict). ``tests/agents/test_calc_agent.py`` checks, token for token against the live
server, that these render to the prompts the agent really sends.

Render for training: ``tokenizer.apply_chat_template(d["messages"], tools=d["tools"])``.
"""

from __future__ import annotations

import copy
import json
from typing import Any, TypedDict

from spanlab.agents.calc.mcp_server import TOOL_DESCRIPTION, TOOL_NAME, evaluate

SYSTEM_PROMPT = "Use the calculator tool to compute the answer, then reply: The answer is N."

_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": TOOL_NAME,
        "description": TOOL_DESCRIPTION,
        "parameters": {
            "type": "object",
            "properties": {"expression": {"title": "Expression", "type": "string"}},
            "required": ["expression"],
            "title": "calculatorArguments",
        },
        "strict": False,
    },
}


class Demonstration(TypedDict):
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]


def calculator_tools(strict: bool = False) -> list[dict[str, Any]]:
    """The ``tools`` the SDK sends for the calculator (``strict``: as with ``CalcAgent(strict_tools=True)``)."""
    tool = copy.deepcopy(_TOOL)
    if strict:
        tool["function"]["parameters"]["additionalProperties"] = False
        tool["function"]["strict"] = True
    return [tool]


def tool_call_message(expression: str, call_id: str = "call_0") -> dict[str, Any]:
    """The assistant turn that calls the calculator, as the SDK replays it in later requests."""
    arguments = json.dumps({"expression": expression})
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": call_id, "type": "function", "function": {"name": TOOL_NAME, "arguments": arguments}}],
    }


def tool_result_message(result: str, call_id: str = "call_0") -> dict[str, Any]:
    """The tool turn: MCP text content as the SDK forwards it (a one-part list, not a plain string)."""
    return {"role": "tool", "tool_call_id": call_id, "content": [{"type": "text", "text": result}]}


def conversation(
    question: str, expression: str, answer: int | str, system_prompt: str = SYSTEM_PROMPT, call_id: str = "call_0"
) -> list[dict[str, Any]]:
    """System, user, calculator call, its real result (computed here), final answer: five messages."""
    return [
        {"content": system_prompt, "role": "system"},
        {"role": "user", "content": question},
        tool_call_message(expression, call_id),
        tool_result_message(evaluate(expression), call_id),
        {"role": "assistant", "content": f"The answer is {answer}."},
    ]


def demonstration(task: dict[str, Any], system_prompt: str = SYSTEM_PROMPT, strict: bool = False) -> Demonstration:
    """A correct solution of ``task`` (from ``make_tasks``; uses its ``expression``) as messages + tools."""
    if evaluate(task["expression"]) != str(task["answer"]):
        raise ValueError(f"task {task.get('task_id')}: {task['expression']!r} does not evaluate to {task['answer']}")
    return Demonstration(
        messages=conversation(task["question"], task["expression"], task["answer"], system_prompt),
        tools=calculator_tools(strict),
    )
