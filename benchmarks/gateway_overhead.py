"""Latency the gateway adds over calling the engine directly, and calls/s it records.

Three processes on loopback: a fast fake engine (a real HTTP server speaking vLLM's protocol with
canned responses: token IDs, logprobs, SSE; it never samples, so the gateway's own cost is what shows),
the gateway (``python -m spanlab.gateway`` with a DuckDB file store), and this client.

* latency: the same request sent alternately straight to the engine and through the gateway, one at a
  time; p50/p99 of each, and the overhead (gateway minus direct) and ratio at p50/p99;
* throughput: ``--concurrency`` agents hammering the gateway for ``--seconds``; calls/s answered, spans/s
  recorded (the writer flushed, then counted from ``/health``), how long answers waited for their spans to
  be stored (``/health``'s ``write_ms``), and CPU ms per call of each process;
* a last line with the three figures of issue 43's targets (calls/s, store write p99, added latency p50).

``--apis chat,responses,messages`` measures the latency per API the gateway speaks: the same conversation sent to
the gateway as a chat, Responses or Messages request (translated there to the same chat call), each round one
direct call to the engine's chat route and one call per API; throughput runs on the first API.

Leaves out: a real engine's generation time (hundreds of ms per call on CPU dwarfs any proxy cost);
the fake engine shares the 2 cores with the gateway and the client, so figures are upper bounds.

Run:  .venv/bin/python benchmarks/gateway_overhead.py            (about a minute)
      .venv/bin/python benchmarks/gateway_overhead.py --stream   (SSE, one chunk per token)
      .venv/bin/python benchmarks/gateway_overhead.py --apis chat,responses,messages   (added latency per API)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import httpx

HOST = "127.0.0.1"


# --- the fake engine -------------------------------------------------------------------------------
def _vllm_response(n_prompt: int, n_resp: int, body: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A vLLM-shaped chat response, and the same as SSE chunks, honouring the fields the caller asked."""
    ids = [(1000 + 7 * i) % 49_000 for i in range(n_resp)]
    want_ids, want_lp = bool(body.get("return_token_ids")), bool(body.get("logprobs"))
    lp = lambda i: {"content": [{"token": f"t{i}", "logprob": -0.5, "bytes": [116], "top_logprobs": []}]}  # noqa: E731
    message = {
        "role": "assistant",
        "content": "".join(f"t{i}" for i in ids[:-1]),
        "refusal": None,
        "tool_calls": [],
        "reasoning": None,
    }
    choice: dict[str, Any] = {
        "index": 0,
        "message": message,
        "finish_reason": "stop",
        "stop_reason": None,
        "logprobs": {"content": [lp(i)["content"][0] for i in ids]} if want_lp else None,
    }
    if want_ids:
        choice["token_ids"] = ids
    usage = {"prompt_tokens": n_prompt, "completion_tokens": n_resp, "total_tokens": n_prompt + n_resp}
    resp: dict[str, Any] = {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "created": 0,
        "model": "bench",
        "choices": [choice],
        "usage": usage,
        "prompt_logprobs": None,
    }
    if want_ids:
        resp["prompt_token_ids"] = list(range(100, 100 + n_prompt))
    first = {
        "id": "chatcmpl-bench",
        "object": "chat.completion.chunk",
        "model": "bench",
        "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None}],
    }
    if want_ids:
        first["prompt_token_ids"] = resp["prompt_token_ids"]
    chunks = [first]
    for k, tok in enumerate(ids):
        c: dict[str, Any] = {
            "index": 0,
            "delta": {"content": f"t{tok}" if k < n_resp - 1 else ""},
            "logprobs": lp(tok) if want_lp else None,
            "finish_reason": "stop" if k == n_resp - 1 else None,
        }
        if want_ids:
            c["token_ids"] = [tok]
        chunks.append({"id": "chatcmpl-bench", "object": "chat.completion.chunk", "model": "bench", "choices": [c]})
    return resp, chunks


def serve_fake_engine(port: int, n_prompt: int, n_resp: int) -> None:
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Route

    cache: dict[tuple[bool, bool, bool], tuple[bytes, list[bytes]]] = {}

    async def chat(request: Request) -> Response:
        body = json.loads(await request.body())
        key = (bool(body.get("return_token_ids")), bool(body.get("logprobs")), bool(body.get("stream")))
        if key not in cache:
            resp, chunks = _vllm_response(n_prompt, n_resp, body)
            events = [f"data: {json.dumps(c)}\n\n".encode() for c in chunks] + [b"data: [DONE]\n\n"]
            cache[key] = (json.dumps(resp).encode(), events)
        full, events = cache[key]
        if key[2]:

            async def gen():
                for e in events:
                    yield e

            return StreamingResponse(gen(), media_type="text/event-stream")
        return Response(full, media_type="application/json")

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": "bench", "object": "model", "max_model_len": 4096}]})

    async def health(request: Request) -> Response:
        return Response(status_code=200)

    app = Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"]), Route("/v1/models", models),
                            Route("/health", health)])
    uvicorn.run(app, host=HOST, port=port, log_level="warning", access_log=False)


