"""The async GRPO loop on a real store with real workers: stale groups dropped, faster than sync, a clean end.

The agent (``tests.agents_for_tests.LongTailAgent``) takes a seeded lognormal time per (task, sample) and records
its call with the policy version it sampled under; the trainer is the real ``grpo_step`` on a tiny model.
The same tasks, delays and trainer run once through the sync loop and once through the async one. The queue's
rules are also checked on their own with an injected ``sleep`` that moves the scenario on (no timing at all).
"""

from __future__ import annotations

import itertools
import json
import time
from pathlib import Path
from typing import Any

import pytest

from spanlab.algos.grpo.async_loop import run_async
from spanlab.algos.grpo.loop import run_sync
from spanlab.jobs.groups import POLICY_RESOURCE, GroupQueue, policy_version
from spanlab.jobs.rollouts import RolloutCollector
from spanlab.store import SpanStore
from tests.agents_for_tests import rollout_delay, task_draws, toy_tasks
from tests.async_parts import TinyTrainer

AGENT = "tests.agents_for_tests:LongTailAgent"
DELAYS = {"median_s": 0.08, "sigma": 1.0, "max_s": 0.8, "seed": 0}
TRAIN_S = 0.3  # a real model's update time, slept (module doc of tests.async_parts)
STEPS, PER_STEP, GROUP, CONCURRENCY = 6, 2, 4, 8
LEASED = ("queuing", "requeuing", "preparing", "running")


pytestmark = pytest.mark.usefixtures("one_thread")


def _collector(store: SpanStore) -> RolloutCollector:
    return RolloutCollector(store, "", AGENT, dict(DELAYS), concurrency=CONCURRENCY, timeout_s=30)


def _sync(db: Path, pool: list[dict[str, Any]]) -> tuple[TinyTrainer, float]:
    with SpanStore(":memory:") as store:
        trainer, collector = TinyTrainer(store, train_s=TRAIN_S), _collector(store)
        started = time.monotonic()
        run_sync(trainer.parts(), lambda tasks, step: collector.collect(tasks, mode="train", group_size=GROUP),
                 enumerate(itertools.islice(task_draws(pool, PER_STEP), STEPS)))
        return trainer, time.monotonic() - started


def test_async_trains_only_fresh_groups_runs_faster_than_sync_and_ends_clean(tmp_path: Path) -> None:
    pool = toy_tasks(12, stragglers={"t4": 3.0})
    # The tail the rules must handle is there: a straggler among the first groups, and a lognormal tail.
    first = [t for draw in itertools.islice(task_draws(pool, PER_STEP), 2) for t in draw]
    assert any("straggler" in t for t in first)
    assert max(rollout_delay(t["task_id"], k, **DELAYS) for t in first for k in range(GROUP)) > 0.3
    sync_trainer, sync_s = _sync(tmp_path / "sync.duckdb", pool)

    with SpanStore(":memory:") as store:
        trainer, collector = TinyTrainer(store, train_s=TRAIN_S), _collector(store)
        queue = GroupQueue(collector, itertools.chain.from_iterable(task_draws(pool, PER_STEP)), GROUP,
                           in_flight=2 * PER_STEP, max_staleness=1)
        started = time.monotonic()
        end = run_async(trainer.parts(), queue, collector.background(), range(STEPS), PER_STEP)
        async_s = time.monotonic() - started

        # (a) every trained rollout was sampled at most 1 version before the update that used it: checked on the
        # version the agent saw when it sampled (its span), not on the queue's own bookkeeping
        spans = store.spans_table(kinds=["llm_call"], columns=["rollout_id", "attributes"]).to_pylist()
        sampled_at = {s["rollout_id"]: json.loads(s["attributes"])["policy_version"] for s in spans}
        trained = [(version, rid) for version, ids in trainer.trained for rid in ids]
        assert len(trained) == STEPS * PER_STEP * GROUP
        assert all(version - sampled_at[rid] <= 1 for version, rid in trained if rid in sampled_at)
        assert all(m["staleness_max"] <= 1 for m in trainer.steps)
        assert sum(m["staleness_1"] for m in trainer.steps) > 0  # it did train on one-version-old groups
        dropped = sum(m["dropped_stale_rollouts"] for m in trainer.steps)
        assert dropped > 0 and trainer.steps[-1]["dropped_stale_total"] == dropped  # the tail was dropped, counted
        summaries = {s.rollout_id: s for s in store.rollout_summaries()}
        trained_ids = {rid for _, rid in trained}
        stale = [s for s in summaries.values() if s.rollout_id not in trained_ids and s.status == "cancelled"]
        assert stale, "groups dropped or cancelled at the end leave cancelled rollouts, none of them trained"
        assert all(policy_version(summaries[rid].resources_version) >= version - 1 for version, rid in trained)

        # (c) a clean end: nothing queued, running or leased; what was outstanding is counted
        assert store.count_rollouts(LEASED) == 0
        active = store.query("SELECT count(*) AS n FROM attempts WHERE status IN ('preparing', 'running')")
        assert active["n"].to_pylist() == [0]
        assert end.cancelled_queued + end.cancelled_running + end.unused_finished == 2 * PER_STEP * GROUP
        assert len(store.list_resources(POLICY_RESOURCE)) == STEPS

    # (b) the same work done faster: every step trains as many rollouts as a sync step, and steps come quicker.
    # Timed after the first step (both loops start their workers and run their first groups there); the margin
    # is wide because the gap is the tail and the overlapped update, not the CPU (benchmarks/async_grpo.py).
    assert len(sync_trainer.trained) == len(trainer.trained) == STEPS
    sync_steady = sync_trainer.steps[-1]["loop_s"] - sync_trainer.steps[0]["loop_s"]
    async_steady = trainer.steps[-1]["loop_s"] - trainer.steps[0]["loop_s"]
    assert async_steady < sync_steady / 1.5, (sync_steady, async_steady, sync_s, async_s)
    assert trainer.steps[-1]["rollouts_finished"] >= sync_trainer.steps[-1]["rollouts_finished"]


