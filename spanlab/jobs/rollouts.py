"""Collecting rollouts for an algorithm: queue tasks in the store, run the agent on them, read rewards.

Every algorithm needs the same two things from the data path: "run the agent on these tasks with the
current policy" (to train on) and "how often is it right on these tasks" (to evaluate). Both go the
whole way: rollouts are queued in the store, a runner ``Worker`` runs the agent, the agent calls the
model through the recording gateway, and rewards land in the store as reward spans. Nothing here
talks to the model directly, so what is evaluated is exactly what is trained on.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

from spanlab.gateway.seeding import SAMPLING_SEED, rollout_seed
from spanlab.jobs.background import BackgroundRollouts, serve_locally
from spanlab.runner.agent import load_agent
from spanlab.runner.worker import RolloutDone, Worker, run_then_close
from spanlab.store.base import StoreAPI
from spanlab.types import METRIC_ATTRIBUTE, Rollout, RolloutConfig, RolloutMode

if TYPE_CHECKING:
    from spanlab.runner.ray_runner import RayRunner

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RolloutBatch:
    """The rollouts of one collection round and what they scored."""

    rollout_ids: list[str]
    rewards: list[float]  # one per rollout; a rollout that ended without a reward counts 0
    seconds: float
    failed: int

    @property
    def mean_reward(self) -> float:
        return sum(self.rewards) / len(self.rewards) if self.rewards else 0.0


@dataclass
class RolloutCollector:
    """Runs an agent (by registered name) on tasks through the gateway; one instance per training run."""

    store: StoreAPI
    gateway_url: str
    agent_name: str
    agent_kwargs: dict[str, Any]
    concurrency: int = 8
    timeout_s: float = 600.0
    # runner.backend: ray. Its workers can be lost mid-rollout, so their attempts are retried; local ones are not.
    remote: RayRunner | None = None
    worker_concurrency: int = 8
    max_attempts: int = 1
    unresponsive_s: float | None = None
    gateway_token: str | None = None  # the gateway's bearer token, given to the agents as their api_key
    seed: int | None = None  # rollouts.seed: each queued rollout gets a sampling seed (spanlab.gateway.seeding)
    _queued: Counter[int] = field(default_factory=Counter)  # rollouts queued so far per identity, for their seeds

    def collect(
        self,
        tasks: Sequence[dict[str, Any]],
        *,
        mode: RolloutMode,
        group_size: int = 1,
        metadata: dict[str, Any] | None = None,
        done: dict[tuple[str, int], str] | None = None,
        on_finished: RolloutDone | None = None,
        **agent_overrides: Any,
    ) -> RolloutBatch:
        """Queue ``group_size`` rollouts per task, run them all, return their rewards in queue order.

        ``done`` maps ``(group_id, sample)`` to a finished rollout already in the store (a resumed run's
        interrupted step): those are not run again, only counted in the batch at their place.
        ``on_finished`` hears of each rollout run here as it ends (its reward), for a progress bar.
        """
        rollouts = self.rollouts_for(tasks, mode=mode, group_size=group_size, metadata=metadata)
        if not done:
            return self.run(rollouts, on_finished=on_finished, **agent_overrides)
        key = lambda r: (r.metadata["group_id"], r.metadata["sample"])  # noqa: E731
        todo = [r for r in rollouts if key(r) not in done]
        ran = self.run(todo, on_finished=on_finished, **agent_overrides) if todo else RolloutBatch([], [], 0.0, 0)
        new = iter(ran.rollout_ids)
        ids = [done[key(r)] if key(r) in done else next(new) for r in rollouts]
        rewards = final_rewards(self.store, ids)
        logger.info("reused %d finished rollouts of an interrupted run, ran %d", len(rollouts) - len(todo), len(todo))
        return RolloutBatch(ids, [rewards.get(i, 0.0) for i in ids], ran.seconds, ran.failed)

    def rollouts_for(self, tasks: Sequence[dict[str, Any]], *, mode: RolloutMode, group_size: int = 1,
                     metadata: dict[str, Any] | None = None) -> list[Rollout]:
        """``group_size`` rollouts per task (not queued yet), each tagged with its group and sample index."""
        config = RolloutConfig(timeout_s=self.timeout_s, max_attempts=1)
        return [Rollout(input=task, mode=mode, config=config,
                        metadata={**(metadata or {}), "group_id": str(task.get("task_id", i)), "sample": k})
                for i, task in enumerate(tasks) for k in range(group_size)]

    def enqueue(self, rollouts: Sequence[Rollout]) -> list[str]:
        """Queue rollouts (on Ray with the lost-worker retry policy); their IDs in order. With a ``seed``, each
        gets its sampling seed in its metadata, from what it is (mode, step, task, sample), so the same config
        samples the same tokens."""
        if self.seed is not None:
            rollouts = [self._seeded(r) for r in rollouts]
        if self.remote is not None:
            rollouts = [r.model_copy(update={"config": self._lost_worker_policy(r.config)}) for r in rollouts]
        return [r.rollout_id for r in self.store.enqueue(list(rollouts))]

    def _seeded(self, rollout: Rollout) -> Rollout:
        assert self.seed is not None
        first = rollout_seed(self.seed, rollout.mode, rollout.metadata)  # its identity; a repeat counts up from it
        occurrence = self._queued[first]
        self._queued[first] += 1
        seed = rollout_seed(self.seed, rollout.mode, rollout.metadata, occurrence)
        return rollout.model_copy(update={"metadata": {**rollout.metadata, SAMPLING_SEED: seed}})

    def background(self, mode: RolloutMode = "train", **agent_overrides: Any) -> BackgroundRollouts:
        """Workers that run whatever ``mode`` rollouts the store queues until closed (the async loop's)."""
        kwargs = {**self.agent_kwargs, **agent_overrides}
        if self.remote is None:
            serve = serve_locally(self.store, self.agent_name, kwargs, gateway_url=self.gateway_url,
                                  concurrency=self.concurrency, mode=mode, gateway_token=self.gateway_token)
        else:
            remote, concurrency = self.remote, self.worker_concurrency
            serve = partial(remote.serve, agent_name=self.agent_name, agent_kwargs=kwargs,
                            gateway_url=self.gateway_url, mode=mode, concurrency=concurrency,
                            gateway_token=self.gateway_token)
        return BackgroundRollouts(serve, join_timeout_s=self.timeout_s)

    def run(self, rollouts: Sequence[Rollout], *, on_finished: RolloutDone | None = None,
            **agent_overrides: Any) -> RolloutBatch:
        """Queue these rollouts, run the agent on them, return their rewards in order.

        Workers take only rollouts of the batch's mode; a batch of several modes (APO runs its held-out and
        validation rollouts together) lets them take any waiting rollout."""
        started = time.monotonic()
        ids = self.enqueue(rollouts)
        kwargs = {**self.agent_kwargs, **agent_overrides}
        modes = {r.mode for r in rollouts}
        mode = modes.pop() if len(modes) == 1 else None
        if self.remote is not None:
            self.remote.run(ids, agent_name=self.agent_name, agent_kwargs=kwargs, gateway_url=self.gateway_url,
                            mode=mode, concurrency=self.worker_concurrency, gateway_token=self.gateway_token,
                            on_ended=on_finished)
            failed = sum(a.status in ("failed", "timeout") for _, a in self.store.last_attempts(ids))
        else:
            agent = load_agent(self.agent_name, kwargs)
            worker = Worker(self.store, agent, gateway_url=self.gateway_url, concurrency=self.concurrency, mode=mode,
                            gateway_token=self.gateway_token, on_finished=on_finished)
            stats = asyncio.run(run_then_close(worker, agent, len(ids)))
            failed = stats.failed + stats.timeout
        rewards = final_rewards(self.store, ids)
        return RolloutBatch(ids, [rewards.get(i, 0.0) for i in ids], time.monotonic() - started, failed)

    def _lost_worker_policy(self, config: RolloutConfig) -> RolloutConfig:
        """On Ray a worker can be lost mid-rollout: every rollout gets an ``unresponsive_s`` limit, and one that
        asked for no retries (every algorithm's default) is retried when, and only when, its worker is lost."""
        update: dict[str, Any] = {"unresponsive_s": config.unresponsive_s or self.unresponsive_s}
        if config.max_attempts == 1:
            update |= {"max_attempts": self.max_attempts, "retry_on": ("unresponsive",)}
        return config.model_copy(update=update)


def final_rewards(store: StoreAPI, rollout_ids: Sequence[str]) -> dict[str, float]:
    """``rollout_id -> final reward`` of each rollout's last attempt (absent: it recorded none)."""
    if not rollout_ids:
        return {}
    return {s.rollout_id: s.final_reward for s in store.rollout_summaries(rollout_ids) if s.final_reward is not None}


def rollout_metrics(store: StoreAPI, rollout_ids: Sequence[str]) -> dict[str, dict[str, float]]:
    """``rollout_id -> {metric name: value}`` that each rollout's last attempt recorded with ``ctx.add_metric``
    (a name recorded twice: its last value). Rollouts that recorded none are absent."""
    if not rollout_ids:
        return {}
    last = [a.attempt_id for _, a in store.last_attempts(list(rollout_ids))]
    out: dict[str, dict[str, float]] = {}
    if not last:
        return out
    for span in store.iter_spans(attempt_ids=last, kinds=["custom"]):  # in sequence order: a later value wins
        value = span.attributes.get(METRIC_ATTRIBUTE)
        if span.rollout_id is not None and isinstance(value, int | float) and not isinstance(value, bool):
            out.setdefault(span.rollout_id, {})[span.name] = float(value)
    return out


def cancel_leftovers(store: StoreAPI, why: str = "left queued by an earlier run") -> int:
    """Cancel rollouts still queued (an earlier, interrupted run's), so no later worker picks them up."""
    left = [r for status in ("queuing", "requeuing") for r in store.list_rollouts(status=status, limit=100_000)]
    for rollout in left:
        store.cancel_rollout(rollout.rollout_id)
    if left:
        logger.warning("cancelled %d rollouts %s", len(left), why)
    return len(left)
