"""The GRPO steps: collect -> adapt -> update -> push, between the framework's base and final evaluation.

The loop is the data path of spanlab end to end, nothing sideways: rollouts run the real agent
through the recording gateway against vLLM; the adapter reads the exact sampled token IDs back from
the store; the GRPO step updates the policy; the engine reloads the new weights before the next
collection. Per-step metrics go into the store's ``train_metrics`` table. With ``trainer.processes: N``
the update runs on N data-parallel ranks (:mod:`spanlab.training.data_parallel`); this process stays
rank 0: it alone reads the samples from the store and pushes the weights (with ``sharding: fsdp``,
the weights gathered from all ranks). ``loop: {mode: async}`` runs the same parts with rollouts that
never wait for the trainer (:mod:`spanlab.algos.grpo.async_loop`). With ``policies`` (a policy per role) the sync
loop runs each policy's update on its roles' calls (:mod:`spanlab.algos.grpo.policy_parts`).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any

import torch

from spanlab.adapters.grpo import Sample, iter_samples
from spanlab.adapters.trainable import Dropped
from spanlab.algos.grpo.config import GRPOSection
from spanlab.algos.grpo.step_parts import StepParts
from spanlab.algos.grpo.update import grpo_step
from spanlab.jobs.job import Job
from spanlab.jobs.rollouts import RolloutBatch
from spanlab.training.data_parallel import DataParallel, load_trainable_model

logger = logging.getLogger(__name__)


def train_grpo(job: Job, settings: GRPOSection) -> None:
    """``settings.steps`` GRPO updates of the job's policy, each on ``tasks_per_step`` x ``group_size`` rollouts."""
    assert job.policy is not None, "GRPO trains weights: the framework loads the policy"
    policy, config = job.policy, job.config
    if config.policies is not None:  # a policy per role: the sync loop with each policy's update and push
        from spanlab.algos.grpo.policy_parts import policy_step_parts

        run_sync(policy_step_parts(job, settings), partial(_collect, job, settings),
                 job.steps(settings.steps, settings.tasks_per_step, "GRPO"))
        return
    update, push = _update(job, settings)
    group_key = None if config.loop.mode == "async" else "task_id"  # async groups carry their own group_id

    def adapt_and_update(rollout_ids: list[str]) -> dict[str, float]:
        dropped = Dropped()  # what the sample rule left out of this step (adapters/trainable.py)
        samples = list(iter_samples(job.rig.store, rollout_ids, group_key=group_key,
                                    token_source=config.token_source, tokenizer=policy.tokenizer,
                                    chat_template=config.retokenize_template, agents=config.agents,
                                    credit=settings.credit, failed_attempts=settings.failed_attempts,
                                    dropped=dropped))
        return update(samples) | dropped.metrics()

    parts = StepParts(adapt_and_update, push, job.log_step)
    if config.loop.mode == "async":
        from spanlab.algos.grpo.async_loop import train_grpo_async

        train_grpo_async(job, settings, parts)
        return
    collect = partial(_collect, job, settings)
    run_sync(parts, collect, job.steps(settings.steps, settings.tasks_per_step, "GRPO"))


def _collect(job: Job, settings: GRPOSection, tasks: list[dict[str, Any]], step: int) -> RolloutBatch:
    """A step's groups; with ``dynamic_sampling``, more rounds of new tasks while too few groups have a signal."""
    g, dynamic = settings.group_size, settings.dynamic_sampling
    batch = job.collect(tasks, group_size=g, step=step)
    if dynamic is None:
        return batch
    rng, asked = random.Random(f"spanlab-dynamic:{job.config.dataset.seed}:{step}"), {t["task_id"] for t in tasks}
    for round_ in range(1, dynamic.max_rounds + 1):
        if (have := groups_with_signal(batch.rewards, g)) >= dynamic.min_groups:
            break
        more = job.draw(rng, len(tasks), exclude=asked)
        if not more:
            break
        logger.info("step %d: %d of %d groups have a reward signal (want %d); sampling %d more tasks", step, have,
                    len(batch.rewards) // g, dynamic.min_groups, len(more))
        asked |= {t["task_id"] for t in more}
        extra = job.collect(more, group_size=g, step=step, round=round_)
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


def _update(job: Job, settings: GRPOSection) -> tuple[Callable[[list[Sample]], dict[str, float]], Callable[[], float]]:
    """One GRPO update of a step's samples (in this process, or on the configured data-parallel ranks), and the
    push of the updated weights to the engine (its seconds)."""
    assert job.policy is not None
    policy, trainer = job.policy, job.config.trainer
    make_optimizer = partial(torch.optim.AdamW, lr=settings.lr, weight_decay=settings.weight_decay)
    if trainer.processes == 1:  # the job keeps the optimizer: its state is saved with each step for --resume
        optimizer = job.attach_optimizer(make_optimizer(p for p in policy.model.parameters() if p.requires_grad))
        ref_model = _reference(policy.model) if settings.kl_beta > 0 else None
        draw_demos = _demonstration_draws(job, settings)

        def update_here(samples: list[Sample]) -> dict[str, float]:
            return grpo_step(policy.model, optimizer, samples, settings, pad_id=policy.pad_id, ref_model=ref_model,
                             demos=draw_demos())

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


def _demonstration_draws(job: Job, settings: GRPOSection) -> Callable[[], list[Sample] | None]:
    """Each update's demonstrations for ``grpo.demonstrations`` (None without it): ``per_step`` of the run's
    stored ones, drawn with a seed of the step, so a resumed run draws what the first would have."""
    term = settings.demonstrations
    if term is None:
        return lambda: None
    data = job.config.dataset
    if job.config.warm_start is not None:  # the warm start recorded its demonstrations: the term replays those
        pool = job.demonstrations.warm_start()
    else:
        levels = set(term.levels or data.levels)
        tasks = [t for t in job.splits["train"] if t.get("level") in levels or "level" not in t][: term.demos]
        pool = job.demonstrations.stored(tasks, "grpo.demonstrations", key="grpo.demonstrations")
    logger.info("grpo.demonstrations: %d stored demonstrations, %d per update, coef %g", len(pool), term.per_step,
                term.coef)

    def draw() -> list[Sample]:
        rng = random.Random(f"spanlab-demos:{data.seed}:{len(job.report.steps)}")
        return rng.sample(pool, min(term.per_step, len(pool)))

    return draw


def _reference(model: torch.nn.Module) -> torch.nn.Module:
    """A frozen copy of the policy as RL starts (after the warm start): ``kl_beta`` keeps the policy near what the
    demonstrations taught while RL learns what they did not."""
    import copy

    ref = copy.deepcopy(model).eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref
