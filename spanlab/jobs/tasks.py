"""Task sets an algorithm trains and evaluates on, by name: a module with ``make_tasks`` (and ``demonstration``).

``make_tasks(split, n, seed, levels)`` must be deterministic and keep splits disjoint, so held-out
accuracy is held out; ``demonstration(task)`` (optional) returns ``{"messages", "tools"}`` of a correct
solution, for warm starts and SFT. A multi-agent task set may also say which role those demonstrations are
for (``DEMONSTRATED_ROLE``) and mine the other roles' from recorded rollouts
(``mine_demonstrations(rollouts) -> list[RoleDemonstration]``, for ``warm_start.role_demos: mined``; the rollouts
are plain data, :func:`spanlab.adapters.recorded_rollouts.read_rollouts`, so a task set never reads the store).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from spanlab.errors import ConfigError

# Tutorial task sets by short name; anything else is a module path.
TASK_SETS: dict[str, str] = {
    "calc": "spanlab.agents.calc",
    "reasoning_gym": "spanlab.tasksets.reasoning_gym",
    "rooms": "spanlab.agents.rooms",
    "sql": "spanlab.agents.sql",
}


@dataclass(frozen=True)
class TaskSet:
    name: str
    make_tasks: Callable[..., list[dict[str, Any]]]
    demonstration: Callable[[dict[str, Any]], dict[str, Any]] | None
    demonstrated_role: str | None = None  # the role ``demonstration`` answers as (None: every call's)
    module: str = ""

    @property
    def mine_demonstrations(self) -> Callable[..., list[Any]] | None:
        """The task set's miner, imported on first use (it may import the trainer's parts)."""
        return getattr(importlib.import_module(self.module), "mine_demonstrations", None) if self.module else None


def load_task_set(name: str) -> TaskSet:
    module_name = TASK_SETS.get(name, name)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        known = ", ".join(sorted(TASK_SETS))
        raise ConfigError(f"dataset.name: unknown task set {name!r} (known: {known}, or a module path): {exc}") from exc
    make_tasks = getattr(module, "make_tasks", None)
    if not callable(make_tasks):
        raise ConfigError(f"dataset.name: module {module_name} has no make_tasks(split, n, seed, levels)")
    return TaskSet(name, make_tasks, getattr(module, "demonstration", None),
                   getattr(module, "DEMONSTRATED_ROLE", None), module_name)
