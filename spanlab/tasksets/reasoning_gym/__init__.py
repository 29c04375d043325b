"""reasoning-gym's procedural task families as a spanlab task set (``dataset: {name: reasoning_gym}``).

Questions and scorers are reasoning-gym's own (no download at run time); the answer agent
(:mod:`spanlab.agents.answer`) asks for the answer between tags and scores it with the family's ``score_answer``.
Registered as ``"reasoning_gym"`` in :data:`spanlab.jobs.tasks.TASK_SETS`; docs/reasoning_gym.md is the reference.
Names are imported lazily: importing reasoning-gym takes a few seconds.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from spanlab.agents.answer.prompt import REQUIRED_VARIABLES, default_template
    from spanlab.tasksets.reasoning_gym.demos import demonstration
    from spanlab.tasksets.reasoning_gym.scoring import score
    from spanlab.tasksets.reasoning_gym.tasks import SPLITS, make_tasks

_EXPORTS = {
    "REQUIRED_VARIABLES": "spanlab.agents.answer.prompt",
    "default_template": "spanlab.agents.answer.prompt",
    "demonstration": f"{__name__}.demos",
    "score": f"{__name__}.scoring",
    "SPLITS": f"{__name__}.tasks",
    "make_tasks": f"{__name__}.tasks",
}
__all__ = ["REQUIRED_VARIABLES", "SPLITS", "default_template", "demonstration", "make_tasks", "score"]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
