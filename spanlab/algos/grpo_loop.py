"""The GRPO training run: evaluate, (warm start), then collect -> adapt -> update -> push, and evaluate again.

The loop is the data path of spanlab end to end, nothing sideways: rollouts run the real agent
through the recording gateway against vLLM; the adapter reads the exact sampled token IDs back from
the store; the GRPO step updates the policy; the engine reloads the new weights before the next
collection. Per-step metrics go into the store's ``train_metrics`` table.
"""

from __future__ import annotations

import logging
import random
import time
from contextlib import ExitStack

import torch
from rich.console import Console

from spanlab.adapters.grpo import iter_samples
from spanlab.algos.config import TrainConfig
from spanlab.algos.grpo import grpo_step
from spanlab.algos.phases import evaluate, progress_bar, split_tasks, warm_start
from spanlab.algos.policy import PolicySync, load_policy, pad_token_id
from spanlab.algos.report import TrainReport
from spanlab.algos.rig import open_rig
from spanlab.algos.tasks import load_task_set

logger = logging.getLogger(__name__)


def train_grpo(config: TrainConfig, *, console: Console | None = None) -> TrainReport:
    """Run the whole GRPO job described by ``config``; returns (and writes) its report."""
    from spanlab.engine.model import resolve_model
    from spanlab.engine.weights import WeightSyncClient

    console = console or Console(stderr=True)
    started = time.monotonic()
    task_set = load_task_set(config.dataset.name)
    splits = split_tasks(task_set, config, config.loop.steps * config.loop.tasks_per_step)
    torch.set_num_threads(config.loop.torch_threads or torch.get_num_threads())
    report = TrainReport(run_name=config.run_name, algorithm="grpo", model=config.engine.model, db=str(config.db))

    with ExitStack() as stack:
        rig = open_rig(stack, config, console)
        store, gateway, collector = rig.store, rig.gateway, rig.collector
        client = stack.enter_context(WeightSyncClient(rig.root_url))
        model, tokenizer = load_policy(resolve_model(config.engine.model))
        pad_id = pad_token_id(tokenizer)
        sync = PolicySync(client, store, config.run_dir, rig.served)

        def held_out(phase: str) -> None:
            report.evaluations.append(evaluate(collector, splits["eval"], phase=phase,
                                               temperature=config.eval.temperature, model=sync.served_name))
            store.add_metrics(report.run_id, "grpo", len(report.steps), {f"eval_accuracy_{phase}":
                                                                         report.evaluations[-1].accuracy})

        held_out("base")
        progress = stack.enter_context(progress_bar(console))
        if config.warm_start is not None:
            report.warm_start = warm_start(model, tokenizer, task_set, splits["train"], config.warm_start,
                                           pad_id=pad_id, progress=progress)
            report.warm_start["sync_s"] = sync.push(model).total_s
            held_out("warm_start")

        optimizer = torch.optim.AdamW((p for p in model.parameters() if p.requires_grad), lr=config.grpo.lr,
                                      weight_decay=config.grpo.weight_decay)
        rng = random.Random(config.dataset.seed)
        rl_task = progress.add_task("GRPO", total=config.loop.steps)
        for step in range(config.loop.steps):
            tasks = rng.sample(splits["rl"], min(config.loop.tasks_per_step, len(splits["rl"])))
            batch = collector.collect(tasks, mode="train", group_size=config.grpo.group_size,
                                      metadata={"run_id": report.run_id, "step": step}, model=sync.served_name)
            gateway.flush()
            samples = list(iter_samples(store, batch.rollout_ids, token_source=config.token_source, tokenizer=tokenizer,
                                        chat_template=config.retokenize_template, agents=config.agents))
            metrics = grpo_step(model, optimizer, samples, config.grpo, pad_id=pad_id)
            metrics.update(rollout_s=batch.seconds, rollout_failed=batch.failed, sync_s=sync.push(model).total_s)
            store.add_metrics(report.run_id, "grpo", step, metrics)
            report.steps.append(metrics)
            progress.update(rl_task, advance=1, description=f"GRPO reward {metrics['reward_mean']:.2f}")
        progress.stop()
        if config.loop.steps:
            held_out("final")
    report.seconds = time.monotonic() - started
    report.write(config.run_dir / "report.json")
    return report
