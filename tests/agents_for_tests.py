"""Agents used by the runner tests: deterministic crashes, hangs and resource reads."""

from __future__ import annotations

import asyncio
import random
from typing import Any

from spanlab.runner import Agent, RolloutContext


class FlakyAgent(Agent):
    """Per (task seed, attempt): crash with p_crash, hang with p_hang, else two steps and reward 1."""

    def __init__(self, p_crash: float = 0.1, p_hang: float = 0.05, step_s: float = 0.0) -> None:
        self.p_crash, self.p_hang, self.step_s = p_crash, p_hang, step_s

    async def run(self, task: Any, ctx: RolloutContext) -> float | None:
        draw = random.Random(f"{task['seed']}-{ctx.attempt.sequence_id}").random()
        if draw < self.p_crash:
            raise RuntimeError(f"agent crashed on task {task['seed']}")
        if draw < self.p_crash + self.p_hang:
            await asyncio.sleep(3600)
        for step in range(2):
            await asyncio.to_thread(ctx.add_span, f"step-{step}", task=task["seed"])
            await asyncio.sleep(self.step_s)
        return 1.0


class ScriptedAgent(Agent):
    """Follows ``task['plan'][attempt - 1]``: "ok", "crash" or "hang"; reports an intermediate reward."""

    async def run(self, task: Any, ctx: RolloutContext) -> float | None:
        action = task["plan"][ctx.attempt.sequence_id - 1]
        if action == "crash":
            raise ValueError("scripted crash")
        if action == "hang":
            await asyncio.sleep(3600)
        await asyncio.to_thread(ctx.add_reward, 0.5, name="halfway")
        return task.get("reward", 1.0)


class ResourceAgent(Agent):
    """Returns the version of the `prompt` resource it was given, as its reward."""

    async def run(self, task: Any, ctx: RolloutContext) -> float | None:
        return float(ctx.resources["prompt"].version)
