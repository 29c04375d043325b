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


class StepAgent(Agent):
    """Writes ``steps`` custom spans, one store write each, then returns 1; ``task['hold']`` makes the first
    attempt wait after its spans (for a test to kill its worker mid-rollout)."""

    def __init__(self, steps: int = 3) -> None:
        self.steps = steps

    async def run(self, task: Any, ctx: RolloutContext) -> float | None:
        for step in range(self.steps):
            await asyncio.to_thread(ctx.add_span, f"step-{step}", task=task["seed"], attempt=ctx.attempt.sequence_id)
        if task.get("hold") and ctx.attempt.sequence_id == 1:
            await asyncio.sleep(3600)
        return 1.0


class OneCallAgent(Agent):
    """One chat call through the attempt's gateway URL; reward 1 if the model answered with any text."""

    def __init__(self, model: str = "default", max_tokens: int = 8, temperature: float = 0.0) -> None:
        self.model, self.max_tokens, self.temperature = model, max_tokens, temperature

    async def run(self, task: Any, ctx: RolloutContext) -> float | None:
        from openai import AsyncOpenAI

        async with AsyncOpenAI(base_url=ctx.llm_base_url, api_key="unused", max_retries=0) as client:
            out = await client.chat.completions.create(
                model=self.model, max_tokens=self.max_tokens, temperature=self.temperature,
                messages=[{"role": "user", "content": task["question"]}])
        return 1.0 if out.choices[0].message.content else 0.0


class BusyAgent(Agent):
    """A stand-in for an agent of ``calls`` model calls: each waits ``latency_s`` (the engine's time), spends
    ``cpu_ms`` of Python holding the GIL (parsing, tool code) and stores one span (benchmarks/ray_rollouts.py)."""

    def __init__(self, calls: int = 3, latency_s: float = 0.05, cpu_ms: float = 0.0) -> None:
        self.calls, self.latency_s, self.cpu_ms = calls, latency_s, cpu_ms

    async def run(self, task: Any, ctx: RolloutContext) -> float | None:
        import time

        for call in range(self.calls):
            await asyncio.sleep(self.latency_s)
            end = time.perf_counter() + self.cpu_ms / 1000
            while time.perf_counter() < end:
                pass
            await asyncio.to_thread(ctx.add_span, f"call-{call}")
        return 1.0
