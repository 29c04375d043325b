"""Rollout workers on a real local Ray cluster: killing an actor mid-rollout loses and duplicates nothing.

One cluster per module (``ray.init`` with 2 CPUs, no dashboard), stopped in the fixture's teardown. The
actors reach a real store server on 127.0.0.1 with a bearer token, as they do in ``spanlab train``.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from spanlab.errors import ConfigError
from spanlab.jobs.rollouts import RolloutCollector
from spanlab.runner.config import RolloutRunnerConfig
from spanlab.runner.ray_runner import RayRunner
from spanlab.serving import ThreadedServer
from spanlab.store import SpanStore
from spanlab.store.server import create_store_app
from spanlab.types import Rollout, RolloutConfig
from tests.jobs.test_plugin import _config as plugin_config
from tests.jobs.test_plugin import _train as train
from tests.jobs.test_plugin import plugin_path  # noqa: F401  (the fixture: the best-of-n plugin, installed apart)

TOKEN = "ray-test-token"
MEMORY_MONITOR = "RAY_memory_monitor_refresh_ms"
T = TypeVar("T")


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[Any]:
    ray = pytest.importorskip("ray")
    # Ray's memory monitor kills workers when the node nears full memory, whoever uses it; on a shared test
    # machine that is other processes (vLLM servers), so it is off for this cluster (read when Ray starts).
    saved = os.environ.get(MEMORY_MONITOR)
    os.environ[MEMORY_MONITOR] = "0"
    try:
        ray.init(num_cpus=2, include_dashboard=False, object_store_memory=100 * 2**20, logging_level=logging.WARNING)
        yield ray
    finally:
        ray.shutdown()
        if saved is None:
            os.environ.pop(MEMORY_MONITOR, None)
        else:
            os.environ[MEMORY_MONITOR] = saved


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[SpanStore, str]]:
    """A store file served on 127.0.0.1 with a token, the way the job serves it to its Ray workers."""
    with SpanStore(tmp_path / "spans.duckdb") as store, \
            ThreadedServer(create_store_app(store, token=TOKEN), name="store server") as server:
        yield store, server.url


def wait_for(probe: Callable[[], T | None], errors: list[BaseException], timeout_s: float = 300.0) -> T:
    """Poll until ``probe`` returns something (a bound on a hang, not a timing assertion) or ``errors`` fills."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert not errors, errors
        got = probe()
        if got is not None:
            return got
        time.sleep(0.1)
    raise AssertionError(f"nothing after {timeout_s}s")


def spans_by_attempt(store: SpanStore) -> dict[str, list[tuple[str, str]]]:
    rows = store.query("SELECT attempt_id, kind, name FROM spans ORDER BY attempt_id, name").to_pylist()
    out: dict[str, list[tuple[str, str]]] = {}
    for row in rows:
        out.setdefault(row["attempt_id"], []).append((row["kind"], row["name"]))
    return out


def test_killing_an_actor_mid_rollout_ends_in_a_retry_with_exact_spans(ray_cluster: Any,
                                                                       served: tuple[SpanStore, str]) -> None:
    """Through the job's collector: its rollouts ask for no retries (every algorithm's default), and on Ray they
    still get one when, and only when, their worker is lost."""
    store, url = served
    held = Rollout(input={"seed": 0, "hold": True})  # first in the queue: taken first
    others = [Rollout(input={"seed": i}) for i in range(1, 7)]
    ids = [held.rollout_id, *(r.rollout_id for r in others)]
    config = RolloutRunnerConfig(backend="ray", workers=2, heartbeat_s=0.2, unresponsive_s=3.0, max_attempts=2)
    errors: list[BaseException] = []

    def collect() -> None:
        try:  # 1 rollout in flight per worker: the killed actor holds only the held rollout
            collector = RolloutCollector(store, "", "tests.agents_for_tests:StepAgent", {"steps": 3}, timeout_s=300,
                                         remote=runner, worker_concurrency=1, max_attempts=config.max_attempts,
                                         unresponsive_s=config.unresponsive_s)
            batch = collector.run([held, *others])
            assert batch.rollout_ids == ids and batch.rewards == [1.0] * len(ids) and batch.failed == 0, batch
        except BaseException as exc:
            errors.append(exc)

    def held_attempt_with_its_spans() -> Any:
        attempts = store.list_attempts(held.rollout_id) if store.count_rollouts() else []
        if not attempts:
            return None
        n = store.query(f"SELECT count(*) AS n FROM spans WHERE attempt_id = '{attempts[0].attempt_id}'")
        return attempts[0] if n.to_pylist()[0]["n"] == 3 else None

    with RayRunner(config, store=store, store_url=url, store_token=TOKEN) as runner:
        assert sorted(runner.actors) == ["ray-0", "ray-1"]
        thread = threading.Thread(target=collect, daemon=True)
        thread.start()
        first = wait_for(held_attempt_with_its_spans, errors)
        victim = first.worker_id
        ray_cluster.kill(runner.actors[victim])
        thread.join(timeout=300)
        assert not thread.is_alive() and not errors, errors
        live = sorted(runner.actors)
    assert victim not in live and len(live) == 2 and any("." in w for w in live)  # the dead one was replaced

    assert store.get_rollout(held.rollout_id).config == RolloutConfig(  # the collector's lost-worker policy
        unresponsive_s=3.0, max_attempts=2, retry_on=("unresponsive",))
    attempts = store.list_attempts(held.rollout_id)
    assert [a.status for a in attempts] == ["unresponsive", "succeeded"]
    assert attempts[0].worker_id == victim and attempts[1].worker_id != victim
    assert {store.get_rollout(i).status for i in ids} == {"succeeded"}
    assert all(len(store.list_attempts(r.rollout_id)) == 1 for r in others)

    spans = spans_by_attempt(store)
    steps = [("custom", f"step-{k}") for k in range(3)]
    done = [("reward", "reward"), *steps]  # by name
    assert spans[attempts[0].attempt_id] == steps  # what the lost attempt wrote, kept, no reward
    assert spans[attempts[1].attempt_id] == done
    assert all(spans[store.list_attempts(r.rollout_id)[0].attempt_id] == done for r in others)
    counts = store.query("SELECT count(*) AS n, count(DISTINCT span_id) AS distinct_ids FROM spans").to_pylist()[0]
    assert counts == {"n": 3 + 4 * len(ids), "distinct_ids": 3 + 4 * len(ids)}


