"""Agents used by the runner tests: deterministic crashes, hangs and resource reads; long-tailed rollout times."""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Iterator
from typing import Any

from spanlab.jobs.groups import current_policy_version
from spanlab.runner import Agent, RolloutContext
from spanlab.types import LLMCall, Span


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


class KeyAgent(Agent):
    """Reward 1 when the attempt's ``llm_api_key`` (the gateway's token, given by the worker) is ``task['key']``."""

    async def run(self, task: Any, ctx: RolloutContext) -> float | None:
        return float(ctx.llm_api_key == task["key"])


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

        async with AsyncOpenAI(base_url=ctx.llm_base_url, api_key=ctx.llm_api_key, max_retries=0) as client:
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


# --- the async loop's agent (tests/algos/test_async_loop.py, benchmarks/async_grpo.py) -------------------
VOCAB, PROMPT_LEN, RESPONSE_LEN = 16, 4, 6


def toy_tasks(n: int, seed: int = 0, stragglers: dict[str, float] | None = None) -> list[dict[str, Any]]:
    """``n`` tasks of random prompt tokens; ``stragglers`` maps task IDs whose first sample straggles to a cap (s)."""
    rng = random.Random(seed)
    tasks = [{"task_id": f"t{i}", "prompt": [rng.randrange(1, VOCAB) for _ in range(PROMPT_LEN)]} for i in range(n)]
    for task in tasks:
        if task["task_id"] in (stragglers or {}):
            task["straggler"] = stragglers[task["task_id"]]  # type: ignore[index]
    return tasks


def task_draws(pool: list[dict[str, Any]], per_step: int, seed: int = 0) -> Iterator[list[dict[str, Any]]]:
    """As ``Job.task_draws``: step k of a sync loop trains on draw k; an async loop queues them one by one."""
    rng = random.Random(seed)
    while True:
        yield rng.sample(pool, per_step)


def rollout_delay(task_id: str, sample: int, *, median_s: float, sigma: float, max_s: float, seed: int = 0) -> float:
    """The seeded long-tailed time one rollout of ``task_id`` takes (the same in every loop that runs it)."""
    z = random.Random(f"{seed}-{task_id}-{sample}").gauss(0.0, 1.0)
    return min(max_s, median_s * math.exp(sigma * z))


class LongTailAgent(Agent):
    """Waits a seeded lognormal ``rollout_delay`` per (task, sample), then records one sampled call the way the
    gateway would (an ``llm_call`` span: token IDs, the sampler's logprobs, ``attributes.policy_version`` = the
    latest pushed version when it samples, like an engine serving the latest push) and returns the fraction of
    even response tokens. A task's ``straggler`` first sample outlasts two weight pushes (or its cap)."""

    def __init__(self, median_s: float = 0.05, sigma: float = 1.0, max_s: float = 2.0, seed: int = 0) -> None:
        self.median_s, self.sigma, self.max_s, self.seed = median_s, sigma, max_s, seed

    async def run(self, task: Any, ctx: RolloutContext) -> float | None:
        sample = int(ctx.rollout.metadata.get("sample", 0))
        if task.get("straggler") and sample == 0:
            await self._outlast(ctx, versions=2, cap_s=task["straggler"])
        else:
            await asyncio.sleep(rollout_delay(task["task_id"], sample, median_s=self.median_s, sigma=self.sigma,
                                              max_s=self.max_s, seed=self.seed))
        version = await asyncio.to_thread(current_policy_version, ctx.store)
        rng = random.Random(f"{self.seed}-{task['task_id']}-{sample}-{version}")
        response = [rng.randrange(1, VOCAB) for _ in range(RESPONSE_LEN)]
        call = LLMCall(model="tiny", prompt_token_ids=list(task["prompt"]), response_token_ids=response,
                       response_logprobs=[-math.log(VOCAB)] * RESPONSE_LEN)
        span = Span(rollout_id=ctx.rollout.rollout_id, attempt_id=ctx.attempt.attempt_id, name="chat.completions",
                    kind="llm_call", llm=call, attributes={"policy_version": version})
        await asyncio.to_thread(ctx.store.add_spans, [span])
        return sum(t % 2 == 0 for t in response) / RESPONSE_LEN


    @staticmethod
    async def _outlast(ctx: RolloutContext, *, versions: int, cap_s: float) -> None:
        """A straggler: run until the trainer pushed ``versions`` more versions, or ``cap_s`` (a sync loop pushes
        none while it waits, so there it costs the whole ``cap_s``, as a real long-tail rollout would)."""
        start, deadline = await asyncio.to_thread(current_policy_version, ctx.store), time.monotonic() + cap_s
        while time.monotonic() < deadline:
            if await asyncio.to_thread(current_policy_version, ctx.store) >= start + versions:
                return
            await asyncio.sleep(0.05)


class MetricAgent(Agent):
    """Records ``task['metrics']`` (name -> value) with ``ctx.add_metric``, then returns ``task['reward']``."""

    def __init__(self, **model_settings: Any) -> None:  # a job passes `model` and `temperature`; no model is called
        self.model_settings = model_settings

    async def run(self, task: Any, ctx: RolloutContext) -> float | None:
        for name, value in task.get("metrics", {}).items():
            await asyncio.to_thread(ctx.add_metric, name, value)
        return task["reward"]
