"""The async loop's queue of rollout groups: keep G outstanding, hand out full fresh ones, drop stale ones.

A *group* is ``group_size`` rollouts of one task (GRPO's unit: advantages are relative within it). The queue
keeps ``in_flight`` groups outstanding in the store (queued, running, or finished and not yet trained) by
enqueuing a new group for every one the trainer takes or drops, so rollout workers always have work.

Versions. Every rollout records the resources it was dequeued under (``rollouts.resources_version``, e.g.
``policy@7``, written by the store at its first dequeue); the trainer's current version is the latest
``policy`` resource (each weight push records one). A rollout's calls all run after its dequeue, on weights at
least that new, so ``current - dequeued`` is an upper bound of how stale any of its tokens is: a rule on it
never trains on anything older than the bound. A group's version is its oldest member's.

The rules, applied whenever the trainer asks for groups (the version only moves at a push, just before):

* a group is *ready* when every member has ended (succeeded, failed or cancelled), as in the sync loop. Ended is
  not trained: the update reads a ready group through the sample rule (:mod:`spanlab.adapters.trainable`), which
  leaves out its failed, timed-out and cancelled members (unless ``grpo.failed_attempts`` keeps them) and counts
  them in the step's ``dropped_*`` metrics; a group left with fewer than half its members says so in the log;
* a group whose oldest member is more than ``max_staleness`` versions behind is *dropped*: its members
  still queued or running are cancelled, and its rollouts are counted, never trained on. A late member
  therefore keeps its group waiting until it ends or until the group falls too far behind, whichever is first;
* ``take(n)`` returns the first ``n`` ready groups in queue order; ready groups beyond ``n`` are carried over.
  Each group has its own ``metadata.group_id`` (``task_id#serial``), so two groups of one task drawn close
  together stay two advantage groups (read them with ``iter_samples(..., group_key=None)``).

``close`` cancels everything still outstanding and counts it. Left out: a per-rollout (rather than per-group)
staleness rule, and priorities among ready groups other than queue order.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from spanlab.errors import NotFoundError
from spanlab.jobs.rollouts import RolloutCollector
from spanlab.store.base import RolloutSummary, StoreAPI

logger = logging.getLogger(__name__)

TERMINAL = ("succeeded", "failed", "cancelled")
POLICY_RESOURCE = "policy"  # the resource every weight push records (spanlab.training.policy.PolicySync)


def policy_version(resources_version: str | None, name: str = POLICY_RESOURCE) -> int:
    """The ``name`` version in a ``name@v,other@w`` reference; 0 when it names none (the base weights)."""
    for ref in (resources_version or "").split(","):
        key, _, version = ref.partition("@")
        if key == name and version.isdigit():
            return int(version)
    return 0


def current_policy_version(store: StoreAPI, name: str = POLICY_RESOURCE) -> int:
    """The latest pushed policy version in the store (0 before the first push)."""
    try:
        return store.get_resource(name).version
    except NotFoundError:
        return 0


def policy_recorder(store: StoreAPI, name: str = POLICY_RESOURCE) -> Callable[[dict[str, Any]], None]:
    """What each weight push records (:class:`~spanlab.training.policy.PolicySync`'s ``record``): a versioned
    ``model_checkpoint`` resource, so every rollout queued afterwards carries the version it was sampled from."""
    def record(payload: dict[str, Any]) -> None:
        store.add_resource(name, payload, kind="model_checkpoint")

    return record


@dataclass
class Group:
    serial: int  # the order it was queued in
    task: dict[str, Any]
    rollout_ids: list[str]

    @property
    def task_key(self) -> str:
        return str(self.task.get("task_id", self.serial))


@dataclass
class Take:
    """What one ``take`` hands the trainer, and what it saw on the way (the step's async metrics)."""

    groups: list[Group]
    staleness: list[int]  # per dequeued rollout of ``groups``: current version - the version it was dequeued under
    version: int  # the trainer's version at the take
    wait_s: float  # how long the trainer waited for the groups
    in_flight: int  # groups outstanding when the take began
    carried_over: int  # ready groups left for a later step
    dropped_groups: int = 0
    dropped_rollouts: int = 0
    dropped_finished: int = 0  # of those, rollouts that had already ended (work thrown away)

    @property
    def rollout_ids(self) -> list[str]:
        return [r for g in self.groups for r in g.rollout_ids]

    def metrics(self, max_staleness: int) -> dict[str, float]:
        """Flat ``train_metrics`` entries: a histogram ``staleness_k`` for k = 0..max_staleness, drops, waits."""
        counts = Counter(self.staleness)
        hist = {f"staleness_{k}": float(counts.get(k, 0)) for k in range(max_staleness + 1)}
        n = len(self.staleness)
        return hist | {
            "staleness_mean": sum(self.staleness) / n if n else 0.0,
            "staleness_max": float(max(self.staleness, default=0)),
            "policy_version": float(self.version),
            "dropped_stale_groups": float(self.dropped_groups),
            "dropped_stale_rollouts": float(self.dropped_rollouts),
            "dropped_stale_finished": float(self.dropped_finished),
            "groups_in_flight": float(self.in_flight),
            "groups_carried_over": float(self.carried_over),
            "wait_s": self.wait_s,
        }


@dataclass(frozen=True)
class EndCounts:
    """What ``close`` found still outstanding: all of it cancelled or left unused, none of it trained on."""

    cancelled_queued: int
    cancelled_running: int
    unused_finished: int

    def metrics(self) -> dict[str, float]:
        return {"end_cancelled_queued": float(self.cancelled_queued),
                "end_cancelled_running": float(self.cancelled_running),
                "end_unused_finished": float(self.unused_finished)}


@dataclass
class GroupQueue:
    """Keeps ``in_flight`` groups of ``group_size`` rollouts of ``tasks`` outstanding in the store (module doc)."""

    collector: RolloutCollector
    tasks: Iterator[dict[str, Any]]
    group_size: int
    in_flight: int
    max_staleness: int
    metadata: dict[str, Any] = field(default_factory=dict)  # on every rollout (run_id, say)
    version: Callable[[], int] | None = None  # default: the store's latest policy resource
    check: Callable[[], None] = lambda: None  # raises when the workers died (the wait would never end)
    on_wait: Callable[[int, int], None] = lambda ready, wanted: None  # a take's ready groups so far (a bar's note)
    poll_s: float = 0.05
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    outstanding: list[Group] = field(default_factory=list)
    dropped_total: int = 0  # rollouts dropped as stale over the queue's life
    _serials: Iterator[int] = field(default_factory=itertools.count)

    @property
    def store(self) -> StoreAPI:
        return self.collector.store

    def current_version(self) -> int:
        return self.version() if self.version is not None else current_policy_version(self.store)

    def top_up(self) -> None:
        """Queue new groups until ``in_flight`` are outstanding (all in one store write)."""
        new: list[tuple[int, dict[str, Any]]] = []
        while len(self.outstanding) + len(new) < self.in_flight:
            task = next(self.tasks)
            new.append((next(self._serials), task))
        if not new:
            return
        rollouts = [r.model_copy(update={"metadata": {**r.metadata, "group_id": f"{r.metadata['group_id']}#{serial}"}})
                    for serial, task in new
                    for r in self.collector.rollouts_for([task], mode="train", group_size=self.group_size,
                                                         metadata=self.metadata)]
        ids = iter(self.collector.enqueue(rollouts))
        for serial, task in new:
            self.outstanding.append(Group(serial, task, [next(ids) for _ in range(self.group_size)]))

    def take(self, n: int) -> Take:
        """Wait for ``n`` ready groups within the staleness bound, dropping (and counting) stale ones meanwhile."""
        started, current = self.clock(), self.current_version()
        take = Take([], [], current, 0.0, len(self.outstanding), 0)
        while True:
            self.top_up()
            self.check()
            states = {s.rollout_id: s for s in self.store.rollout_summaries(
                [r for g in self.outstanding for r in g.rollout_ids])}
            ready: list[tuple[Group, list[int]]] = []
            for group in list(self.outstanding):
                members = [states[r] for r in group.rollout_ids]
                versions = [policy_version(m.resources_version) for m in members if m.start_time is not None]
                if versions and current - min(versions) > self.max_staleness:
                    self._drop(group, members, take)
                elif all(m.status in TERMINAL for m in members):
                    ready.append((group, [current - v for v in versions]))
            chosen = ready[:n]
            self.on_wait(len(chosen), n)
            if len(chosen) == n:
                break
            if len(self.outstanding) == self.in_flight:  # nothing dropped this round: wait for rollouts to end
                self.sleep(self.poll_s)
        for group, staleness in chosen:
            self.outstanding.remove(group)
            take.groups.append(group)
            take.staleness.extend(staleness)
        take.carried_over = len(ready) - n
        take.wait_s = self.clock() - started
        self.top_up()
        return take

    def _drop(self, group: Group, members: list[RolloutSummary], take: Take) -> None:
        for m in members:
            if m.status not in TERMINAL:
                self.store.cancel_rollout(m.rollout_id)
        self.outstanding.remove(group)
        finished = sum(m.status in TERMINAL for m in members)
        take.dropped_groups += 1
        take.dropped_rollouts += len(members)
        take.dropped_finished += finished
        self.dropped_total += len(members)
        logger.info("dropped group %d (task %s): sampled more than %d versions before %d", group.serial,
                    group.task_key, self.max_staleness, take.version)

    def close(self) -> EndCounts:
        """Cancel every outstanding rollout not yet ended; count them (the run's clean end, module doc)."""
        ids = [r for g in self.outstanding for r in g.rollout_ids]
        states = self.store.rollout_summaries(ids) if ids else []
        counts = Counter("queued" if s.status in ("queuing", "requeuing") else
                         "finished" if s.status in TERMINAL else "running" for s in states)
        for s in states:
            if s.status not in TERMINAL:
                self.store.cancel_rollout(s.rollout_id)
        self.outstanding.clear()
        end = EndCounts(counts["queued"], counts["running"], counts["finished"])
        logger.info("async loop ended: cancelled %d queued and %d running rollouts, %d finished ones unused",
                    end.cancelled_queued, end.cancelled_running, end.unused_finished)
        return end
