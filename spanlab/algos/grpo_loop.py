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
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

import torch
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from spanlab.adapters.grpo import iter_samples
from spanlab.algos.config import TrainConfig
from spanlab.algos.grpo import grpo_step
from spanlab.algos.policy import PolicySync, load_policy, pad_token_id
from spanlab.algos.report import Evaluation, TrainReport
from spanlab.algos.rig import open_rig
from spanlab.algos.rollouts import RolloutCollector
from spanlab.algos.sft import encode_conversation, sft_train
from spanlab.algos.tasks import TaskSet, load_task_set

logger = logging.getLogger(__name__)


def evaluate(collector: RolloutCollector, tasks: list[dict[str, Any]], *, phase: str, temperature: float,
             model: str) -> Evaluation:
    """Held-out accuracy of the currently served policy, through the agent/gateway path."""
    batch = collector.collect(tasks, mode="test", metadata={"phase": phase}, temperature=temperature, model=model)
    by_level: dict[str, list[float]] = {}
    for task, reward in zip(tasks, batch.rewards, strict=True):
        by_level.setdefault(str(task.get("level", "all")), []).append(reward)
    result = Evaluation(phase=phase, n=len(tasks), accuracy=batch.mean_reward,
                        by_level={k: sum(v) / len(v) for k, v in sorted(by_level.items())},
                        seconds=batch.seconds, failed=batch.failed)
    logger.info("%s: held-out accuracy %.1f%% (n=%d) in %.0fs", phase, 100 * result.accuracy, result.n, result.seconds)
    return result


def train_grpo(config: TrainConfig, *, console: Console | None = None) -> TrainReport:
    """Run the whole GRPO job described by ``config``; returns (and writes) its report."""
    from spanlab.engine.model import resolve_model
    from spanlab.engine.weights import WeightSyncClient

    console = console or Console(stderr=True)
    started = time.monotonic()
    task_set = load_task_set(config.dataset.name)
    splits = _tasks(task_set, config)
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
        progress = stack.enter_context(_progress(console))
        if config.warm_start is not None:
            demos = _demonstrations(task_set, splits["train"], config.warm_start.demos)
            samples = [encode_conversation(tokenizer, d["messages"], d.get("tools")) for d in demos]
            report.warm_start = sft_train(model, samples, config.warm_start, pad_id=pad_id, progress=progress)
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
                                        chat_template=config.retokenize_template))
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


def _tasks(task_set: TaskSet, config: TrainConfig) -> dict[str, list[dict[str, Any]]]:
    data = config.dataset
    n_train = max(config.loop.steps * config.loop.tasks_per_step, config.warm_start.demos if config.warm_start else 0)
    train = task_set.make_tasks("train", n=max(n_train, 1) * 2, seed=data.seed, levels=data.levels)
    rl_levels = set(data.train_levels or data.levels)
    return {
        "train": train,
        "rl": [t for t in train if t.get("level") in rl_levels] or train,
        "eval": task_set.make_tasks(config.eval.split, n=config.eval.tasks, seed=data.seed, levels=data.levels),
    }


def _demonstrations(task_set: TaskSet, tasks: list[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    make: Callable[[dict[str, Any]], dict[str, Any]] | None = task_set.demonstration
    if make is None:
        raise ValueError(f"task set {task_set.name!r} has no demonstrations; remove warm_start from the config")
    return [make(t) for t in tasks[:n]]


def _progress(console: Console) -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                    TimeElapsedColumn(), console=console)
