"""Stores that look like what a finished run leaves, written through the store API into real DuckDB files.

A run's held-out evaluation is one finished rollout per task (mode ``test``, ``metadata.phase`` and ``split``)
with its final reward and, for calc, the agent's ``calc.extra_ops`` metric span; its training rollouts are
rollouts of another mode. The comparison tests (``spanlab.compare``, the compare and drift tutorials) read
these back.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from spanlab.gateway.seeding import SAMPLING_SEED, rollout_seed
from spanlab.store import SpanStore
from spanlab.types import Rollout, RolloutConfig, metric_span, reward_span


def _metadata(phase: str, split: str, mode: str, task: str, seed: int | None) -> dict[str, object]:
    """A held-out rollout's metadata; with a run ``seed``, what a seeded job adds (its run_id, group and sample,
    and the sampling seed it derives from the run's seed, :func:`spanlab.gateway.seeding.rollout_seed`)."""
    metadata: dict[str, object] = {"phase": phase, "split": split} if phase else {}
    if seed is None:
        return metadata
    metadata = {**metadata, "run_id": f"run-{seed}-{phase}", "group_id": task, "sample": 0}
    return {**metadata, SAMPLING_SEED: rollout_seed(seed, mode, metadata)}


def record(db: Path, rewards: Mapping[str, float], *, phase: str = "", split: str = "", mode: str = "test",
           failed: frozenset[str] = frozenset(), extra_ops: Mapping[str, float] | None = None,
           seed: int | None = None) -> None:
    """One finished rollout per task with its reward (those in ``failed``: a failed attempt, no reward; those in
    ``extra_ops``: that metric recorded too), as the framework's collector leaves them; with ``seed``, sampled by
    a run seeded with it."""
    with SpanStore(db) as store:
        store.enqueue([Rollout(input={"task_id": t, "question": t}, mode=mode,
                               metadata=_metadata(phase, split, mode, t, seed),
                               config=RolloutConfig(max_attempts=1)) for t in rewards])
        while (taken := store.dequeue()) is not None:
            rollout, attempt = taken
            task = rollout.input["task_id"]
            if task in failed:
                store.finish_attempt(attempt.attempt_id, "failed")
                continue
            if extra_ops is not None and task in extra_ops:
                store.add_spans([metric_span(rollout.rollout_id, attempt.attempt_id, "calc.extra_ops",
                                             extra_ops[task])])
            store.finish_attempt(attempt.attempt_id, "succeeded", [reward_span(rollout.rollout_id, attempt.attempt_id,
                                                                               rewards[task])])