# --- the client ------------------------------------------------------------------------------------
def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def _wait_up(url: str, proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url} exited with {proc.returncode}")
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{url} did not come up")


def _cpu_s(pid: int, tid: int | None = None) -> float:
    """User + system CPU seconds a process (or one of its threads) has used so far (Linux /proc)."""
    stat = Path(f"/proc/{pid}/task/{tid}/stat" if tid else f"/proc/{pid}/stat").read_text()
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _cpu_all(gateway: subprocess.Popen, engine: subprocess.Popen) -> dict[str, float]:
    """CPU seconds so far: the gateway's event-loop thread, the rest of the gateway (span writer,
    thread pool), the fake engine, this client."""
    gw_total, gw_loop = _cpu_s(gateway.pid), _cpu_s(gateway.pid, gateway.pid)
    return {
        "gateway_loop": gw_loop,
        "gateway_other": gw_total - gw_loop,
        "engine": _cpu_s(engine.pid),
        "client": time.process_time(),
    }


def _request(n_msgs: int) -> dict[str, Any]:
    msgs = [{"role": "system", "content": "You are a careful assistant. " * 20}]
    msgs += [{"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i} " * 30} for i in range(n_msgs)]
    return {"model": "bench", "messages": msgs, "max_tokens": 64, "temperature": 1.0}


API_PATHS = {"chat": "/v1/chat/completions", "responses": "/v1/responses", "messages": "/v1/messages"}


def api_request(chat: dict[str, Any], api: str) -> dict[str, Any]:
    """The chat request ``chat`` as ``api`` would send it (the gateway translates it back to the same chat call)."""
    system, turns = chat["messages"][0]["content"], chat["messages"][1:]
    if api == "responses":
        return {"model": chat["model"], "instructions": system, "input": turns, "max_output_tokens": chat["max_tokens"],
                "temperature": chat["temperature"]}
    if api == "messages":
        return {"model": chat["model"], "system": system, "messages": turns, "max_tokens": chat["max_tokens"],
                "temperature": chat["temperature"]}
    return chat


async def _call(session: aiohttp.ClientSession, url: str, body: bytes, headers: dict[str, str] | None = None) -> float:
    """One call, body read to the end (for a stream: every SSE event); milliseconds."""
    t0 = time.perf_counter()
    async with session.post(url, data=body, headers={"content-type": "application/json", **(headers or {})}) as r:
        async for _ in r.content.iter_any():
            pass
        r.raise_for_status()
    return (time.perf_counter() - t0) * 1000


def _pct(xs: list[float], q: int) -> float:
    return statistics.quantiles(xs, n=100, method="inclusive")[q - 1]


async def latency(direct_url: str, direct_body: bytes, targets: dict[str, tuple[str, bytes]], n: int
                  ) -> dict[str, dict[str, float]]:
    """Per round one direct call, then one call to each gateway target, one at a time, so every path sees the same
    machine load (a loaded machine's drift hits them all alike); per target its figures against the direct calls."""
    d_ms: list[float] = []
    g_ms: dict[str, list[float]] = {name: [] for name in targets}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=2)) as s:
        for _ in range(min(200, n)):  # warm up every path (connections, caches)
            await _call(s, direct_url, direct_body)
            for url, body in targets.values():
                await _call(s, url, body)
        for _ in range(n):
            d_ms.append(await _call(s, direct_url, direct_body))
            for name, (url, body) in targets.items():
                g_ms[name].append(await _call(s, url, body))
    out: dict[str, dict[str, float]] = {name: {} for name in targets}
    for name, ms in g_ms.items():
        for q in (50, 99):
            d, g = _pct(d_ms, q), _pct(ms, q)
            out[name].update({f"direct_p{q}_ms": d, f"gateway_p{q}_ms": g, f"overhead_p{q}_ms": g - d,
                              f"ratio_p{q}": g / d})
    return out


