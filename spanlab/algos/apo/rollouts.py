"""Prompt versions in the store and rollouts pinned to them, run at most once per (version, task).

* :class:`PromptBank`: each distinct template text is one version of the ``prompt`` resource
  (``kind=prompt_template``); the same text always maps to the same version, also across runs on
  one DuckDB file, so an edit that reproduces an earlier prompt costs nothing.
* :class:`RolloutRunner`: queues rollouts with ``resources_version="prompt@N"`` pinned (the worker
  hands the agent exactly that template, and the rollout records it), runs them all in one batch
  through the collector's gateway and agent, and answers repeats of a (version, task) pair from a
  cache. The cache is loaded from the store at start, keyed also by the agent's settings, so a rerun
  with the same agent reuses earlier rollouts and a changed agent does not.

``RolloutCollector.collect`` does not pin resources, hence the ~15 lines of queueing here; both
share the worker, agent loading and reward reading.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Sequence
from typing import Any

from spanlab.jobs.rollouts import RolloutCollector
from spanlab.prompts import template_sha
from spanlab.types import Resource, Rollout, RolloutConfig, RolloutMode

logger = logging.getLogger(__name__)

Task = dict[str, Any]
Request = tuple[Sequence[tuple[int, Task]], RolloutMode, dict[str, Any]]  # the arguments of one score call


class PromptBank:
    """Template text <-> version of one resource name, deduplicated by the text's hash."""

    def __init__(self, store: Any, name: str = "prompt") -> None:
        self.store, self.name = store, name
        self._by_sha: dict[str, Resource] = {}
        for res in store.list_resources(name):  # oldest first: the first version of a text wins
            self._by_sha.setdefault(res.payload.get("sha256") or template_sha(res.payload["template"]), res)

    def version_of(self, template: str, **provenance: Any) -> tuple[int, bool]:
        """(version, created now?) of ``template``; ``provenance`` is stored with a new version only."""
        sha = template_sha(template)
        if sha in self._by_sha:
            return int(self._by_sha[sha].version or 0), False
        res = self.store.add_resource(self.name, {"template": template, "sha256": sha, **provenance},
                                      kind="prompt_template")
        self._by_sha[sha] = res
        return int(res.version or 0), True

    def ref(self, version: int) -> str:
        return f"{self.name}@{version}"


def agent_key(agent_name: str, kwargs: dict[str, Any]) -> str:
    """A short hash of the agent's identity and settings: rollouts are reusable only under the same key."""
    blob = json.dumps({"agent": agent_name, "kwargs": kwargs}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


class RolloutRunner:
    """Runs (version, task) pairs through the collector's gateway and agent, each pair at most once."""

    def __init__(self, collector: RolloutCollector, bank: PromptBank, *, overrides: dict[str, Any],
                 max_rollouts: int | None = None) -> None:
        self.collector, self.bank, self.overrides = collector, bank, overrides
        self.key = agent_key(collector.agent_name, {**collector.agent_kwargs, **overrides})
        self.max_rollouts = max_rollouts
        self.cache: dict[tuple[int, str], tuple[str, float]] = self._load()
        self.ran = self.hits = self.failed = 0
        self._ahead: set[tuple[int, str]] = set()  # pairs run_ahead ran that no score call has asked for yet
        self.seconds = 0.0
        self.on_finished: Callable[[float | None], None] | None = None  # hears of each rollout as it ends (a bar)

    def _load(self) -> dict[tuple[int, str], tuple[str, float]]:
        rows = [{"rollout_id": s.rollout_id, "v": s.resources_version, "r": s.final_reward or 0.0,
                 "task_id": _task_id(s.input)}
                for s in self.collector.store.rollout_summaries(statuses=["succeeded", "failed"],
                                                                metadata={"apo_agent_key": self.key})]
        prefix = f"{self.bank.name}@"
        cache = {(int(r["v"].removeprefix(prefix)), r["task_id"]): (r["rollout_id"], float(r["r"]))
                 for r in rows if r["v"] and r["v"].startswith(prefix) and "," not in r["v"]}
        if cache:
            logger.info("rollout cache: %d (version, task) pairs from earlier runs with this agent", len(cache))
        return cache

    def budget_left(self) -> int | None:
        return None if self.max_rollouts is None else self.max_rollouts - self.ran

    def missing(self, pairs: Sequence[tuple[int, Task]]) -> list[tuple[int, Task]]:
        seen, out = set(), []
        for version, task in pairs:
            key = (version, task["task_id"])
            if key not in self.cache and key not in seen:
                seen.add(key)
                out.append((version, task))
        return out

    def cached_rewards(self, pairs: Sequence[tuple[int, Task]]) -> list[float]:
        """The rewards of the pairs already run (each distinct pair once)."""
        return [self.cache[key][1] for key in _keys(pairs) if key in self.cache]

    def score(self, pairs: Sequence[tuple[int, Task]], *, mode: RolloutMode,
              metadata: dict[str, Any]) -> list[tuple[str, float]]:
        """(rollout_id, reward) for each (version, task) pair, running only the pairs never run before."""
        todo = self.missing(pairs)
        ahead = {key for key in _keys(pairs) if key in self._ahead}  # run by run_ahead: not cache hits
        self.hits += len(pairs) - len(todo) - len(ahead)
        self._ahead -= ahead
        if todo:
            self._run([(version, task, mode, metadata) for version, task in todo])
        return [self.cache[(v, t["task_id"])] for v, t in pairs]

    def run_ahead(self, requests: Sequence[Request]) -> None:
        """Run the pairs of several ``score`` calls to come as one batch, so that the search waits once for
        them instead of once per call: on a small engine a rollout's time is mostly decoding latency (2 cores:
        one batch of 7 took 42 s where batches of 2, 3 and 2 took 28 + 32 + 31 s). Their ``score`` then finds
        them in the cache."""
        todo: dict[tuple[int, str], tuple[int, Task, RolloutMode, dict[str, Any]]] = {}
        for pairs, mode, metadata in requests:
            for version, task in self.missing(pairs):
                todo.setdefault((version, task["task_id"]), (version, task, mode, metadata))
        if todo:
            self._run(list(todo.values()))
            self._ahead |= todo.keys()

    def _run(self, todo: list[tuple[int, Task, RolloutMode, dict[str, Any]]]) -> None:
        c = self.collector
        config = RolloutConfig(timeout_s=c.timeout_s, max_attempts=1)
        rollouts = [Rollout(input=task, mode=mode, config=config, resources_version=self.bank.ref(version),
                            metadata={**metadata, "apo_agent_key": self.key, "group_id": str(task["task_id"])})
                    for version, task, mode, metadata in todo]
        batch = c.run(rollouts, on_finished=self.on_finished, **self.overrides)
        for rid, reward, (version, task, _, _) in zip(batch.rollout_ids, batch.rewards, todo, strict=True):
            self.cache[(version, task["task_id"])] = (rid, reward)
        self.ran += len(batch.rollout_ids)
        self.failed += batch.failed
        self.seconds += batch.seconds
        logger.info("ran %d rollouts in %.0fs (%d failed); cache now %d pairs", len(batch.rollout_ids), batch.seconds,
                    batch.failed, len(self.cache))


def _keys(pairs: Sequence[tuple[int, Task]]) -> set[tuple[int, str]]:
    return {(version, task["task_id"]) for version, task in pairs}


def _task_id(task: Any) -> str | None:
    """``input["task_id"]`` as text (what SQL's ``input->>'$.task_id'`` gave), None without one."""
    value = task.get("task_id") if isinstance(task, dict) else None
    return None if value is None else value if isinstance(value, str) else json.dumps(value)
