"""A tiny trainer for the async loop's tests and benchmark: the scheduling without an engine.

Used with ``tests.agents_for_tests.LongTailAgent`` (long-tailed rollout times, in the light module Ray actors
import) by tests/algos/test_async_loop.py, tests/test_ray_runner.py and benchmarks/async_grpo.py.
``TinyTrainer`` is the real ``iter_samples`` + ``grpo_step`` on a tiny random Llama; its push
records a ``policy`` resource (what PolicySync records after an engine reload). ``train_s`` and ``push_s``
of sleep stand in for a real model's update and reload: a sleep holds no core, as an update on a GPU would
not hold the workers' CPU, so the figures isolate the scheduling.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from spanlab.adapters.sample_reader import iter_samples
from spanlab.algos.grpo.loop import StepParts
from spanlab.algos.grpo.update import GRPOConfig, grpo_step
from spanlab.jobs.groups import POLICY_RESOURCE, current_policy_version
from spanlab.store.base import StoreAPI
from tests.agents_for_tests import VOCAB


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
