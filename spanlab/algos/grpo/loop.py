"""The GRPO steps: collect -> adapt -> update -> push, between the framework's base and final evaluation.

The loop is the data path of spanlab end to end, nothing sideways: rollouts run the real agent
through the recording gateway against vLLM; the adapter reads the exact sampled token IDs back from
the store; the GRPO step updates the policy; the engine reloads the new weights before the next
collection. Per-step metrics go into the store's ``train_metrics`` table.

The loop takes named parts, never the job (:mod:`spanlab.jobs.parts`): a collector, a task stream, the
step log, the policy, the demonstrations and a trainer. The trainer (:mod:`spanlab.training.trainers`) is
the framework's: it runs :func:`~spanlab.algos.grpo.update.grpo_step` in this process, on
``trainer.processes: N`` data-parallel ranks (FSDP or not), or with ``policies`` once per policy on its
roles' calls (:mod:`spanlab.policies.trainer`), and pushes what changed. ``loop: {mode: async}`` runs
the same parts with rollouts that never wait for the trainer (:mod:`spanlab.algos.grpo.async_loop`).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from typing import Any

import torch

from spanlab.adapters.sample_reader import iter_samples
from spanlab.adapters.samples import Sample
from spanlab.adapters.trainable import Dropped
from spanlab.algos.grpo.config import GRPOSection
from spanlab.algos.grpo.nll_terms import ReplayDraw
from spanlab.algos.grpo.step_parts import StepParts
from spanlab.algos.grpo.update import grpo_step
from spanlab.jobs.config import TrainConfig
from spanlab.jobs.parts import Collector, Demonstrations, StepLog, TaskStream
from spanlab.jobs.rollouts import RolloutBatch
from spanlab.store.base import StoreAPI
from spanlab.training.policy import Policy
from spanlab.training.trainers import MakeOptimizer, Trainer, TrainStep

logger = logging.getLogger(__name__)


def grpo_step_function(settings: GRPOSection, policy: Policy) -> tuple[TrainStep, MakeOptimizer]:
    """The GRPO update as a trainer runs it (picklable: it crosses into data-parallel ranks) and its optimizer;
    with ``kl_beta`` the step holds a frozen copy of the policy as RL starts."""
    ref_model = _reference(policy.model) if settings.kl_beta > 0 else None
    step = partial(grpo_step, config=settings, pad_id=policy.pad_id, ref_model=ref_model)
    return step, partial(torch.optim.AdamW, lr=settings.lr, weight_decay=settings.weight_decay)


def train_grpo(settings: GRPOSection, config: TrainConfig, *, policy: Policy, trainer: Trainer, store: StoreAPI,
               collector: Collector, tasks: TaskStream, log: StepLog, demos: Demonstrations | None) -> None:
    """``settings.steps`` GRPO updates of ``policy`` through ``trainer``, each on ``tasks_per_step`` x ``group_size``
    rollouts read back from ``store``. ``config``: how samples are read (token source, roles) and which loop runs;
    ``demos``: the run's demonstrations, for ``grpo.demonstrations``."""
    draw_demos = _demonstration_draws(settings, config, demos, log.done)
    draw_replay = _replay_draws(settings, config.dataset.seed, store, log.done)
    group_key = None if config.loop.mode == "async" else "task_id"  # async groups carry their own group_id

    def update(rollout_ids: list[str]) -> dict[str, float]:
        dropped = Dropped()  # what the sample rule left out of this step (adapters/trainable.py)
        read = partial(_read_samples, store, rollout_ids, group_key=group_key, token_source=config.token_source,
                       tokenizer=policy.tokenizer, chat_template=config.retokenize_template, credit=settings.credit,
                       failed_attempts=settings.failed_attempts, dropped=dropped)
        return trainer.update(read, demos=draw_demos(), replay=draw_replay(rollout_ids)) | dropped.metrics()

    parts = StepParts(update, trainer.push, log.log)
    if config.loop.mode == "async":
        from spanlab.algos.grpo.async_loop import train_grpo_async

        train_grpo_async(settings, config.loop, parts, policy=policy, collector=collector, tasks=tasks, log=log)
        return
    collect = partial(_collect, settings, config.dataset.seed, collector.collect, tasks.draw)
    run_sync(parts, collect, tasks.steps(settings.steps, settings.tasks_per_step, "GRPO"))


def _read_samples(store: StoreAPI, rollout_ids: list[str], agents: Sequence[str] | None,
                  **adapter_options: Any) -> list[Sample]:
    """A step's samples of the roles ``agents`` (None: every role), as the adapter reads them from the store."""
    return list(iter_samples(store, rollout_ids, agents=agents, **adapter_options))


