"""``read_rollouts``: each rollout's task and its latest attempt's spans, on both store kinds (``any_store``)."""

from __future__ import annotations

from spanlab.adapters.recorded_rollouts import read_rollouts
from spanlab.store import StoreAPI
from spanlab.types import RolloutConfig, Span


def _custom(rollout_id: str, attempt_id: str, name: str) -> Span:
    return Span(rollout_id=rollout_id, attempt_id=attempt_id, name=name, kind="custom")


def test_the_latest_attempt_in_span_order_and_a_rollout_never_run(any_store: StoreAPI) -> None:
    retried = any_store.enqueue_one({"task_id": "t1"}, config=RolloutConfig(max_attempts=2, retry_on=("failed",)))
    never_run = any_store.enqueue_one({"task_id": "t2"})
    rollout, first = any_store.dequeue()
    assert rollout.rollout_id == retried.rollout_id
    any_store.finish_attempt(first.attempt_id, "failed", [_custom(rollout.rollout_id, first.attempt_id, "old")])
    _, second = any_store.dequeue()
    assert second.rollout_id == retried.rollout_id and second.sequence_id == 2
    any_store.finish_attempt(second.attempt_id, "succeeded", [_custom(rollout.rollout_id, second.attempt_id, name)
                                                              for name in ("a", "b", "c")])

    read = read_rollouts(any_store, [never_run.rollout_id, retried.rollout_id])
    assert [r.rollout_id for r in read] == [retried.rollout_id, never_run.rollout_id]  # enqueue order
    latest, unrun = read
    assert latest.task == {"task_id": "t1"} and latest.attempt_id == second.attempt_id
    assert [s.name for s in latest.spans] == ["a", "b", "c"]  # the retry's spans only, in the order recorded
    assert unrun.task == {"task_id": "t2"} and unrun.attempt_id is None and unrun.spans == ()
    assert [r.rollout_id for r in read_rollouts(any_store)] == [retried.rollout_id, never_run.rollout_id]
    assert read_rollouts(any_store, []) == []
