"""The rollout queue: FIFO dequeue, atomicity across threads, heartbeats, retry policy, timeouts."""

from __future__ import annotations

import threading
import time

import pytest

from spanlab.errors import InvalidSpanError, NotFoundError
from spanlab.store import SpanStore
from spanlab.store import spans as spans_module
from spanlab.store.queue import next_rollout_status
from spanlab.types import Rollout, RolloutConfig, reward_span
from tests.conftest import llm_span


def test_dequeue_is_fifo_and_opens_an_attempt(store: SpanStore) -> None:
    first = store.enqueue_one({"i": 1})
    second = store.enqueue_one({"i": 2})
    rollout, attempt = store.dequeue(worker_id="w1")
    assert rollout.rollout_id == first.rollout_id
    assert rollout.status == "preparing" and rollout.num_attempts == 1
    assert attempt.rollout_id == first.rollout_id and attempt.sequence_id == 1 and attempt.worker_id == "w1"
    assert store.get_rollout(first.rollout_id).status == "preparing"
    assert store.dequeue()[0].rollout_id == second.rollout_id
    assert store.dequeue() is None


def test_dequeue_filters_by_mode(store: SpanStore) -> None:
    store.enqueue_one({"i": 1}, mode="train")
    val = store.enqueue_one({"i": 2}, mode="val")
    assert store.dequeue(mode="val")[0].rollout_id == val.rollout_id
    assert store.dequeue(mode="val") is None