def _collect(settings: GRPOSection, seed: int, collect: Callable[..., RolloutBatch], draw: Callable[..., Any],
             tasks: list[dict[str, Any]], step: int) -> RolloutBatch:
    """A step's groups; with ``dynamic_sampling``, more rounds of new tasks (``draw``, seeded by the dataset
    ``seed`` and the step) while too few groups have a signal."""
    g, dynamic = settings.group_size, settings.dynamic_sampling
    batch = collect(tasks, group_size=g, step=step)
    if dynamic is None:
        return batch
    rng, asked = random.Random(f"spanlab-dynamic:{seed}:{step}"), {t["task_id"] for t in tasks}
    for round_ in range(1, dynamic.max_rounds + 1):
        if (have := groups_with_signal(batch.rewards, g)) >= dynamic.min_groups:
            break
        more = draw(rng, len(tasks), exclude=asked)
        if not more:
            break
        logger.info("step %d: %d of %d groups have a reward signal (want %d); sampling %d more tasks", step, have,
                    len(batch.rewards) // g, dynamic.min_groups, len(more))
        asked |= {t["task_id"] for t in more}
        extra = collect(more, group_size=g, step=step, round=round_)
        batch = RolloutBatch(batch.rollout_ids + extra.rollout_ids, batch.rewards + extra.rewards,
                             batch.seconds + extra.seconds, batch.failed + extra.failed)
    return batch


def groups_with_signal(rewards: list[float], group_size: int) -> int:
    """Groups (``group_size`` consecutive rollouts, as queued) whose rewards are not all equal."""
    return sum(len(set(rewards[i:i + group_size])) > 1 for i in range(0, len(rewards), group_size))


def run_sync(parts: StepParts, collect: Callable[[list[dict[str, Any]], int], RolloutBatch],
             steps: Iterable[tuple[int, list[dict[str, Any]]]]) -> None:
    """Each step: queue its groups and wait for every rollout, update on them, push, log."""
    started, finished = parts.clock(), 0
    for step, tasks in steps:
        batch = collect(tasks, step)
        finished += len(batch.rollout_ids)
        metrics = parts.update(batch.rollout_ids)
        metrics.update(rollout_s=batch.seconds, rollout_failed=batch.failed, sync_s=parts.push_if_updated(metrics))
        metrics.update(loop_s=parts.clock() - started, rollouts_finished=float(finished))
        parts.log_step(metrics)


def _demonstration_draws(settings: GRPOSection, config: TrainConfig, demos: Demonstrations | None,
                         steps_done: Callable[[], int]) -> Callable[[], list[Sample] | None]:
    """Each update's demonstrations for ``grpo.demonstrations`` (None without it): ``per_step`` of the run's
    stored ones, drawn with a seed of the step, so a resumed run draws what the first would have."""
    term = settings.demonstrations
    if term is None:
        return lambda: None
    assert demos is not None, "grpo.demonstrations: the run's demonstrations are a part of the job"
    data = config.dataset
    if config.warm_start is not None:  # the warm start recorded its demonstrations: the term replays those
        pool = demos.warm_start()
    else:
        levels = set(term.levels or data.levels)
        tasks = [t for t in demos.train if t.get("level") in levels or "level" not in t][: term.demos]
        pool = demos.stored(tasks, "grpo.demonstrations", key="grpo.demonstrations")
    logger.info("grpo.demonstrations: %d stored demonstrations, %d per update, coef %g", len(pool), term.per_step,
                term.coef)

    def draw() -> list[Sample]:
        rng = random.Random(f"spanlab-demos:{data.seed}:{steps_done()}")
        return rng.sample(pool, min(term.per_step, len(pool)))

    return draw


def _replay_draws(settings: GRPOSection, seed: int, store: StoreAPI,
                  steps_done: Callable[[], int]) -> Callable[[list[str]], ReplayDraw | None]:
    """Each update's :class:`ReplayDraw` for ``grpo.replay`` (None without it): a seed of the step, so a resumed run
    replays what the first would have, and with ``levels`` the step's rollouts whose task (the rollout's input, as
    the store holds it) is of those levels. The rows themselves are the step's samples (:mod:`.nll_terms`)."""
    term = settings.replay
    if term is None:
        return lambda rollout_ids: None
    levels = None if term.levels is None else set(term.levels)
    logger.info("grpo.replay: up to %d all-solved groups per update (levels %s), coef %g", term.per_step,
                "all" if levels is None else sorted(levels), term.coef)

    def draw(rollout_ids: list[str]) -> ReplayDraw:
        step_seed = f"spanlab-replay:{seed}:{steps_done()}"
        if levels is None:
            return ReplayDraw(step_seed)
        of_levels = frozenset(r.rollout_id for r, _ in store.last_attempts(rollout_ids) if _of_levels(r.input, levels))
        return ReplayDraw(step_seed, of_levels)

    return draw


def _of_levels(task: Any, levels: set[int]) -> bool:
    """A task of one of ``levels``; a task with no level counts (as ``grpo.demonstrations.levels`` filters)."""
    return not isinstance(task, dict) or "level" not in task or task["level"] in levels


def _reference(model: torch.nn.Module) -> torch.nn.Module:
    """A frozen copy of the policy as RL starts (after the warm start): ``kl_beta`` keeps the policy near what the
    demonstrations taught while RL learns what they did not."""
    import copy

    ref = copy.deepcopy(model).eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref
