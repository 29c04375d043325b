"""The SQL tutorial: a writer, a checker and a rewriter agent answering questions over small SQLite databases.

``SQLAgent`` is registered as ``"sql"`` in :data:`spanlab.runner.agent.REGISTERED_AGENTS` and the task set
as ``"sql"`` in :data:`spanlab.jobs.tasks.TASK_SETS`; ``mine_demonstrations`` gives the checker and the rewriter
demonstrations of their own jobs from recorded rollouts. Names are imported lazily, so building tasks or
demonstrations does not pay for the Agents SDK.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from spanlab.agents.sql.agent import SQLAgent
    from spanlab.agents.sql.demos import demonstration
    from spanlab.agents.sql.mining import mine_demonstrations
    from spanlab.agents.sql.tasks import make_tasks

_EXPORTS = {"SQLAgent": "agent", "demonstration": "demos", "make_tasks": "tasks", "mine_demonstrations": "mining"}
__all__ = ["DEMONSTRATED_ROLE", "SQLAgent", "demonstration", "make_tasks", "mine_demonstrations"]
DEMONSTRATED_ROLE = "writer"  # ``demonstration`` is a writer turn; the other roles' are mined (``mining.py``)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
