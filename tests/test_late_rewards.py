"""Issue 65, item 6: a reward that reaches the store after its attempt ended is kept, marked late, and never the
rollout's final reward: not in training's read, not in ``rollout_summary`` or ``role_summary``, not in APO's
conversations, not in the UI. Training already dropped a timed-out attempt; the views now agree with it.

Both store kinds (a DuckDB file, and a client over HTTP to a real store server), each with the store's own
timeout detection (grace 0) ending the attempt while its agent still runs, then the agent's late finish.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from spanlab.adapters.messages import conversations
from spanlab.adapters.trainable import final_rewards, trainable_rollouts
from spanlab.store import SpanStore, StoreAPI, StoreClient
from spanlab.store.server import create_store_app
from spanlab.threaded_server import ThreadedServer
from spanlab.types import RolloutConfig, reward_span
from spanlab.ui.db import ReadOnlyStore
from spanlab.ui.queries import RolloutFilter, rollouts_page
from tests.conftest import llm_span
from tests.stores import TOKEN


@pytest.fixture(params=["duckdb", "http"])
def kind_and_file(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[StoreAPI, Path]]:
    """A store whose attempts time out as soon as they pass ``timeout_s`` (no grace), and its file (read by the UI
    once the test closes the store)."""
    path = tmp_path / "late.duckdb"
    with SpanStore(path, timeout_grace_s=0.0, stale_check_interval_s=0.0) as served:
        if request.param == "duckdb":
            yield served, path
            return
        with ThreadedServer(create_store_app(served, token=TOKEN), name="store server") as server, \
                StoreClient(server.url, token=TOKEN, retry_for_s=5) as client:
            yield client, path


def _timed_out_then_finished_late(store: StoreAPI) -> tuple[str, str]:
    """A rollout whose only attempt the store timed out; its agent then finished with reward 1.0 (final)."""
    rollout = store.enqueue_one({"task": "slow"}, config=RolloutConfig(timeout_s=0.2, max_attempts=1))
    got = store.dequeue(worker_id="w")
    assert got is not None and got[0].rollout_id == rollout.rollout_id
    _, attempt = got
    store.add_spans([llm_span(got[0], attempt, seed=1)])
    time.sleep(0.3)
    assert [a.attempt_id for a in store.expire_stale_attempts()] == [attempt.attempt_id]
    late = reward_span(rollout.rollout_id, attempt.attempt_id, 1.0, final=True)
    assert store.finish_attempt(attempt.attempt_id, "succeeded", [late]).status == "failed"
    return rollout.rollout_id, attempt.attempt_id


def _on_time(store: StoreAPI) -> tuple[str, str]:
    rollout = store.enqueue_one({"task": "quick"})
    got = store.dequeue(worker_id="w")
    assert got is not None
    store.add_spans([llm_span(got[0], got[1], seed=2)])
    store.finish_attempt(got[1].attempt_id, "succeeded", [reward_span(rollout.rollout_id, got[1].attempt_id, 0.5,
                                                                      final=True)])
    return rollout.rollout_id, got[1].attempt_id


def test_a_late_reward_is_kept_marked_late_and_never_the_final_reward(
        kind_and_file: tuple[StoreAPI, Path]) -> None:
    store, path = kind_and_file
    late_rid, late_aid = _timed_out_then_finished_late(store)
    ok_rid, ok_aid = _on_time(store)
    # a reward a grader adds after a succeeded attempt ended is late too
    store.add_spans([reward_span(ok_rid, ok_aid, 9.0, final=True)])

    kept = store.query("SELECT rollout_id, value, final, late FROM rewards ORDER BY rollout_id, sequence_id")
    rows = {(r["rollout_id"], r["value"]): (r["final"], r["late"]) for r in kept.to_pylist()}
    assert rows == {(late_rid, 1.0): (True, True), (ok_rid, 0.5): (True, False), (ok_rid, 9.0): (True, True)}

    summaries = {s.rollout_id: s for s in store.rollout_summaries()}
    assert summaries[late_rid].final_reward is None and summaries[late_rid].total_reward is None
    assert summaries[ok_rid].final_reward == 0.5 and summaries[ok_rid].total_reward == 0.5
    roles = store.query("SELECT final_reward_mean, final_rewards, intermediate_rewards FROM role_summary")
    assert roles.to_pylist() == [{"final_reward_mean": 0.5, "final_rewards": 1, "intermediate_rewards": 0}]

    assert final_rewards(store, [late_aid, ok_aid]) == {ok_aid: 0.5}  # training's read: the same rule
    assert trainable_rollouts(store, [late_rid, ok_rid]) == {ok_rid}
    convs = conversations(store, [late_rid, ok_rid])  # what APO shows its optimizer
    assert convs[late_rid].reward is None and convs[ok_rid].reward == 0.5
    assert convs[late_rid].messages  # the late attempt's conversation is still there, without a reward

    if isinstance(store, SpanStore):
        store.close()  # the UI reads the file once no store holds it (the fixture's close is then a no-op)
        _ui_agrees(path, late_rid, ok_rid)


def test_the_ui_reads_the_same_rule_from_a_served_file(tmp_path: Path) -> None:
    """The UI reads the file a store server wrote: the late reward counts nowhere there either."""
    path = tmp_path / "served.duckdb"
    with SpanStore(path, timeout_grace_s=0.0, stale_check_interval_s=0.0) as served, \
            ThreadedServer(create_store_app(served, token=TOKEN), name="store server") as server, \
            StoreClient(server.url, token=TOKEN, retry_for_s=5) as client:
        late_rid, _ = _timed_out_then_finished_late(client)
        ok_rid, _ = _on_time(client)
    _ui_agrees(path, late_rid, ok_rid)


def _ui_agrees(path: Path, late_rid: str, ok_rid: str) -> None:
    with ReadOnlyStore(path).connection() as conn:
        page = {r["rollout_id"]: r for r in rollouts_page(conn, RolloutFilter())["rows"]}
        assert page[late_rid]["final_reward"] is None and page[late_rid]["total_reward"] is None
        assert page[ok_rid]["final_reward"] == 0.5
        rewarded = rollouts_page(conn, RolloutFilter(min_reward=0.9, max_reward=1.1))["rows"]
        assert rewarded == []  # the reward filter reads the same final reward
