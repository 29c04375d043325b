"""The engine half of the GPU check (scripts/gpu_check.sh): two vLLM replicas, decode throughput, a weight push.

Starts two vLLM servers of one model side by side (on one GPU each takes --gpu-memory-utilization of it;
on CPU each gets its 1 GiB KV cache and one thread), then sends --requests completions of --max-tokens
sampled tokens (``ignore_eos``, so every request decodes the same length) to one replica and then spread
round-robin over both, and prints generated tokens/s for each; last, reloads the model's weights in place
on both replicas at once (what a training step's push does) and prints the seconds. Sends to the engines
directly: the gateway's routing is tested and measured on its own (docs/replicas.md).

Run: python scripts/gpu_check_engines.py --device gpu [--model smollm2-135m-instruct] [--requests 256]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from typing import Any

import httpx

from spanlab.engine.config import EngineConfig
from spanlab.engine.model import resolve_model
from spanlab.engine.server import VLLMServer
from spanlab.engine.weights import WeightSyncClient

logger = logging.getLogger("gpu_check")
PROMPT = "Count from one to one thousand in words, separated by commas:"


def engine_config(args: argparse.Namespace) -> EngineConfig:
    device = {"device": "gpu", "gpu_memory_utilization": args.gpu_memory_utilization} if args.device == "gpu" \
        else {"device": "cpu", "kv_cache_gib": 1, "cpu_threads": 1}
    return EngineConfig(model=args.model, max_model_len=args.max_model_len, dev_routes=True,
                        startup_timeout_s=args.startup_timeout_s, **device)


async def _decode(urls: list[str], model: str, requests: int, max_tokens: int) -> dict[str, float]:
    """``requests`` completions in flight at once, round-robin over ``urls``; generated tokens per second."""
    body = {"model": model, "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 1.0, "ignore_eos": True}
    async with httpx.AsyncClient(timeout=600) as client:
        async def one(i: int) -> int:
            response = await client.post(f"{urls[i % len(urls)]}/v1/completions", json=body)
            response.raise_for_status()
            return int(response.json()["usage"]["completion_tokens"])

        start = time.perf_counter()
        tokens = sum(await asyncio.gather(*(one(i) for i in range(requests))))
        seconds = time.perf_counter() - start
    return {"replicas": len(urls), "requests": requests, "tokens": tokens, "seconds": seconds,
            "tokens_per_s": tokens / seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cpu", "gpu"], default="gpu")
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.3, help="per replica, on one GPU")
    parser.add_argument("--startup-timeout-s", type=float, default=240.0)
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr)

    config = engine_config(args)
    results: dict[str, Any] = {"device": args.device, "model": args.model}
    with ExitStack() as stack:
        servers = [VLLMServer(config) for _ in range(2)]
        for server in servers:
            stack.callback(server.stop)
        start = time.perf_counter()
        with ThreadPoolExecutor(2) as pool:  # both replicas start at once
            list(pool.map(lambda s: s.start(), servers))
        results["startup_s"] = time.perf_counter() - start
        urls = [s.root_url for s in servers]
        logger.info("2 replicas ready in %.1fs: %s", results["startup_s"], urls)
        asyncio.run(_decode(urls[:1], servers[0].model, 2, 8))  # warm-up
        results["decode"] = [asyncio.run(_decode(urls[:n], servers[0].model, args.requests, args.max_tokens))
                             for n in (1, 2)]
        weights = resolve_model(args.model)
        with ThreadPoolExecutor(2) as pool, ExitStack() as clients:
            syncs = [clients.enter_context(WeightSyncClient(u)) for u in urls]
            start = time.perf_counter()
            timings = list(pool.map(lambda c: c.reload_weights(weights, version="gpu-check"), syncs))
            results["push_both_s"] = time.perf_counter() - start
            results["push_each_s"] = [t.total_s for t in timings]
    for row in results["decode"]:
        print(f"engines: {row['replicas']} replica(s), {row['requests']} requests x {args.max_tokens} tokens: "
              f"{row['tokens_per_s']:.0f} generated tokens/s ({row['seconds']:.1f} s)")
    print(f"engines: startup of 2 replicas {results['startup_s']:.1f} s; weight push to both "
          f"{results['push_both_s']:.2f} s (each {', '.join(f'{s:.2f}' for s in results['push_each_s'])} s)")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=1)


if __name__ == "__main__":
    main()
