"""The room selector tutorial: a seeded building, booking requests with ground truth, a POML-prompted tool agent.

``RoomsAgent`` is registered as ``"rooms"`` in :data:`spanlab.runner.agent.REGISTERED_AGENTS` and the
task set as ``"rooms"`` in :data:`spanlab.jobs.tasks.TASK_SETS`. APO (``spanlab train
tutorials/rooms/apo.yaml``) optimizes its prompt. Names are imported lazily, like the calc tutorial's.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from spanlab.agents.rooms.agent import REQUIRED_VARIABLES, RoomsAgent, default_template, room_tools
    from spanlab.agents.rooms.building import make_building
    from spanlab.agents.rooms.tasks import grade, make_tasks

_EXPORTS = {
    "REQUIRED_VARIABLES": "agent",
    "RoomsAgent": "agent",
    "default_template": "agent",
    "room_tools": "agent",
    "make_building": "building",
    "grade": "tasks",
    "make_tasks": "tasks",
}
__all__ = ["REQUIRED_VARIABLES", "RoomsAgent", "default_template", "grade", "make_building", "make_tasks",
           "room_tools"]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