async def throughput(
    url: str, body: bytes, concurrency: int, seconds: float, headers: dict[str, str] | None = None
) -> tuple[int, float]:
    """``concurrency`` agents calling back to back for ``seconds``; returns (calls, elapsed s)."""
    done = 0
    deadline = time.perf_counter() + seconds
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as s:

        async def agent() -> None:
            nonlocal done
            while time.perf_counter() < deadline:
                await _call(s, url, body, headers)
                done += 1

        t0 = time.perf_counter()
        await asyncio.gather(*(agent() for _ in range(concurrency)))
        return done, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--serve-engine", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--response-tokens", type=int, default=64)
    ap.add_argument("--messages", type=int, default=6, help="chat turns in each request")
    ap.add_argument("--n", type=int, default=2000, help="sequential calls per path for latency")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--stream", action="store_true")
    ap.add_argument("--apis", default="chat", help="comma-separated: chat, responses, messages (latency per API)")
    ap.add_argument("--flush-interval", type=float, default=None, help="gateway span writer batching interval (s)")
    ap.add_argument("--db", default=None, help="store file (default: a temp file; ':memory:' for none)")
    args = ap.parse_args()
    if args.serve_engine:
        serve_fake_engine(args.serve_engine, args.prompt_tokens, args.response_tokens)
        return

    eport, gport = _free_port(), _free_port()
    tmp = tempfile.TemporaryDirectory()
    db = args.db or str(Path(tmp.name) / "bench.duckdb")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    engine = subprocess.Popen(
        [
            sys.executable,
            __file__,
            "--serve-engine",
            str(eport),
            "--prompt-tokens",
            str(args.prompt_tokens),
            "--response-tokens",
            str(args.response_tokens),
        ],
        env=env,
    )
    gateway = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "spanlab.gateway",
            "--upstream",
            f"http://{HOST}:{eport}",
            "--db",
            db,
            "--port",
            str(gport),
            "--log-level",
            "warning",
        ]
        + ([] if args.flush_interval is None else ["--flush-interval", str(args.flush_interval)]),
        env=env,
    )
    try:
        _wait_up(f"http://{HOST}:{eport}/v1/models", engine)
        _wait_up(f"http://{HOST}:{gport}/health", gateway)
        apis = args.apis.split(",")
        if unknown := set(apis) - set(API_PATHS):
            raise SystemExit(f"--apis: unknown {sorted(unknown)}; choose from {sorted(API_PATHS)}")
        chat = {**_request(args.messages), "stream": args.stream}
        direct_body = json.dumps(chat).encode()
        direct_url = f"http://{HOST}:{eport}/v1/chat/completions"
        print(
            f"# {os.cpu_count()} cores; request {len(direct_body)} B; {args.prompt_tokens} prompt + "
            f"{args.response_tokens} response IDs per call; stream={args.stream}; store={db}"
        )
        targets = {api: (f"http://{HOST}:{gport}{API_PATHS[api]}",
                         json.dumps({**api_request(chat, api), "stream": args.stream}).encode()) for api in apis}
        lats = asyncio.run(latency(direct_url, direct_body, targets, args.n))
        for api in apis:
            print(f"# api {api}: {API_PATHS[api]} through the gateway vs the engine's chat route")
            for k, v in lats[api].items():
                print(f"{k:>20}: {v:8.3f}")
        lat = lats[apis[0]]
        body = json.dumps({**api_request(chat, apis[0]), "stream": args.stream}).encode()
        gw_url = f"http://{HOST}:{gport}{API_PATHS[apis[0]]}"
        before = httpx.get(f"http://{HOST}:{gport}/health").json()["spans"]["written"]
        d_calls, d_elapsed = asyncio.run(throughput(direct_url, direct_body, args.concurrency, args.seconds / 2))
        print(f"{'direct_calls_per_s':>20}: {d_calls / d_elapsed:8.1f}  (the fake engine alone, for scale)")
        cpu0 = _cpu_all(gateway, engine)
        calls, elapsed = asyncio.run(throughput(gw_url, body, args.concurrency, args.seconds))
        t_flush = time.perf_counter()
        httpx.post(f"http://{HOST}:{gport}/spanlab/flush", timeout=120).raise_for_status()
        flush_s = time.perf_counter() - t_flush
        cpu1 = _cpu_all(gateway, engine)
        spans = httpx.get(f"http://{HOST}:{gport}/health").json()["spans"]
        recorded = spans["written"] - before
        print(
            f"{'calls_per_s':>20}: {calls / elapsed:8.1f}  ({calls} calls, concurrency {args.concurrency}, "
            f"{elapsed:.1f} s)"
        )
        print(
            f"{'recorded_per_s':>20}: {recorded / (elapsed + flush_s):8.1f}  ({recorded} spans stored, "
            f"flush after load {flush_s * 1000:.0f} ms, given up {spans['given_up']})"
        )
        write = spans["write_ms"]  # the last (up to 1,024) answers' waits on the store: the load phase's
        print(f"{'store_write_ms':>20}: p50 {write['p50']:.1f}  p99 {write['p99']:.1f}  max {write['max']:.1f}  "
              f"(the last {write['n']} answers' wait for their spans to be stored)")
        per_call = "  ".join(f"{k} {(cpu1[k] - cpu0[k]) * 1000 / calls:.2f}" for k in cpu0)
        print(f"{'cpu_ms_per_call':>20}: {per_call}  (load avg now {os.getloadavg()[0]:.1f})")
        print(f"{'targets':>20}: calls/s {calls / elapsed:.0f} (>= 500)  store write p99 {write['p99']:.1f} ms "
              f"(<= 20)  added p50 {lat['overhead_p50_ms']:.2f} ms (<= 2.5)")
    finally:
        for p in (gateway, engine):
            p.terminate()
        for p in (gateway, engine):
            p.wait(30)
        tmp.cleanup()


if __name__ == "__main__":
    main()
