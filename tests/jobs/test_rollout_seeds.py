"""``rollouts.seed``: each queued rollout gets a sampling seed from what it is, the same in every run of a config.

Real in-memory DuckDB stores; the gateway's side (the seeds reaching vLLM and reproducing its samples) is
tests/gateway/test_seeded_sampling.py.
"""

from __future__ import annotations

import uuid

from spanlab.gateway.seeding import SAMPLING_SEED, rollout_seed
from spanlab.jobs.config import parse_train_config
from spanlab.jobs.rollouts import RolloutCollector
from spanlab.store import SpanStore

TASKS = [{"task_id": "a", "q": "1+1"}, {"task_id": "b", "q": "2+2"}]


def _queued_seeds(collector: RolloutCollector, step: int) -> list[int | None]:
    """Queue one step's groups (2 tasks x 2 samples) of a run with a fresh run ID; the seeds the store holds."""
    rollouts = collector.rollouts_for(TASKS, mode="train", group_size=2,
                                      metadata={"run_id": uuid.uuid4().hex, "step": step})
    ids = collector.enqueue(rollouts)
    return [collector.store.get_rollout(i).metadata.get(SAMPLING_SEED) for i in ids]


def _collector(store: SpanStore, seed: int | None) -> RolloutCollector:
    return RolloutCollector(store, "http://127.0.0.1:9/v1", "calc", {}, seed=seed)


def test_every_rollout_of_a_run_gets_its_own_seed_and_a_second_run_the_same_ones() -> None:
    with SpanStore(":memory:") as one, SpanStore(":memory:") as two:
        first = [*_queued_seeds(_collector(one, 0), 0), *_queued_seeds(_collector(one, 0), 1)]
        second = [*_queued_seeds(_collector(two, 0), 0), *_queued_seeds(_collector(two, 0), 1)]
        other_seed = _queued_seeds(_collector(two, 1), 0)
    assert first == second  # another run ID, another store: the same seeds
    assert len(set(first)) == len(first) == 8  # each sample of each group at each step its own
    assert not set(other_seed) & set(first)
    assert all(0 <= s < 2**62 for s in first)  # vLLM seeds choice i of an n > 1 call with seed + i, in an int64
    assert first[0] == rollout_seed(0, "train", {"step": 0, "group_id": "a", "sample": 0})


def test_queuing_the_same_rollout_twice_gives_two_seeds() -> None:
    """An algorithm may queue a task again with the same metadata; the two must not sample alike."""
    with SpanStore(":memory:") as store:
        collector = _collector(store, 0)
        again = _queued_seeds(collector, 0) + _queued_seeds(collector, 0)
    assert len(set(again)) == 8


def test_without_rollouts_seed_no_rollout_is_seeded() -> None:
    with SpanStore(":memory:") as store:
        assert _queued_seeds(_collector(store, None), 0) == [None] * 4
    assert parse_train_config({"algorithm": "grpo"}, "t").rollouts.seed is None
    assert parse_train_config({"algorithm": "grpo", "rollouts": {"seed": 3}}, "t").rollouts.seed == 3
