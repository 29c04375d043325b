"""TITO vs per-call recording on a 10-turn tool-using session: trainer tokens, and latency TITO adds per call.

An OpenAI-client agent answers arithmetic questions with a calc tool (two worked examples open the
conversation, since SmolLM2-135M calls no tool on its own), through two gateways on one real vLLM and one
DuckDB file: one in TITO mode, one per call. Greedy, max_tokens 48, ``--turns`` chat calls per session.

* trainer tokens: per-call triplets = sum over calls of (prompt + response) IDs, what a trainer processes
  when every call is its own sample; merged = the session's TITO segments (``tito_sessions`` view), where
  every token is processed once and the loss mask marks the sampled ones.
* latency: per call, the client's wall time in TITO mode minus per-call mode (same call index, paired
  over repetitions; vLLM's own jitter dominates on 2 shared cores), and the gateway's own TITO work per
  call (``attributes.tito.gateway_ms``: buffer extension, renders, parse; a new segment's ``/tokenize``).

Left out: sampling (greedy only), concurrent sessions. The spans stay in ``--db`` for ``spanlab drift``.
Run: .venv/bin/python benchmarks/tito_tokens.py [--upstream http://127.0.0.1:8765] [--turns 10] [--reps 2]
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from openai import OpenAI

from spanlab.agents.calc.mcp_server import CalculatorError, evaluate
from spanlab.gateway import GatewayServer
from spanlab.store import SpanStore

CALC: dict[str, Any] = {"type": "function", "function": {
    "name": "calc", "description": "evaluate arithmetic",
    "parameters": {"type": "object", "properties": {"expr": {"type": "string"}}, "required": ["expr"]}}}
QUESTIONS = ["What is 47 + 38?", "What is 9 * 8?", "What is 100 - 37?", "What is 15 * 4?", "What is 81 / 9?",
             "What is 23 + 19?", "What is 7 * 13?", "What is 64 - 29?", "What is 12 + 88?", "What is 6 * 7?"]


def _demo(i: int, expr: str, result: str) -> list[dict[str, Any]]:
    call = {"id": f"demo{i}", "type": "function", "function": {"name": "calc", "arguments": json.dumps({"expr": expr})}}
    return [{"role": "user", "content": f"What is {expr}?"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"demo{i}", "name": "calc", "content": result},
            {"role": "assistant", "content": f"The answer is {result}."}]


FEW_SHOT = [{"role": "system", "content": "You answer arithmetic questions by calling the calc tool, then state "
             "the answer."}, *_demo(1, "3 + 4", "7"), *_demo(2, "12 * 5", "60")]


def _calc(expr: str) -> str:
    """The calc tool: the tutorial calculator's safe evaluator (no eval), errors as text for the model."""
    try:
        return evaluate(expr)
    except CalculatorError:
        return "error: digits and + - * / only"


def run_session(gw: GatewayServer, store: SpanStore, model: str, turns: int) -> tuple[str, list[float], int]:
    """One agent session of ``turns`` chat calls; returns (attempt_id, per-call seconds, tool calls made)."""
    store.enqueue_one({"bench": "tito_tokens"})
    rollout, attempt = store.dequeue(worker_id="bench")
    client = OpenAI(base_url=gw.base_url(rollout.rollout_id, attempt.attempt_id), api_key="x", max_retries=0)
    messages: list[dict[str, Any]] = [*FEW_SHOT, {"role": "user", "content": QUESTIONS[0]}]
    latencies, calls, asked = [], 0, 1
    for _ in range(turns):
        t0 = time.perf_counter()
        reply = client.chat.completions.create(model=model, messages=messages, tools=[CALC], temperature=0,
                                               max_tokens=48)
        latencies.append(time.perf_counter() - t0)
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if message.tool_calls:
            calls += len(message.tool_calls)
            for tc in message.tool_calls:
                try:
                    expr = str(json.loads(tc.function.arguments).get("expr", ""))
                except (ValueError, AttributeError):
                    expr = ""
                messages.append({"role": "tool", "tool_call_id": tc.id, "name": tc.function.name,
                                 "content": _calc(expr)})
        else:
            messages.append({"role": "user", "content": QUESTIONS[asked % len(QUESTIONS)]})
            asked += 1
    gw.flush()
    return attempt.attempt_id, latencies, calls


