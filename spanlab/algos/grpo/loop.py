"""The GRPO steps: collect -> adapt -> update -> push, between the framework's base and final evaluation.

The loop is the data path of spanlab end to end, nothing sideways: rollouts run the real agent
through the recording gateway against vLLM; the adapter reads the exact sampled token IDs back from
the store; the GRPO step updates the policy; the engine reloads the new weights before the next
collection. Per-step metrics go into the store's ``train_metrics`` table.
"""

from __future__ import annotations

import torch

from spanlab.adapters.grpo import iter_samples
from spanlab.algos.grpo.config import GRPOSection
from spanlab.algos.grpo.update import grpo_step
from spanlab.jobs.job import Job


def train_grpo(job: Job, settings: GRPOSection) -> None:
    """``settings.steps`` GRPO updates of the job's policy, each on ``tasks_per_step`` x ``group_size`` rollouts."""
    assert job.policy is not None, "GRPO trains weights: the framework loads the policy"
    policy, config = job.policy, job.config
    optimizer = job.attach_optimizer(torch.optim.AdamW((p for p in policy.model.parameters() if p.requires_grad),
                                                       lr=settings.lr, weight_decay=settings.weight_decay))
    for step, tasks in job.steps(settings.steps, settings.tasks_per_step, "GRPO"):
        batch = job.collect(tasks, group_size=settings.group_size, step=step)
        samples = list(iter_samples(job.rig.store, batch.rollout_ids, token_source=config.token_source,
                                    tokenizer=policy.tokenizer, chat_template=config.retokenize_template,
                                    agents=config.agents))
        metrics = grpo_step(policy.model, optimizer, samples, settings, pad_id=policy.pad_id)
        metrics.update(rollout_s=batch.seconds, rollout_failed=batch.failed, sync_s=policy.push())
        job.log_step(metrics)
