"""The phases every training job shares: task splits, held-out evaluation, the SFT warm start, progress bars.

GRPO and the SFT rounds differ only in what they do between the base and the final evaluation, so both
call these; a held-out number from one algorithm means the same as from the other (same tasks, same
agent/gateway path, same temperature).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

import torch
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from spanlab.jobs.config import TrainConfig, WarmStartConfig
from spanlab.jobs.report import Evaluation, TrainReport
from spanlab.jobs.rig import Rig, open_rig
from spanlab.jobs.rollouts import RolloutCollector
from spanlab.jobs.tasks import TaskSet, load_task_set
from spanlab.training.model import LoraConfig, apply_lora
from spanlab.training.policy import PolicySync, load_policy, pad_token_id
from spanlab.training.supervised import encode_conversation, sft_train

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


@dataclass
class Job:
    """One training run's open pieces (rig, policy, engine sync) and its report: what an algorithm's loop uses."""

    config: TrainConfig
    algorithm: str
    rig: Rig
    task_set: TaskSet
    splits: dict[str, list[dict[str, Any]]]
    model: torch.nn.Module
    tokenizer: Any
    pad_id: int
    sync: PolicySync
    report: TrainReport
    progress: Progress
    started: float = field(default_factory=time.monotonic)

    def held_out(self, phase: str) -> None:
        """Evaluate the served policy on the held-out tasks; into the report and ``train_metrics``."""
        result = evaluate(self.rig.collector, self.splits["eval"], phase=phase,
                          temperature=self.config.eval.temperature, model=self.sync.served_name)
        self.report.evaluations.append(result)
        self.rig.store.add_metrics(self.report.run_id, self.algorithm, len(self.report.steps),
                                   {f"eval_accuracy_{phase}": result.accuracy})

    def warm_start(self) -> None:
        """The configured SFT warm start, pushed to the engine and evaluated (nothing when not configured)."""
        if self.config.warm_start is None:
            return
        self.report.warm_start = warm_start(self.model, self.tokenizer, self.task_set, self.splits["train"],
                                            self.config.warm_start, pad_id=self.pad_id, progress=self.progress)
        self.report.warm_start["sync_s"] = self.sync.push(self.model).total_s
        self.held_out("warm_start")

    def finish(self) -> TrainReport:
        self.progress.stop()
        self.report.seconds = time.monotonic() - self.started
        self.report.write(self.config.run_dir / "report.json")
        return self.report


def open_job(stack: ExitStack, config: TrainConfig, console: Console, *, algorithm: str, n_train: int,
             lora: LoraConfig | None = None) -> Job:
    """Open the rig, load the policy (wrapped in LoRA when given), evaluate the base policy, start progress."""
    from spanlab.engine.model import resolve_model
    from spanlab.engine.weights import WeightSyncClient

    started = time.monotonic()
    task_set = load_task_set(config.dataset.name)
    splits = split_tasks(task_set, config, n_train)
    torch.set_num_threads(config.loop.torch_threads or torch.get_num_threads())
    report = TrainReport(run_name=config.run_name, algorithm=algorithm, model=config.engine.model, db=str(config.db))
    rig = open_rig(stack, config, console)
    client = stack.enter_context(WeightSyncClient(rig.root_url))
    model, tokenizer = load_policy(resolve_model(config.engine.model))
    if lora is not None:  # the engine then hot-loads the adapter after each update
        model = apply_lora(model, lora)
    sync = PolicySync(client, rig.store, config.run_dir, rig.served)
    job = Job(config, algorithm, rig, task_set, splits, model, tokenizer, pad_token_id(tokenizer), sync, report,
              progress_bar(console), started)
    job.held_out("base")
    stack.enter_context(job.progress)
    return job
