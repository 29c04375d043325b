"""A single-question answerer: the POML prompt asks for the final answer between tags, the task's scorer grades it.

``AnswerAgent`` is registered as ``"answer"`` in :data:`spanlab.runner.agent.REGISTERED_AGENTS`; it is the agent of
the reasoning_gym task set (:mod:`spanlab.tasksets.reasoning_gym`). Names are imported lazily, like calc's.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from spanlab.agents.answer.agent import AnswerAgent
    from spanlab.agents.answer.prompt import REQUIRED_VARIABLES, default_template, extract_answer

_EXPORTS = {
    "AnswerAgent": "agent",
    "REQUIRED_VARIABLES": "prompt",
    "default_template": "prompt",
    "extract_answer": "prompt",
}
__all__ = ["REQUIRED_VARIABLES", "AnswerAgent", "default_template", "extract_answer"]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
