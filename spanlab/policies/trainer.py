"""The trainer with a policy per role (``policies:``): each policy's update on its roles' calls only, each pushed alone.

What an algorithm's sync loop does with a step's rollouts stays as it is; only where the update goes changes. The
update reads the samples of each policy (:func:`~spanlab.policies.training.split_by_policy`: the calls of its
roles), runs the algorithm's step function once per policy on its own adapter and optimizer
(:func:`~spanlab.policies.training.step_each_policy`), and the push hot-loads the policies that changed, each as its
next version. A policy whose samples had no reward variance (or that had none) is left as it was and not pushed.
The step's metrics hold every policy's own (``<policy>/loss``, ``<policy>/reward_mean``, ``<policy>/n_samples``,
...) and, over all of them, the keys the report and the "learned nothing" check read: ``reward_mean`` (over the
step's rollouts), ``n_samples``, ``skipped`` (1.0: no policy changed).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from torch import nn

from spanlab.adapters.samples import Sample
from spanlab.policies.serving import PolicyAdapters
from spanlab.policies.training import policy_optimizers, split_by_policy, step_each_policy
from spanlab.training.trainers import MakeOptimizer, SampleRead, Trainer, TrainStep


class PolicyTrainer(Trainer):
    """One optimizer per policy's adapter; the update steps each policy with samples, the push serves those that
    changed. ``model``: the multi-adapter model whose adapters ``adapters`` serves (already at their first version)."""

    def __init__(self, model: nn.Module, adapters: PolicyAdapters, step: TrainStep, make_optimizer: MakeOptimizer, *,
                 agents: Sequence[str] | None) -> None:
        self.model, self.adapters, self.step, self.agents = model, adapters, step, agents
        self.policies = adapters.policies
        self.optimizers = policy_optimizers(model, self.policies.names, make_optimizer)
        self.changed: list[str] = []  # the policies the last update moved: the push serves their next version

    def update(self, read: SampleRead, **step_args: Any) -> dict[str, float]:
        samples = split_by_policy(read, self.policies, agents=self.agents)
        metrics = step_each_policy(self.model, self.optimizers, samples,
                                   lambda m, opt, s: self.step(m, opt, s, **step_args))
        self.changed = [p for p, s in samples.items() if s and metrics.get(f"{p}/skipped") != 1.0]
        return metrics | step_summary(samples, self.changed, self.policies.names)

    def push(self) -> float:
        return sum(self.adapters.push(self.model, name).timing.total_s for name in self.changed)


def step_summary(samples: dict[str, list[Sample]], changed: list[str], names: tuple[str, ...]) -> dict[str, float]:
    """The step over every policy: its rollouts' mean reward (each rollout once), the samples, whether any policy
    changed; ``<policy>/n_samples`` 0 for a policy with no samples (the step function reports the others')."""
    rewards = {s.rollout_id: s.reward for policy_samples in samples.values() for s in policy_samples}
    empty = {f"{name}/n_samples": 0.0 for name in names if not samples.get(name)}
    return {"reward_mean": sum(rewards.values()) / len(rewards) if rewards else math.nan,
            "n_samples": float(sum(len(s) for s in samples.values())),
            "policies_updated": float(len(changed)), "skipped": 0.0 if changed else 1.0, **empty}