def test_two_workers_never_get_the_same_rollout(tmp_path) -> None:
    with SpanStore(tmp_path / "q.duckdb") as store:
        store.enqueue([Rollout(input={"i": i}) for i in range(200)])
        taken: list[str] = []
        lock = threading.Lock()

        def worker(name: str) -> None:
            while (got := store.dequeue(worker_id=name)) is not None:
                with lock:
                    taken.append(got[0].rollout_id)

        threads = [threading.Thread(target=worker, args=(f"w{i}",)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(taken) == 200
        assert len(set(taken)) == 200
        (n_attempts,) = store.query("SELECT count(*) FROM attempts").to_pylist()[0].values()
        assert n_attempts == 200


def test_heartbeat_moves_to_running(store: SpanStore) -> None:
    store.enqueue_one(None)
    rollout, attempt = store.dequeue()
    beat = store.heartbeat(attempt.attempt_id)
    assert beat.status == "running"
    assert store.get_rollout(rollout.rollout_id).status == "running"
    with pytest.raises(NotFoundError, match="unknown attempt_id"):
        store.heartbeat("at-missing")


def test_every_heartbeat_is_committed_when_it_returns(tmp_path) -> None:
    path = tmp_path / "s.duckdb"
    with SpanStore(path) as store:
        store.enqueue([Rollout(input={"i": i}) for i in range(3)])
        (_, a1), (_, a2), (_, a3) = store.dequeue(), store.dequeue(), store.dequeue()
        store.heartbeat(a1.attempt_id)
        time.sleep(0.01)
        beat1 = store.heartbeat(a1.attempt_id).last_heartbeat_time
        sql = f"SELECT last_heartbeat_time AS t FROM attempts WHERE attempt_id = '{a1.attempt_id}'"
        assert store.query(sql).to_pylist() == [{"t": beat1}]
        time.sleep(0.01)
        beat2 = store.heartbeat(a1.attempt_id).last_heartbeat_time
        assert beat2 > beat1 and store.get_attempt(a1.attempt_id).last_heartbeat_time == beat2
        store.heartbeat(a2.attempt_id)
        time.sleep(0.01)
        beat_a2 = store.heartbeat(a2.attempt_id).last_heartbeat_time
        store.finish_attempt(a2.attempt_id, "succeeded")  # the finish writes the last beat with the status
        store.heartbeat(a3.attempt_id)
        time.sleep(0.01)
        beat_a3 = store.heartbeat(a3.attempt_id).last_heartbeat_time
    with SpanStore(path) as reopened:
        assert reopened.get_attempt(a2.attempt_id).last_heartbeat_time == beat_a2
        assert reopened.get_attempt(a3.attempt_id).last_heartbeat_time == beat_a3
        assert reopened.get_attempt(a3.attempt_id).status == "running"


@pytest.mark.parametrize(
    ("attempt_status", "num_attempts", "max_attempts", "retry_on", "expected"),
    [
        ("succeeded", 1, 3, ("failed",), "succeeded"),
        ("failed", 1, 3, ("failed",), "requeuing"),
        ("failed", 3, 3, ("failed",), "failed"),
        ("timeout", 1, 3, ("failed",), "failed"),
        ("timeout", 1, 3, ("failed", "timeout"), "requeuing"),
        ("unresponsive", 2, 3, ("unresponsive",), "requeuing"),
        ("failed", 1, 1, ("failed",), "failed"),
    ],
)
def test_retry_policy_table(attempt_status, num_attempts, max_attempts, retry_on, expected) -> None:
    rollout = Rollout(
        status="running",
        num_attempts=num_attempts,
        config=RolloutConfig(max_attempts=max_attempts, retry_on=retry_on),
    )
    assert next_rollout_status(rollout, attempt_status) == expected


def test_failed_attempt_is_retried_until_max_attempts(store: SpanStore) -> None:
    r = store.enqueue_one({"x": 1}, config=RolloutConfig(max_attempts=3, retry_on=("failed",)))
    for n in (1, 2, 3):
        rollout, attempt = store.dequeue()
        assert rollout.rollout_id == r.rollout_id and attempt.sequence_id == n
        after = store.finish_attempt(attempt.attempt_id, "failed")
        assert after.status == ("requeuing" if n < 3 else "failed")
    assert store.dequeue() is None
    attempts = store.list_attempts(r.rollout_id)
    assert [a.status for a in attempts] == ["failed"] * 3
    assert store.get_rollout(r.rollout_id).end_time is not None


def test_success_ends_rollout_and_late_finish_is_ignored(store: SpanStore) -> None:
    r = store.enqueue_one({"x": 1}, config=RolloutConfig(max_attempts=2))
    _, attempt = store.dequeue()
    assert store.finish_attempt(attempt.attempt_id, "succeeded").status == "succeeded"
    # a second finish (e.g. a worker that lost track) does not flip the outcome
    assert store.finish_attempt(attempt.attempt_id, "failed").status == "succeeded"
    assert store.get_attempt(attempt.attempt_id).status == "succeeded"
    assert store.get_rollout(r.rollout_id).status == "succeeded"


def test_finish_stores_the_last_spans_in_the_same_transaction(store: SpanStore, monkeypatch) -> None:
    store.enqueue_one({"x": 1}, config=RolloutConfig(max_attempts=2))
    rollout, attempt = store.dequeue()
    reward = reward_span(rollout.rollout_id, attempt.attempt_id, 1.0)
    call = llm_span(rollout, attempt, seed=3)

    def broken_insert(*args, **kwargs):
        raise RuntimeError("the span insert failed")

    monkeypatch.setattr(spans_module, "insert", broken_insert)
    with pytest.raises(RuntimeError, match="insert failed"):
        store.finish_attempt(attempt.attempt_id, "succeeded", [call, reward])
    monkeypatch.undo()
    assert store.spans_table(attempt_ids=[attempt.attempt_id]).num_rows == 0
    assert store.get_attempt(attempt.attempt_id).status == "preparing"  # no finish without its spans
    assert store.dequeue() is None  # and the rollout was not put back in the queue either

    assert store.finish_attempt(attempt.attempt_id, "succeeded", [call, reward]).status == "succeeded"
    assert store.finish_attempt(attempt.attempt_id, "succeeded", [call, reward]).status == "succeeded"  # a retry
    stored = store.spans_table(attempt_ids=[attempt.attempt_id], columns=["span_id", "kind", "reward_value"])
    assert stored["span_id"].to_pylist() == [call.span_id, reward.span_id]  # once each
    assert stored["reward_value"].to_pylist() == [None, 1.0]


def test_finish_refuses_spans_of_another_attempt(store: SpanStore) -> None:
    store.enqueue([Rollout(input={"i": i}) for i in range(2)])
    (_, a1), (r2, a2) = store.dequeue(), store.dequeue()
    with pytest.raises(InvalidSpanError, match="spans of attempt"):
        store.finish_attempt(a1.attempt_id, "succeeded", [reward_span(r2.rollout_id, a2.attempt_id, 1.0)])
    assert store.get_attempt(a1.attempt_id).status == "preparing"  # still open, nothing stored
    assert store.spans_table().num_rows == 0
    with pytest.raises(InvalidSpanError, match="status must be"):
        store.finish_attempt(a1.attempt_id, "done")  # type: ignore[arg-type]


def test_timeout_and_unresponsive_detection() -> None:
    store = SpanStore(":memory:", timeout_grace_s=0.0)
    slow = store.enqueue_one({"k": "slow"}, config=RolloutConfig(timeout_s=0.2, max_attempts=2, retry_on=("timeout",)))
    silent = store.enqueue_one({"k": "silent"}, config=RolloutConfig(unresponsive_s=0.2, max_attempts=1))
    # generous margin for the heartbeating one: a loaded CI machine may stall the loop for a while
    healthy = store.enqueue_one({"k": "ok"}, config=RolloutConfig(unresponsive_s=3.0, timeout_s=60))
    _, a_slow = store.dequeue()
    _, a_silent = store.dequeue()
    _, a_healthy = store.dequeue()
    deadline = time.time() + 0.6
    while time.time() < deadline:
        store.heartbeat(a_slow.attempt_id)  # heartbeats do not save an attempt past its timeout
        store.heartbeat(a_healthy.attempt_id)
        time.sleep(0.05)
    expired = {a.attempt_id: a.status for a in store.expire_stale_attempts()}
    assert expired == {a_slow.attempt_id: "timeout", a_silent.attempt_id: "unresponsive"}
    assert store.get_rollout(slow.rollout_id).status == "requeuing"  # retry_on includes timeout
    assert store.get_rollout(silent.rollout_id).status == "failed"  # max_attempts=1
    assert store.get_rollout(healthy.rollout_id).status == "running"
    # the timed-out worker learns it on its next heartbeat, and its late finish changes nothing
    assert store.heartbeat(a_slow.attempt_id).status == "timeout"
    assert store.finish_attempt(a_slow.attempt_id, "succeeded").status == "requeuing"
    retry_rollout, retry_attempt = store.dequeue()
    assert retry_rollout.rollout_id == slow.rollout_id and retry_attempt.sequence_id == 2
    store.close()


def test_timeouts_wait_for_the_grace_period() -> None:
    with SpanStore(":memory:", timeout_grace_s=0.5) as store:
        store.enqueue_one({}, config=RolloutConfig(timeout_s=0.1))
        _, attempt = store.dequeue()
        time.sleep(0.3)
        assert store.expire_stale_attempts() == []  # the worker's own timeout should fire first
        time.sleep(0.4)
        assert [a.attempt_id for a in store.expire_stale_attempts()] == [attempt.attempt_id]


def test_dequeue_runs_stale_detection(tmp_path) -> None:
    with SpanStore(tmp_path / "s.duckdb", stale_check_interval_s=0.0) as store:
        r = store.enqueue_one({}, config=RolloutConfig(unresponsive_s=0.1, max_attempts=2))
        store.dequeue()
        time.sleep(0.25)
        rollout, attempt = store.dequeue()  # expiry of the first attempt requeued it
        assert rollout.rollout_id == r.rollout_id and attempt.sequence_id == 2


def test_cancel(store: SpanStore) -> None:
    r = store.enqueue_one({})
    _, attempt = store.dequeue()
    assert store.cancel_rollout(r.rollout_id).status == "cancelled"
    assert store.get_attempt(attempt.attempt_id).status == "failed"
    assert store.finish_attempt(attempt.attempt_id, "succeeded").status == "cancelled"


def test_enqueue_rejects_duplicates_and_bad_input(store: SpanStore) -> None:
    r = store.enqueue_one({})
    with pytest.raises(InvalidSpanError, match="already exists"):
        store.enqueue([Rollout(rollout_id=r.rollout_id)])
    with pytest.raises(InvalidSpanError, match="already exists"):  # the same object again
        store.enqueue([r])
    with pytest.raises(InvalidSpanError, match="already exists"):  # in the table
        store.enqueue([r])
    with pytest.raises(InvalidSpanError, match="max_attempts"):
        store.enqueue([{"input": {}, "config": {"max_attempts": 0}}])
    with pytest.raises(InvalidSpanError, match="mode"):
        store.enqueue([{"input": {}, "mode": "training"}])
    with pytest.raises(InvalidSpanError, match="finish_attempt"):
        store.finish_attempt("whatever", "done")  # type: ignore[arg-type]
    assert len(store.list_rollouts()) == 1


def test_list_rollouts_filters(store: SpanStore) -> None:
    store.enqueue([Rollout(input=i, mode="val" if i % 2 else "train") for i in range(6)])
    store.dequeue()
    assert len(store.list_rollouts(mode="val")) == 3
    assert len(store.list_rollouts(status="queuing")) == 5
    assert [r.input for r in store.list_rollouts(limit=2, offset=1)] == [1, 2]


def test_queue_state_survives_reopening(tmp_path) -> None:
    path = tmp_path / "reopen.duckdb"
    with SpanStore(path) as store:
        ids = [store.enqueue_one({"i": i}, config=RolloutConfig(unresponsive_s=0.2, max_attempts=2)).rollout_id
               for i in range(3)]
        _, first_attempt = store.dequeue()
    with SpanStore(path, stale_check_interval_s=0.0) as store:
        time.sleep(0.3)
        # the attempt left running before the restart is found silent and its rollout requeued first
        rollout, attempt = store.dequeue()
        assert store.get_attempt(first_attempt.attempt_id).status == "unresponsive"
        assert (rollout.rollout_id, attempt.sequence_id) == (ids[0], 2)
        assert [store.dequeue()[0].rollout_id for _ in range(2)] == ids[1:]
        assert store.dequeue() is None
