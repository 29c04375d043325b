"""Latency the gateway adds with 1 vs 2 engines behind it (routing by attempt, health probes on).

Processes on loopback: two fast fake engines (the real-HTTP vLLM stand-in of gateway_overhead.py: canned
token IDs and logprobs, no sampling, so only the gateway's own cost shows), a gateway in front of the first
engine only, a gateway in front of both (``--upstream`` twice: rendezvous pinning per attempt, /health probes
every 5 s), each writing to its own DuckDB file, and this client. Calls are attributed to one of ``--attempts``
attempts in turn (made in the store before the gateways start), so the 2-engine gateway pins and spreads them.

Latency: the same request sent in turn straight to an engine, through the 1-engine and through the 2-engine
gateway, one at a time; p50/p99 of each and the overhead (gateway minus direct). Throughput:
``--concurrency`` agents (each on its own attempt) for ``--seconds`` against each gateway. Leaves out a real
engine's generation time (hundreds of ms per call on CPU): with fake engines sharing the 2 cores, a second
engine adds no capacity here, so this measures what routing costs, not what replicas gain (that needs real
engines on their own cores: scripts/gpu_check.sh).

Run:  .venv/bin/python benchmarks/gateway_replicas.py     (about a minute)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).parent))
from gateway_overhead import HOST, _call, _free_port, _pct, _request, _wait_up

from spanlab.store import SpanStore


def _attempt_store(path: Path, n: int) -> list[tuple[str, str]]:
    with SpanStore(path) as store:
        out = []
        for i in range(n):
            store.enqueue_one({"q": i})
            got = store.dequeue(worker_id="bench")
            assert got is not None
            out.append((got[0].rollout_id, got[1].attempt_id))
    return out


async def latency(paths: dict[str, list[str]], body: bytes, n: int) -> dict[str, list[float]]:
    """Each path is a list of URLs used in turn; every round calls each path once, so all see the same load."""
    ms: dict[str, list[float]] = {name: [] for name in paths}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=4)) as s:
        for i in range(min(200, n) + n):
            for name, urls in paths.items():
                t = await _call(s, urls[i % len(urls)], body)
                if i >= min(200, n):  # the first rounds warm connections and caches
                    ms[name].append(t)
    return ms


async def throughput(urls: list[str], body: bytes, concurrency: int, seconds: float) -> tuple[int, float]:
    """``concurrency`` agents calling back to back for ``seconds``, agent i on attempt i; (calls, elapsed s)."""
    done = 0
    deadline = time.perf_counter() + seconds
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as s:

        async def agent(url: str) -> None:
            nonlocal done
            while time.perf_counter() < deadline:
                await _call(s, url, body)
                done += 1

        t0 = time.perf_counter()
        await asyncio.gather(*(agent(urls[i % len(urls)]) for i in range(concurrency)))
        return done, time.perf_counter() - t0


def pick_cost_us(n: int = 20_000) -> tuple[float, float]:
    """Microseconds per ``Router.pick`` over two engines: an attempt's first call (hash), a later call (LRU)."""
    from spanlab.gateway.config import GatewayConfig
    from spanlab.gateway.routing import Router
    from spanlab.gateway.upstream import UpstreamClient

    urls = ("http://127.0.0.1:1", "http://127.0.0.1:2")
    config = GatewayConfig(upstream_urls=urls)
    router = Router([UpstreamClient(config, u) for u in urls])
    keys = [f"ro-{i:016x}/at-{i:016x}" for i in range(n)]
    t0 = time.perf_counter()
    for k in keys:
        router.pick(k)
    t1 = time.perf_counter()
    for k in keys:
        router.pick(k)
    t2 = time.perf_counter()
    return (t1 - t0) / n * 1e6, (t2 - t1) / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=2000, help="sequential calls per path for latency")
    ap.add_argument("--attempts", type=int, default=64, help="attempts the calls are attributed to, in turn")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=10.0)
    args = ap.parse_args()

    tmp = tempfile.TemporaryDirectory()
    db1, db2 = Path(tmp.name) / "one.duckdb", Path(tmp.name) / "two.duckdb"
    attempts = _attempt_store(db1, args.attempts)
    shutil.copy(db1, db2)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    eports = [_free_port(), _free_port()]
    engines = [subprocess.Popen([sys.executable, str(Path(__file__).with_name("gateway_overhead.py")),
                                 "--serve-engine", str(p)], env=env) for p in eports]
    eurls = [f"http://{HOST}:{p}" for p in eports]

    def gateway(db: Path, upstreams: list[str]) -> tuple[subprocess.Popen, str]:
        port = _free_port()
        cmd = [sys.executable, "-m", "spanlab.gateway", "--db", str(db), "--port", str(port), "--log-level", "warning"]
        for url in upstreams:
            cmd += ["--upstream", url]
        return subprocess.Popen(cmd, env=env), f"http://{HOST}:{port}"

    gw1, gw1_url = gateway(db1, eurls[:1])
    gw2, gw2_url = gateway(db2, eurls)
    procs = [gw1, gw2, *engines]
    try:
        for url, proc in zip(eurls, engines, strict=True):
            _wait_up(f"{url}/v1/models", proc)
        _wait_up(f"{gw1_url}/health", gw1)
        _wait_up(f"{gw2_url}/health", gw2)
        body = json.dumps(_request(6)).encode()
        chat = "/v1/chat/completions"
        paths = {
            "direct": [u + chat for u in eurls],
            "gateway_1_engine": [f"{gw1_url}/rollout/{r}/attempt/{a}{chat}" for r, a in attempts],
            "gateway_2_engines": [f"{gw2_url}/rollout/{r}/attempt/{a}{chat}" for r, a in attempts],
        }
        print(f"# {os.cpu_count()} cores; request {len(body)} B; {args.attempts} attempts; n={args.n} per path; "
              f"load avg {os.getloadavg()[0]:.1f}")
        first_us, later_us = pick_cost_us()
        print(f"{'Router.pick':>18}: {first_us:.1f} us an attempt's first call, {later_us:.1f} us a later one")
        ms = asyncio.run(latency(paths, body, args.n))
        d50, d99 = _pct(ms["direct"], 50), _pct(ms["direct"], 99)
        for name, xs in ms.items():
            p50, p99 = _pct(xs, 50), _pct(xs, 99)
            extra = "" if name == "direct" else f"  added p50 {p50 - d50:6.3f}  added p99 {p99 - d99:6.3f}"
            print(f"{name:>18}: p50 {p50:7.3f} ms  p99 {p99:7.3f} ms{extra}")
        for name, urls in (("gateway_1_engine", paths["gateway_1_engine"]),
                           ("gateway_2_engines", paths["gateway_2_engines"])):
            calls, elapsed = asyncio.run(throughput(urls, body, args.concurrency, args.seconds))
            print(f"{name:>18}: {calls / elapsed:7.1f} calls/s at concurrency {args.concurrency}")
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(30)
        time.sleep(0.1)
        tmp.cleanup()


if __name__ == "__main__":
    main()
