"""The GRPO training run: evaluate, (warm start), then collect -> adapt -> update -> push, and evaluate again.

The loop is the data path of spanlab end to end, nothing sideways: rollouts run the real agent
through the recording gateway against vLLM; the adapter reads the exact sampled token IDs back from
the store; the GRPO step updates the policy; the engine reloads the new weights before the next
collection. Per-step metrics go into the store's ``train_metrics`` table.
"""

from __future__ import annotations

import logging
import random
from contextlib import ExitStack

import torch
from rich.console import Console

from spanlab.adapters.grpo import iter_samples
from spanlab.algos.grpo.update import grpo_step
from spanlab.jobs.config import TrainConfig
from spanlab.jobs.job import open_job
from spanlab.jobs.report import TrainReport

logger = logging.getLogger(__name__)


def train_grpo(config: TrainConfig, *, console: Console | None = None) -> TrainReport:
    """Run the whole GRPO job described by ``config``; returns (and writes) its report."""
    console = console or Console(stderr=True)
    loop = config.loop
    with ExitStack() as stack:
        job = open_job(stack, config, console, algorithm="grpo", n_train=loop.steps * loop.tasks_per_step,
                       lora=config.grpo.lora)
        job.warm_start()
        model, store = job.model, job.rig.store
        optimizer = torch.optim.AdamW((p for p in model.parameters() if p.requires_grad), lr=config.grpo.lr,
                                      weight_decay=config.grpo.weight_decay)
        rng = random.Random(config.dataset.seed)
        bar = job.progress.add_task("GRPO", total=loop.steps)
        for step in range(loop.steps):
            tasks = rng.sample(job.splits["rl"], min(loop.tasks_per_step, len(job.splits["rl"])))
            batch = job.rig.collector.collect(tasks, mode="train", group_size=config.grpo.group_size,
                                              metadata={"run_id": job.report.run_id, "step": step},
                                              model=job.sync.served_name)
            job.rig.gateway.flush()
            samples = list(iter_samples(store, batch.rollout_ids, token_source=config.token_source,
                                        tokenizer=job.tokenizer, chat_template=config.retokenize_template,
                                        agents=config.agents))
            metrics = grpo_step(model, optimizer, samples, config.grpo, pad_id=job.pad_id)
            metrics.update(rollout_s=batch.seconds, rollout_failed=batch.failed, sync_s=job.sync.push(model).total_s)
            store.add_metrics(job.report.run_id, "grpo", step, metrics)
            job.report.steps.append(metrics)
            job.progress.update(bar, advance=1, description=f"GRPO reward {metrics['reward_mean']:.2f}")
        if loop.steps:
            job.held_out("final")
        return job.finish()
