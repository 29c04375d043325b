"""The MCP math tutorial: arithmetic word problems, a calculator MCP server, an Agents SDK agent, demos.

``CalcAgent`` is registered as ``"calc"`` in :data:`spanlab.runner.agent.REGISTERED_AGENTS`.
Names are imported lazily: the calculator server subprocess (``python -m
spanlab.agents.calc.mcp_server``) imports this package first and must not pay for the Agents SDK.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from spanlab.agents.calc.agent import REQUIRED_VARIABLES, CalcAgent, default_template, score
    from spanlab.agents.calc.demos import SYSTEM_PROMPT, calculator_tools, demonstration
    from spanlab.agents.calc.tasks import make_tasks

_EXPORTS = {
    "CalcAgent": "agent",
    "REQUIRED_VARIABLES": "agent",
    "default_template": "agent",
    "score": "agent",
    "SYSTEM_PROMPT": "demos",
    "calculator_tools": "demos",
    "demonstration": "demos",
    "make_tasks": "tasks",
}
__all__ = ["REQUIRED_VARIABLES", "SYSTEM_PROMPT", "CalcAgent", "calculator_tools", "default_template", "demonstration",
           "make_tasks", "score"]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
