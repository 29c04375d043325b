"""``loop: {mode: async}``: GRPO whose rollouts never wait for the trainer, on data at most K versions old.

A :class:`~spanlab.jobs.groups.GroupQueue` keeps ``in_flight_groups`` groups queued or running in the store,
and workers that run for the whole loop (:mod:`spanlab.jobs.background`: the local collector's worker on a
thread, or the Ray actors) take them from the store's queue while the trainer updates. Each step takes the
next full groups sampled at most ``max_staleness`` versions ago (older ones are dropped and counted; the
rules are in :mod:`spanlab.jobs.groups`), updates on them and pushes. The update is the sync loop's, with
truncated importance sampling against the engine's logprobs (``grpo.tis_cap``, on by default) correcting for
the older policy that sampled; ``mismatch_kl`` reports how far that policy was.

Weight pushes do not abort running requests: a full reload pauses vLLM with ``mode=wait`` (running requests
finish on the old weights, new ones wait for the new), and here a LoRA push pauses the same way. Spans keep
the version their engine served when each call was sent (``attributes.policy_version``); a call sent while a
push is under way is labelled with the old version though it may run on the new weights, so labels err old,
never new. When the steps are done the queue cancels what is still queued or running (counted as
``end_*`` metrics) before the workers stop: nothing is left leased.

Left out: overlapping the push itself with training (the trainer waits for the drain), resuming (``--resume``
refuses an async run), and an engine without pause (refused at the start).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterable

from spanlab.algos.grpo.config import GRPOSection
from spanlab.algos.grpo.step_parts import StepParts
from spanlab.engine.errors import WeightSyncError
from spanlab.engine.weights import ReplicaWeightSync
from spanlab.errors import ConfigError
from spanlab.jobs.background import BackgroundRollouts
from spanlab.jobs.config import LoopConfig
from spanlab.jobs.groups import EndCounts, GroupQueue
from spanlab.jobs.parts import Collector, StepLog, TaskStream
from spanlab.training.policy import Policy

logger = logging.getLogger(__name__)


def run_async(parts: StepParts, queue: GroupQueue, workers: BackgroundRollouts, steps: Iterable[int],
              groups_per_step: int, flush: Callable[[], object] = lambda: None) -> EndCounts:
    """Start ``workers``; each step take ``groups_per_step`` ready groups within the bound, update on them, push,
    log; at the end cancel what is outstanding (before the workers stop) and return those counts."""
    with workers:
        queue.check = workers.check
        try:
            started, finished = parts.clock(), 0
            for _step in steps:
                take = queue.take(groups_per_step)
                flush()  # the gateway's spans of the taken rollouts are in the store before the adapter reads them
                finished += len(take.rollout_ids) + take.dropped_finished
                metrics = parts.update(take.rollout_ids)
                metrics |= take.metrics(queue.max_staleness)
                metrics.update(dropped_stale_total=float(queue.dropped_total), sync_s=parts.push_if_updated(metrics))
                metrics.update(loop_s=parts.clock() - started, rollouts_finished=float(finished))
                parts.log_step(metrics)
        finally:
            end = queue.close()
    return end


def check_engines_can_pause(engines: ReplicaWeightSync) -> None:
    """An engine without vLLM's pause route would have its running requests mix old and new weights."""
    try:
        engines.check_can_pause()
    except WeightSyncError as exc:
        raise ConfigError(f"loop.mode: async lets running requests finish on the old weights by pausing the "
                          f"engine at each push, which needs vLLM's dev routes: {exc}") from exc


def train_grpo_async(settings: GRPOSection, loop: LoopConfig, parts: StepParts, *, policy: Policy,
                     collector: Collector, tasks: TaskStream, log: StepLog) -> None:
    """The async loop on the collector's store and workers and the policy's engines; the end counts go to
    ``train_metrics`` (``log.record``)."""
    check_engines_can_pause(policy.sync.client)
    if settings.tis_cap is None:
        logger.warning("grpo.tis_cap is null: the async loop trains on older versions' samples uncorrected")
    policy.sync.pause_lora = True
    if policy.sync.version == 0 and hasattr(policy.model, "peft_config"):
        policy.push()  # serve the adapter before any rollout: every rollout then asks for the name pushes update
    per_step = min(settings.tasks_per_step, tasks.size)
    queued = itertools.chain.from_iterable(tasks.draws(settings.tasks_per_step))
    queue = GroupQueue(collector.rollouts, queued, settings.group_size, in_flight=loop.groups_in_flight(per_step),
                       max_staleness=loop.staleness, metadata={"run_id": collector.run_id, "loop": "async"},
                       on_wait=lambda ready, wanted: tasks.note(
                           f"{ready}/{wanted} groups ready" if ready < wanted else "updating"))
    steps = (step for step, _ in tasks.steps(settings.steps, settings.tasks_per_step, "GRPO async"))
    end = run_async(parts, queue, collector.background(), steps, per_step, flush=collector.flush)
    log.record(end.metrics())