def token_counts(store: SpanStore, attempt_id: str) -> dict[str, Any]:
    """``query`` takes one SELECT and no parameters (it is the user's SQL surface): the ID goes in as a literal."""
    aid = "'" + attempt_id.replace("'", "''") + "'"
    per_call = store.query(
        "SELECT count(*) AS calls, sum(prompt_len + response_len)::BIGINT AS tokens, "
        f"sum(response_len)::BIGINT AS sampled FROM llm_calls WHERE attempt_id = {aid}").to_pylist()[0]
    merged = store.query(
        "SELECT count(*) AS segments, sum(num_tokens)::BIGINT AS tokens, sum(num_sampled)::BIGINT AS sampled "
        f"FROM tito_sessions WHERE attempt_id = {aid}").to_pylist()[0]
    gw_ms = store.query("SELECT CAST(attributes->>'$.tito.gateway_ms' AS DOUBLE) AS ms FROM llm_calls "
                        f"WHERE attempt_id = {aid} ORDER BY sequence_id").column("ms").to_pylist()
    return {"per_call": per_call, "merged": merged, "gateway_ms": gw_ms}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--upstream", default="http://127.0.0.1:8765")
    p.add_argument("--turns", type=int, default=10)
    p.add_argument("--reps", type=int, default=2, help="sessions per mode (after one warm-up session)")
    p.add_argument("--db", type=Path, default=None, help="span store file (default: a temp file, printed)")
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    db = args.db or Path(tempfile.mkdtemp(prefix="tito-bench-")) / "spans.duckdb"
    model = httpx.get(f"{args.upstream}/v1/models", timeout=10).json()["data"][0]["id"]
    with SpanStore(db) as store, GatewayServer(store, args.upstream) as off, \
            GatewayServer(store, args.upstream, tito=True) as tito:
        run_session(off, store, model, args.turns)  # warm-up: fills vLLM's prefix cache for both modes
        lat: dict[str, list[list[float]]] = {"tito": [], "per_call": []}
        tito_attempts: list[str] = []
        for rep in range(args.reps):
            order = [("tito", tito), ("per_call", off)] if rep % 2 == 0 else [("per_call", off), ("tito", tito)]
            for mode, gw in order:
                attempt_id, seconds, calls = run_session(gw, store, model, args.turns)
                lat[mode].append(seconds)
                print(f"rep {rep} {mode:8s}: {len(seconds)} calls, {calls} tool calls, "
                      f"median {statistics.median(seconds) * 1000:.0f} ms/call")
                if mode == "tito":
                    tito_attempts.append(attempt_id)
        counts = [token_counts(store, a) for a in tito_attempts]
    for c in counts:
        pc, mg = c["per_call"], c["merged"]
        print(f"session: {pc['calls']} calls; per-call triplets {pc['tokens']} tokens; merged buffer "
              f"{mg['tokens']} tokens in {mg['segments']} segment(s) ({pc['tokens'] / mg['tokens']:.1f}x fewer); "
              f"sampled {pc['sampled']} = mask-1 {mg['sampled']}")
    diffs = [t - o for ts, os_ in zip(lat["tito"], lat["per_call"], strict=True) for t, o in zip(ts, os_, strict=True)]
    gw_ms = sorted(ms for c in counts for ms in c["gateway_ms"] if ms is not None)
    print(f"latency per call: TITO median {statistics.median([x for r in lat['tito'] for x in r]) * 1000:.0f} ms, "
          f"per-call median {statistics.median([x for r in lat['per_call'] for x in r]) * 1000:.0f} ms, "
          f"paired difference median {statistics.median(diffs) * 1000:+.0f} ms")
    print(f"gateway TITO work per call: p50 {statistics.median(gw_ms):.1f} ms, "
          f"p90 {gw_ms[int(0.9 * (len(gw_ms) - 1))]:.1f} ms, max {gw_ms[-1]:.1f} ms (n={len(gw_ms)})")
    print(f"spans kept in {db} (try: spanlab drift --db {db})")


if __name__ == "__main__":
    main()