class _Scenario:
    """Plays the workers' part for ``GroupQueue`` tests: each injected ``sleep`` runs the next scripted move."""

    def __init__(self, store: SpanStore, moves: list[Any]) -> None:
        self.store, self.moves = store, moves

    def sleep(self, _s: float) -> None:
        if not self.moves:
            raise AssertionError("the queue waited with no move left: it should have handed out groups")
        self.moves.pop(0)()

    def dequeue(self, n: int) -> list[str]:
        attempts = []
        for _ in range(n):
            got = self.store.dequeue(worker_id="w", mode="train")
            assert got is not None
            attempts.append(got[1].attempt_id)
        return attempts


def test_a_late_member_keeps_its_group_waiting_until_it_ends_or_goes_stale(tmp_path: Path) -> None:
    with SpanStore(tmp_path / "q.duckdb") as store:
        pool = toy_tasks(4)
        collector = RolloutCollector(store, "", AGENT, {})
        moves: list[Any] = []
        scenario = _Scenario(store, moves)
        waits: list[tuple[int, int]] = []  # what a progress bar hears: ready groups of those a take wants
        queue = GroupQueue(collector, itertools.cycle(pool), group_size=2, in_flight=2, max_staleness=1,
                           sleep=scenario.sleep, on_wait=lambda ready, wanted: waits.append((ready, wanted)))
        queue.top_up()
        a1, a2, b1, b2 = scenario.dequeue(4)  # both groups dequeued at version 0
        store.finish_attempt(a1, "succeeded")
        store.finish_attempt(b1, "succeeded")
        store.finish_attempt(b2, "succeeded")
        take = queue.take(1)  # group B is full, group A waits for its late member
        assert [g.serial for g in take.groups] == [1] and take.staleness == [0, 0] and take.dropped_groups == 0
        store.add_resource(POLICY_RESOURCE, {}, kind="model_checkpoint")  # version 1: A is one version old

        def a_finishes() -> None:
            store.finish_attempt(a2, "succeeded")

        moves.append(a_finishes)
        take = queue.take(1)  # waits once (the move), then takes A, one version old: within the bound
        assert [g.serial for g in take.groups] == [0] and take.staleness == [1, 1] and not moves
        assert waits == [(1, 1), (0, 1), (1, 1)]  # the first take at once; the second waited once, then took A

        c1, c2, d1, d2 = scenario.dequeue(4)  # the two groups queued to refill, dequeued at version 1
        for attempt in (c1, d1, d2):
            store.finish_attempt(attempt, "succeeded")
        store.add_resource(POLICY_RESOURCE, {}, kind="model_checkpoint")  # version 2
        store.add_resource(POLICY_RESOURCE, {}, kind="model_checkpoint")  # version 3: C and D are 2 behind

        def refill_runs() -> None:  # the groups queued in place of C and D, run and ended at version 3
            for attempt in scenario.dequeue(4):
                store.finish_attempt(attempt, "succeeded")

        moves.append(refill_runs)
        take = queue.take(2)
        assert take.dropped_groups == 2 and take.dropped_rollouts == 4 and take.dropped_finished == 3
        assert take.staleness == [0, 0, 0, 0] and [g.serial for g in take.groups] == [4, 5]
        assert store.get_rollout(store.get_attempt(c2).rollout_id).status == "cancelled"
        assert store.get_attempt(c2).status == "failed"  # the late member's lease ended with its group

        end = queue.close()  # the two refills of the last take are still queued: cancelled and counted
        assert (end.cancelled_queued, end.cancelled_running, end.unused_finished) == (4, 0, 0)
        assert store.count_rollouts(("queuing", "requeuing", "preparing", "running")) == 0
        metrics = take.metrics(1)
        assert metrics["staleness_0"] == 4 and metrics["staleness_1"] == 0 and metrics["dropped_stale_groups"] == 2


def test_async_refuses_an_engine_without_the_pause_route_in_one_line_naming_loop_mode() -> None:
    """A real HTTP server without vLLM's dev routes (``/is_paused`` is 404, as on a vLLM started without
    ``VLLM_SERVER_DEV_MODE=1``): the async loop refuses it before any rollout, naming the setting."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from spanlab.algos.grpo.async_loop import check_engines_can_pause
    from spanlab.engine.weights import ReplicaWeightSync
    from spanlab.errors import ConfigError

    class NoDevRoutes(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(404)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), NoDevRoutes)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        with ReplicaWeightSync([f"http://127.0.0.1:{server.server_address[1]}"], timeout_s=5) as engines, \
                pytest.raises(ConfigError) as err:
            check_engines_can_pause(engines)
    finally:
        server.shutdown()
        thread.join()
    message = str(err.value)
    assert "\n" not in message and message.startswith("loop.mode: async")
    assert "/is_paused: 404" in message and "VLLM_SERVER_DEV_MODE=1" in message
