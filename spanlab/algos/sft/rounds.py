"""Reward-filtered fine-tuning rounds: collect -> filter -> train -> serve, between the framework's evaluations.

Rejection-sampling fine-tuning, the Unsloth example of the seeds (REFERENCE.md §5) done on exact token
IDs: each round samples several rollouts per task from the served policy, keeps the rewarded ones
(``sft.filter``: a threshold, the top fraction or the best n per task; deduplicated; only the roles in
``agents``; only trainable samples, :mod:`spanlab.adapters.trainable`, the rest counted as ``dropped_*``),
fine-tunes on their sampled tokens and pushes the new weights to the engine, so the next round samples from
the improved policy. Every round's dataset is kept as Parquet in the run folder and its figures go to
``train_metrics``.

Replay (``sft.replay``): the kept examples are what the policy already gets right, often a handful of one
kind of task, and fine-tuning on those alone pulls the model away from the rest of what the warm start
taught it (on the SQL tutorial: level 1 up, level 2 down). Mixing a seeded draw of the warm start's
demonstrations into each round keeps that data in the training mix. They are not in the round's Parquet
(which holds rollouts only); ``replay_examples`` counts them.

Trainers: Unsloth (``FastLanguageModel`` + LoRA + TRL) when it is importable and chosen, else the plain
torch trainer of :mod:`spanlab.training.supervised` (full fine-tuning, or LoRA via peft).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from spanlab.adapters.conversation import encode_conversation
from spanlab.adapters.filtered_dataset import IGNORE_INDEX, build_sft_dataset, rows_from_table, write_dataset
from spanlab.adapters.samples import Sample
from spanlab.adapters.trainable import Dropped
from spanlab.algos.sft.config import SFTRoundsConfig
from spanlab.errors import ConfigError
from spanlab.jobs.config import TrainConfig, WarmStartConfig
from spanlab.jobs.parts import Collector, StepLog, TaskStream
from spanlab.progress import PhaseProgress
from spanlab.store.base import StoreAPI
from spanlab.training.model import MissingDependencyError, apply_lora
from spanlab.training.policy import Policy
from spanlab.training.supervised import sft_sample, sft_train

Demonstration = Callable[[dict[str, Any]], dict[str, Any]]  # a task set's demonstration(task)
TrainPolicy = Callable[[Callable[[torch.nn.Module], tuple[torch.nn.Module, dict[str, float]]]], dict[str, float]]

logger = logging.getLogger(__name__)


def train_sft(rounds: SFTRoundsConfig, config: TrainConfig, *, policy: Policy, train_policy: TrainPolicy,
              store: StoreAPI, collector: Collector, tasks: TaskStream, log: StepLog, progress: PhaseProgress,
              demonstration: Demonstration | None, replay_from: list[dict[str, Any]]) -> None:
    """``rounds.rounds`` rounds of collect -> filter -> train -> serve on ``policy``. ``train_policy``: the job's
    torch round (it keeps the model a round returns); ``demonstration`` and ``replay_from``: what ``sft.replay``
    draws from (:func:`replay_pool`)."""
    backend = choose_backend(rounds)
    model_dir: Path | None = None  # Unsloth trains from a folder: the latest full weights

    def replay(r: int) -> list[Sample]:
        return replay_samples(demonstration, replay_from, policy.tokenizer, rounds.replay,
                              seed=config.dataset.seed, round_index=r)

    for r, round_tasks in tasks.steps(rounds.rounds, rounds.tasks_per_round, "SFT rounds"):
        batch = collector.collect(round_tasks, group_size=rounds.samples_per_task, round=r)
        dropped = Dropped()  # what the sample rule left out before the filter (adapters/trainable.py)
        table, stats = build_sft_dataset(store, batch.rollout_ids, rounds.filter, agents=config.agents,
                                         dropped=dropped)
        write_dataset(table, config.run_dir / f"round-{r}.parquet")
        metrics: dict[str, float] = {"reward_mean": batch.mean_reward, "rollout_s": batch.seconds,
                                     "rollout_failed": batch.failed, **stats.metrics(), **dropped.metrics()}
        if table.num_rows == 0:
            logger.warning("round %d: the filter kept no examples (reward mean %.2f); nothing to train on",
                           r, batch.mean_reward)
        elif backend == "unsloth":
            replayed = replay(r)
            model_dir = model_dir or _save_full(policy.model, policy.tokenizer, config.run_dir / "start")
            rows = rows_from_table(table) + [_row(s) for s in replayed]
            model_dir, trained = _unsloth_round(model_dir, rows, rounds, config.run_dir / f"round-{r}")
            metrics.update(trained, replay_examples=len(replayed), sync_s=policy.sync.push_dir(model_dir).total_s)
        else:
            replayed = replay(r)
            samples, weights = samples_from_table(table)
            trained = train_policy(partial(_torch_round, samples=samples + replayed,
                                           weights=weights + [1.0] * len(replayed), rounds=rounds,
                                           pad_id=policy.pad_id, progress=progress, label=f"round {r}"))
            metrics.update(trained, replay_examples=len(replayed), sync_s=policy.push())
        log.log(metrics)
        if rounds.eval_each_round and r < rounds.rounds - 1:
            log.held_out(f"round_{r + 1}")


def choose_backend(rounds: SFTRoundsConfig) -> str:
    """``unsloth`` or ``torch``; asking for Unsloth where it cannot import (or with ``save: adapter``) is an
    error that says so."""
    if rounds.backend == "torch":
        return "torch"
    if rounds.save == "adapter":  # Unsloth rounds continue from merged weights; adapters are the torch trainer's
        if rounds.backend == "unsloth":
            raise ConfigError("sft.save: adapter is not supported with sft.backend: unsloth (each Unsloth round "
                              "merges its LoRA); use save: merged, or backend: torch with lora")
        return "torch"
    from spanlab.algos.sft.unsloth import unsloth_available

    available = unsloth_available()
    if rounds.backend == "unsloth" and not available:
        raise MissingDependencyError("sft.backend: unsloth is not importable here; install it (README, "
                                     "'Unsloth') or set sft.backend: torch")
    backend = "unsloth" if available else "torch"
    logger.info("SFT trainer: %s", backend)
    return backend


def replay_pool(demo_tasks: list[dict[str, Any]], warm_start: WarmStartConfig | None, n: int) -> list[dict[str, Any]]:
    """The train tasks replay draws from: the warm start's demonstrations (its first ``demos`` demo tasks), or
    the first ``n`` of them when the run has no warm start."""
    return demo_tasks[: warm_start.demos if warm_start is not None else n]


def replay_samples(demonstration: Demonstration | None, pool: list[dict[str, Any]],
                   tokenizer: Any, n: int, *, seed: int, round_index: int) -> list[Sample]:
    """``n`` demonstrations of tasks drawn from ``pool`` (seeded by ``seed`` and the round, so each round replays
    another draw), encoded with the policy's chat template exactly as the warm start encodes them."""
    if n == 0:
        return []
    if demonstration is None:
        raise ConfigError("sft.replay: the task set has no demonstrations to replay; set replay: 0")
    chosen = random.Random(f"replay-{seed}-{round_index}").sample(pool, min(n, len(pool)))
    return [encode_conversation(tokenizer, d["messages"], d.get("tools")) for d in map(demonstration, chosen)]