def test_workers_the_cluster_cannot_place_are_one_error_naming_the_settings(ray_cluster: Any,
                                                                          served: tuple[SpanStore, str]) -> None:
    store, url = served
    config = RolloutRunnerConfig(backend="ray", workers=1, resources={"CPU": 1, "gpu_box": 1}, start_timeout_s=2)
    with pytest.raises(ConfigError, match=r"runner\.workers/runner\.resources: 1 actors asking .*'gpu_box'.* did "
                       r"not start within 2s \(runner\.start_timeout_s\); the cluster has"):
        RayRunner(config, store=store, store_url=url, store_token=TOKEN).start()
    assert ray_cluster.is_initialized()  # the cluster this process connected to is left as it was


@pytest.mark.vllm
@pytest.mark.slow
def test_spanlab_train_runs_its_rollouts_on_ray_actors_through_the_gateway(
        ray_cluster: Any, request: pytest.FixtureRequest, tmp_path: Path, vllm_server: Any) -> None:
    """The whole job on ``backend: ray``: a subprocess driver joins this cluster by its address, serves its store
    to two actors, and each actor runs the calc agent (its own MCP calculator server) through the job's gateway."""
    address = ray_cluster.get_runtime_context().gcs_address
    config = plugin_config(tmp_path, engine_url=vllm_server.root_url,
                           runner={"backend": "ray", "address": address, "workers": 2, "heartbeat_s": 0.5})
    done = train(request.getfixturevalue("plugin_path"), config, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "runs" / "bon" / "report.json").read_text())
    assert [e["phase"] for e in report["evaluations"]] == ["base", "final"] and len(report["steps"]) == 1
    with SpanStore(tmp_path / "bon.duckdb") as store:
        rows = store.query("SELECT r.rollout_id, a.worker_id, a.status, "
                           "(SELECT count(*) FROM llm_calls c WHERE c.attempt_id = a.attempt_id) AS calls "
                           "FROM rollouts r JOIN attempts a USING (rollout_id)").to_pylist()
    assert len(rows) == 2 + 2 * 2 + 2  # base eval, one best-of-2 round of 2 tasks, final eval: one attempt each
    assert {r["worker_id"] for r in rows} <= {"ray-0", "ray-1"} and all(r["status"] == "succeeded" for r in rows)
    assert all(r["calls"] >= 1 for r in rows)  # every rollout's model calls went through the gateway


@pytest.mark.slow
def test_the_async_loop_keeps_ray_actors_working_and_ends_with_nothing_leased(
        ray_cluster: Any, served: tuple[SpanStore, str]) -> None:
    """``loop: {mode: async}`` on Ray: the actors take the groups the queue keeps outstanding for the whole loop
    (``RayRunner.serve`` on the workers' thread), and the end cancels what they still hold."""
    import itertools

    from spanlab.algos.grpo.async_loop import run_async
    from spanlab.jobs.groups import GroupQueue
    from tests.agents_for_tests import task_draws, toy_tasks
    from tests.async_parts import TinyTrainer

    store, url = served
    config = RolloutRunnerConfig(backend="ray", workers=2, heartbeat_s=1.0)
    with RayRunner(config, store=store, store_url=url, store_token=TOKEN) as runner:
        collector = RolloutCollector(store, "", "tests.agents_for_tests:LongTailAgent", {"median_s": 0.05},
                                     timeout_s=60, remote=runner, worker_concurrency=2)
        trainer = TinyTrainer(store)
        queue = GroupQueue(collector, itertools.chain.from_iterable(task_draws(toy_tasks(6), 2)), 2, in_flight=4,
                           max_staleness=1)
        end = run_async(trainer.parts(), queue, collector.background(), range(3), 2)
        assert all(len(ids) == 4 for _, ids in trainer.trained) and len(trainer.trained) == 3
        assert all(m["staleness_max"] <= 1 for m in trainer.steps)
        workers = {a.worker_id for _, ids in trainer.trained for rid in ids for a in store.list_attempts(rid)}
        assert workers <= set(runner.actors) and workers
    assert store.count_rollouts(("queuing", "requeuing", "preparing", "running")) == 0
    assert end.cancelled_queued + end.cancelled_running + end.unused_finished == 4 * 2
