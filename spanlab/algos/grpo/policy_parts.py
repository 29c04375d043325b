"""The sync loop's parts with a policy per role (``policies:``): each policy's GRPO update on its roles' calls only.

The loop (:func:`~spanlab.algos.grpo.loop.run_sync`) stays as it is; only what it does with a step's rollouts
changes. The update reads the samples of each policy (:func:`~spanlab.policies.training.samples_by_policy`: the
calls of its roles), runs ``grpo_step`` once per policy on its own adapter and optimizer
(:func:`~spanlab.policies.training.step_each_policy`), and the push hot-loads the policies that changed, each
as its next version. A policy whose samples had no reward variance (or that had none) is left as it was and not
pushed. The step's metrics hold every policy's own (``<policy>/loss``, ``<policy>/reward_mean``,
``<policy>/n_samples``, ...) and, over all of them, the keys the report and the "learned nothing" check read:
``reward_mean`` (over the step's rollouts), ``n_samples``, ``skipped`` (1.0: no policy changed) and what the sample
rule left out (``dropped_*``, :mod:`spanlab.adapters.trainable`).
"""

from __future__ import annotations

import logging
import math
from functools import partial

import torch

from spanlab.adapters.samples import Sample
from spanlab.adapters.trainable import Dropped
from spanlab.algos.grpo.config import GRPOSection
from spanlab.algos.grpo.step_parts import StepParts
from spanlab.algos.grpo.update import grpo_step
from spanlab.jobs.job import Job
from spanlab.policies.training import policy_optimizers, samples_by_policy, step_each_policy

logger = logging.getLogger(__name__)


def policy_step_parts(job: Job, settings: GRPOSection) -> StepParts:
    """Serve each policy's first version, then the update and push of a step with a policy per role."""
    assert job.policy is not None and job.config.policies is not None
    config, policy, policies = job.config, job.policy, job.config.policies
    adapters = job.open_policies()
    model = policy.model
    optimizers = policy_optimizers(model, policies.names, partial(torch.optim.AdamW, lr=settings.lr,
                                                                  weight_decay=settings.weight_decay))
    changed: list[str] = []  # the policies the last update moved: the push serves their next version

    def update(rollout_ids: list[str]) -> dict[str, float]:
        dropped = Dropped()
        samples = samples_by_policy(job.rig.store, rollout_ids, policies, agents=config.agents, group_key="task_id",
                                    token_source=config.token_source, tokenizer=policy.tokenizer,
                                    chat_template=config.retokenize_template, credit=settings.credit,
                                    failed_attempts=settings.failed_attempts, dropped=dropped)
        metrics = step_each_policy(model, optimizers, samples,
                                   lambda m, opt, s: grpo_step(m, opt, s, settings, pad_id=policy.pad_id))
        changed[:] = [p for p, s in samples.items() if s and metrics.get(f"{p}/skipped") != 1.0]
        return metrics | step_summary(samples, changed, policies.names) | dropped.metrics()

    def push() -> float:
        return sum(adapters.push(model, name).timing.total_s for name in changed)

    return StepParts(update, push, job.log_step)


def step_summary(samples: dict[str, list[Sample]], changed: list[str], names: tuple[str, ...]) -> dict[str, float]:
    """The step over every policy: its rollouts' mean reward (each rollout once), the samples, whether any policy
    changed; ``<policy>/n_samples`` 0 for a policy with no samples (``grpo_step`` reports the others')."""
    rewards = {s.rollout_id: s.reward for policy_samples in samples.values() for s in policy_samples}
    empty = {f"{name}/n_samples": 0.0 for name in names if not samples.get(name)}
    return {"reward_mean": sum(rewards.values()) / len(rewards) if rewards else math.nan,
            "n_samples": float(sum(len(s) for s in samples.values())),
            "policies_updated": float(len(changed)), "skipped": 0.0 if changed else 1.0, **empty}
