"""The calculator MCP server, spawned as a real subprocess and driven with the real mcp stdio client."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from spanlab.agents.calc.agent import server_params
from spanlab.agents.calc.mcp_server import CalculatorError, evaluate

CASES = {
    "47 + 38": "85",
    "(5 + 4) * 7": "63",
    "2 * 8 - 5": "11",
    "75 / 5": "15",
    "7 / 2": "3.5",
    "-3 + 10": "7",
    "1 / 3": "0.333333",
    " 12 × 3 ": "36",
}
BAD = {
    "1 / 0": "division by zero",
    "__import__('os').system('true')": "unsupported",
    "2 ** 10": "unsupported",
    "2 * 5 = 10": "cannot parse",
    "": "empty",
    "1.5 + 2": "unsupported",
    "x + 1": "unsupported",
    "9" * 13 + " * 2": "exceeds",
}


def test_evaluate_in_process() -> None:
    for expression, want in CASES.items():
        assert evaluate(expression) == want
    for expression, reason in BAD.items():
        with pytest.raises(CalculatorError, match=reason):
            evaluate(expression)


async def _session_calls(calls: list[dict[str, Any]]) -> tuple[list[Any], list[Any]]:
    p = server_params()
    params = StdioServerParameters(command=p["command"], args=p["args"], env=p["env"])
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        tools = (await session.list_tools()).tools
        results = [await session.call_tool("calculator", args) for args in calls]
    return tools, results


def test_stdio_server_lists_and_runs_the_tool() -> None:
    calls = [{"expression": e} for e in [*CASES, *BAD]] + [{"expr": "1 + 1"}]
    tools, results = asyncio.run(_session_calls(calls))

    assert [t.name for t in tools] == ["calculator"]
    assert tools[0].input_schema["required"] == ["expression"]
    assert tools[0].input_schema["properties"]["expression"]["type"] == "string"
    for result, want in zip(results[: len(CASES)], CASES.values(), strict=True):
        assert not result.is_error and [c.text for c in result.content] == [want]
    for result, reason in zip(results[len(CASES) :], [*BAD.values(), "expression"], strict=True):
        assert result.is_error, "a bad expression is a tool error, not a crash of the server"
        assert reason in result.content[0].text and "Error executing tool calculator" in result.content[0].text
