"""The GRPO steps: collect -> adapt -> update -> push, between the framework's base and final evaluation.

The loop is the data path of spanlab end to end, nothing sideways: rollouts run the real agent
through the recording gateway against vLLM; the adapter reads the exact sampled token IDs back from
the store; the GRPO step updates the policy; the engine reloads the new weights before the next
collection. Per-step metrics go into the store's ``train_metrics`` table. With ``trainer.processes: N``
the update runs on N data-parallel ranks (:mod:`spanlab.training.data_parallel`); this process stays
rank 0: it alone reads the samples from the store and pushes the weights (with ``sharding: fsdp``, the
weights gathered from all ranks).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch

from spanlab.adapters.grpo import Sample, iter_samples
from spanlab.algos.grpo.config import GRPOSection
from spanlab.algos.grpo.update import grpo_step
from spanlab.jobs.job import Job
from spanlab.training.data_parallel import DataParallel, load_trainable_model


def train_grpo(job: Job, settings: GRPOSection) -> None:
    """``settings.steps`` GRPO updates of the job's policy, each on ``tasks_per_step`` x ``group_size`` rollouts."""
    assert job.policy is not None, "GRPO trains weights: the framework loads the policy"
    policy, config = job.policy, job.config
    update, push = _update(job, settings)
    for step, tasks in job.steps(settings.steps, settings.tasks_per_step, "GRPO"):
        batch = job.collect(tasks, group_size=settings.group_size, step=step)
        samples = list(iter_samples(job.rig.store, batch.rollout_ids, token_source=config.token_source,
                                    tokenizer=policy.tokenizer, chat_template=config.retokenize_template,
                                    agents=config.agents))
        metrics = update(samples)
        metrics.update(rollout_s=batch.seconds, rollout_failed=batch.failed, sync_s=push())
        job.log_step(metrics)


def _update(job: Job, settings: GRPOSection) -> tuple[Callable[[list[Sample]], dict[str, float]], Callable[[], float]]:
    """One GRPO update of a step's samples (in this process, or on the configured data-parallel ranks), and the
    push of the updated weights to the engine (its seconds)."""
    assert job.policy is not None
    policy, trainer = job.policy, job.config.trainer
    make_optimizer = partial(torch.optim.AdamW, lr=settings.lr, weight_decay=settings.weight_decay)
    if trainer.processes == 1:  # the job keeps the optimizer: its state is saved with each step for --resume
        optimizer = job.attach_optimizer(make_optimizer(p for p in policy.model.parameters() if p.requires_grad))
        def update_here(samples: list[Sample]) -> dict[str, float]:
            return grpo_step(policy.model, optimizer, samples, settings, pad_id=policy.pad_id)

        return update_here, policy.push
    from spanlab.engine.model import resolve_model

    make_model = partial(load_trainable_model, resolve_model(job.config.engine.model), settings.lora)
    dp = job.stack.enter_context(DataParallel(policy.model, make_model, make_optimizer, trainer,
                                              threads=job.config.torch_threads))

    def update(samples: list[Sample]) -> dict[str, float]:
        return dp.run(grpo_step, samples=samples, config=settings, pad_id=policy.pad_id)

    if trainer.sharding == "none":
        return update, policy.push
    return update, lambda: policy.sync.push_state(dp.full_state_dict()).total_s  # rank 0 holds only its shard
