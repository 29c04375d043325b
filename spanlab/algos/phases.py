"""The phases every training job shares: task splits, held-out evaluation, the SFT warm start, progress bars.

GRPO and the SFT rounds differ only in what they do between the base and the final evaluation, so both
call these; a held-out number from one algorithm means the same as from the other (same tasks, same
agent/gateway path, same temperature).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from spanlab.algos.config import TrainConfig, WarmStartConfig
from spanlab.algos.report import Evaluation
from spanlab.algos.rollouts import RolloutCollector
from spanlab.algos.sft import encode_conversation, sft_train
from spanlab.algos.tasks import TaskSet

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


def split_tasks(task_set: TaskSet, config: TrainConfig, n_train: int) -> dict[str, list[dict[str, Any]]]:
    """``train`` (demos), ``rl`` (the train tasks of ``train_levels``) and ``eval`` (held out) task lists."""
    data = config.dataset
    n_train = max(n_train, config.warm_start.demos if config.warm_start else 0, 1)
    train = task_set.make_tasks("train", n=n_train * 2, seed=data.seed, levels=data.levels)
    rl_levels = set(data.train_levels or data.levels)
    return {
        "train": train,
        "rl": [t for t in train if t.get("level") in rl_levels] or train,
        "eval": task_set.make_tasks(config.eval.split, n=config.eval.tasks, seed=data.seed, levels=data.levels),
    }


def warm_start(model: torch.nn.Module, tokenizer: Any, task_set: TaskSet, tasks: list[dict[str, Any]],
               config: WarmStartConfig, *, pad_id: int, progress: Progress | None) -> dict[str, float]:
    """SFT on generated demonstrations of the first ``config.demos`` tasks (a model that never earns a
    reward gives RL and reward filtering nothing to keep)."""
    make: Callable[[dict[str, Any]], dict[str, Any]] | None = task_set.demonstration
    if make is None:
        raise ValueError(f"task set {task_set.name!r} has no demonstrations; remove warm_start from the config")
    demos = [make(t) for t in tasks[: config.demos]]
    samples = [encode_conversation(tokenizer, d["messages"], d.get("tools")) for d in demos]
    return sft_train(model, samples, config, pad_id=pad_id, progress=progress)


def progress_bar(console: Console) -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                    TimeElapsedColumn(), console=console)