def _row(sample: Sample) -> dict[str, Any]:
    """A trainer sample as an SFT row (labels -100 off the loss mask), weight 1."""
    labels = np.where(sample.loss_mask.astype(bool), sample.input_ids, IGNORE_INDEX)
    return {"input_ids": sample.input_ids.tolist(), "labels": labels.tolist(), "weight": 1.0}


def samples_from_table(table: pa.Table) -> tuple[list[Sample], list[float]]:
    """Trainer samples (loss mask = labels != -100) and their weights, from an SFT dataset table."""
    samples, weights = [], []
    for row in rows_from_table(table):
        mask = (np.asarray(row["labels"]) != IGNORE_INDEX).astype(np.uint8)
        samples.append(sft_sample(np.asarray(row["input_ids"], dtype=np.int32), mask))
        weights.append(float(row["weight"]))
    return samples, weights


def _torch_round(model: torch.nn.Module, *, samples: list[Sample], weights: list[float], rounds: SFTRoundsConfig,
                 pad_id: int, progress: PhaseProgress, label: str) -> tuple[torch.nn.Module, dict[str, float]]:
    """One round of the plain trainer. A LoRA config wraps the model first; ``save: merged`` folds the adapter
    back in after the round (the engine reloads full weights, the next round starts a fresh adapter),
    ``save: adapter`` keeps training the same adapter and the engine hot-loads it."""
    if rounds.lora is not None and not hasattr(model, "peft_config"):
        model = apply_lora(model, rounds.lora)
    metrics = sft_train(model, samples, rounds.train, pad_id=pad_id, progress=progress, weights=weights, label=label)
    if hasattr(model, "peft_config") and rounds.save == "merged":
        model = model.merge_and_unload()
    return model, metrics


def _unsloth_round(model_dir: str | Path, rows: list[dict[str, Any]], rounds: SFTRoundsConfig,
                   out_dir: Path) -> tuple[Path, dict[str, float]]:
    from spanlab.algos.sft.unsloth import train_unsloth_in_child

    lora = rounds.lora
    result = train_unsloth_in_child(str(model_dir), rows, lr=rounds.train.lr,
                                    epochs=rounds.train.epochs, batch_size=rounds.train.batch_size,
                                    lora_r=lora.rank if lora else 16, lora_alpha=int(lora.alpha) if lora else 32,
                                    max_len=rounds.train.max_len, seed=rounds.train.seed, out_dir=out_dir,
                                    save="merged")
    path = Path(result.pop("path"))
    return path, {k: float(v) for k, v in result.items()}


def _save_full(model: torch.nn.Module, tokenizer: Any, out: Path) -> Path:
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    return out
