"""A slow agent with long-tailed rollout times and a tiny trainer: the async loop's scheduling without an engine.

Used by tests/algos/test_async_loop.py and benchmarks/async_grpo.py. ``LongTailAgent`` waits a seeded
lognormal time per (task, sample), then records one sampled call the way the gateway would (an ``llm_call``
span with token IDs, the sampler's logprobs and ``attributes.policy_version``: the latest pushed version at
the moment it samples, read from the store like an engine serving the latest push) and returns a seeded
reward. A task marked ``straggler`` has a first sample that outlasts two weight pushes (or its cap).
``TinyTrainer`` is the real ``iter_samples`` + ``grpo_step`` on a tiny random Llama; its push
records a ``policy`` resource (what PolicySync records after an engine reload). ``train_s`` and ``push_s``
of sleep stand in for a real model's update and reload: a sleep holds no core, as an update on a GPU would
not hold the workers' CPU, so the figures isolate the scheduling.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from spanlab.adapters.grpo import iter_samples
from spanlab.algos.grpo.loop import StepParts
from spanlab.algos.grpo.update import GRPOConfig, grpo_step
from spanlab.jobs.groups import POLICY_RESOURCE, current_policy_version
from spanlab.runner import Agent, RolloutContext
from spanlab.store.base import StoreAPI
from spanlab.types import LLMCall, Span

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
    """Waits ``rollout_delay``, then records one sampled call and returns the fraction of even response tokens."""

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


def tiny_model(seed: int = 0) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, head_dim=16, pad_token_id=0)
    return LlamaForCausalLM(config)


@dataclass
class TinyTrainer:
    """The real GRPO update on a tiny model; ``trained`` keeps (version at the update, rollout IDs) per step."""

    store: StoreAPI
    train_s: float = 0.0
    push_s: float = 0.0
    config: GRPOConfig = field(default_factory=lambda: GRPOConfig(lr=1e-2, group_size=4, micro_batch_tokens=256))
    trained: list[tuple[int, list[str]]] = field(default_factory=list)
    steps: list[dict[str, float]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.model = tiny_model()
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=self.config.lr)

    def update(self, rollout_ids: list[str]) -> dict[str, float]:
        self.trained.append((current_policy_version(self.store), list(rollout_ids)))
        samples = list(iter_samples(self.store, rollout_ids, group_key=None))
        time.sleep(self.train_s)
        return grpo_step(self.model, self.optimizer, samples, self.config, pad_id=0)

    def push(self) -> float:
        started = time.perf_counter()
        time.sleep(self.push_s)
        self.store.add_resource(POLICY_RESOURCE, {"step": len(self.trained)}, kind="model_checkpoint")
        return time.perf_counter() - started

    def parts(self) -> StepParts:
        return StepParts(self.update, self.push, self.steps.append)
