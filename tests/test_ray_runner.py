"""Rollout workers on a real local Ray cluster: killing an actor mid-rollout loses and duplicates nothing.

One cluster per module (``ray.init`` with 2 CPUs, no dashboard), stopped in the fixture's teardown. The
actors reach a real store server on 127.0.0.1 with a bearer token, as they do in ``spanlab train``. Workers on
other machines are given *advertised* URLs (``gateway.advertise_url``, ``runner.store_server.advertise_url``):
here each points at a TCP forwarder on another loopback port, so a worker that called the bound URL instead
would leave the forwarder's count at zero.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from spanlab.errors import ConfigError
from spanlab.jobs.rig_backends import open_gateway, open_store
from spanlab.jobs.rollouts import RolloutCollector
from spanlab.runner.config import GatewayListenConfig, RolloutRunnerConfig
from spanlab.runner.ray_runner import RayRunner
from spanlab.store import SpanStore
from spanlab.store.server import create_store_app
from spanlab.threaded_server import ListenConfig, ThreadedServer
from spanlab.types import Rollout, RolloutConfig
from tests.jobs.test_plugin import _config as plugin_config
from tests.jobs.test_plugin import _train as train
from tests.jobs.test_plugin import plugin_path  # noqa: F401  (the fixture: the best-of-n plugin, installed apart)
from tests.stores import free_port

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


class Forwarder:
    """A TCP forwarder from its own loopback port to ``target_port`` (on a thread): an advertised address that is
    not the bound one, the way a NAT or a proxy is; ``connections`` counts who came through it."""

    def __init__(self, target_port: int) -> None:
        self.target_port, self.port, self.connections = target_port, free_port(), 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65_536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))

    def __enter__(self) -> Forwarder:
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._serve, "127.0.0.1", self.port), self._loop).result(10)
        return self

    async def _close(self) -> None:
        self._server.close()
        others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in others:  # the pipes of connections a client keeps open
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()


def _engine(seen_auth: list[str]) -> Starlette:
    """A chat engine (a stand-in: the gateway, store, Ray and HTTP here are real) noting each call's Authorization."""

    async def chat(request: Request) -> JSONResponse:
        seen_auth.append(request.headers.get("authorization", ""))
        return JSONResponse({"id": "c", "object": "chat.completion", "model": "m", "prompt_token_ids": [1, 2],
                             "choices": [{"index": 0, "finish_reason": "stop", "token_ids": [7, 8],
                                          "message": {"role": "assistant", "content": "four"}}],
                             "usage": {"prompt_tokens": 2, "completion_tokens": 2, "total_tokens": 4}})

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])


def test_workers_call_the_advertised_gateway_and_store_urls_with_the_gateway_token(ray_cluster: Any,
                                                                                 tmp_path: Path) -> None:
    """The rig's own ``open_store``/``open_gateway`` with ``runner.store_server`` and ``gateway:`` bound on one port
    and advertised on another: the actors dequeue through the advertised store URL and call the advertised gateway
    with its token as their api_key; the token stops at the gateway (the engine never sees it)."""
    seen_auth: list[str] = []
    store_port, gateway_port = free_port(), free_port()
    with ExitStack() as stack, Forwarder(store_port) as store_fwd, Forwarder(gateway_port) as gateway_fwd, \
            ThreadedServer(_engine(seen_auth), name="engine") as engine:
        runner = RolloutRunnerConfig(backend="ray", workers=2, heartbeat_s=0.5, store_server=ListenConfig(
            port=store_port, advertise_url=f"http://127.0.0.1:{store_fwd.port}"))
        store, store_url, store_token = open_store(stack, runner, tmp_path / "spans.duckdb")
        gateway = GatewayListenConfig(port=gateway_port, advertise_url=f"http://127.0.0.1:{gateway_fwd.port}",
                                      token="gw-s3cret")
        server, gateway_url, gateway_token = open_gateway(stack, gateway, store, [engine.url], tito=False)
        assert (store_url, gateway_url, gateway_token) == (runner.store_server.advertise_url,  # type: ignore[union-attr]
                                                           gateway.advertise_url, "gw-s3cret")
        refused = httpx.post(f"{server.url}/v1/chat/completions", json={"model": "m", "messages": []}, timeout=30)
        assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key", refused.text
        assert store_fwd.connections == gateway_fwd.connections == 0

        remote = stack.enter_context(RayRunner(runner, store=store, store_url=store_url, store_token=store_token))
        collector = RolloutCollector(store, gateway_url, "tests.agents_for_tests:OneCallAgent", {"model": "m"},
                                     timeout_s=120, remote=remote, worker_concurrency=2, gateway_token=gateway_token)
        batch = collector.run([Rollout(input={"question": f"2+{i}?"}) for i in range(4)])
        assert batch.rewards == [1.0] * 4 and batch.failed == 0, batch
        server.flush()
        calls = store.query("SELECT a.worker_id, (SELECT count(*) FROM llm_calls c WHERE c.attempt_id = a.attempt_id)"
                            " AS calls FROM attempts a").to_pylist()
    assert len(calls) == 4 and all(c["calls"] == 1 and c["worker_id"].startswith("ray-") for c in calls), calls
    assert store_fwd.connections > 0 and gateway_fwd.connections > 0  # the actors used the advertised URLs
    assert seen_auth == [""] * 4  # the gateway's token is not forwarded to the engine


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
    to two actors, and each actor runs the calc agent (its own MCP calculator server) through the job's gateway.
    Both servers are given to the actors at advertised URLs (forwarders, as for a NAT), the gateway with a token
    that the calc agent sends as its api_key."""
    address = ray_cluster.get_runtime_context().gcs_address
    store_port, gateway_port = free_port(), free_port()
    with Forwarder(store_port) as store_fwd, Forwarder(gateway_port) as gateway_fwd:
        config = plugin_config(
            tmp_path, engine_url=vllm_server.root_url,
            gateway={"port": gateway_port, "advertise_url": f"http://127.0.0.1:{gateway_fwd.port}", "token": "gw-tok"},
            runner={"backend": "ray", "address": address, "workers": 2, "heartbeat_s": 0.5,
                    "store_server": {"port": store_port, "advertise_url": f"http://127.0.0.1:{store_fwd.port}"}})
        done = train(request.getfixturevalue("plugin_path"), config, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert store_fwd.connections > 0 and gateway_fwd.connections > 0  # the actors called the advertised URLs
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
