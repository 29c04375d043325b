"""The span store's time in one GRPO step: every store call a step makes, timed, on a fresh DuckDB file.

What a step of ``tutorials/calc/grpo.yaml`` asks of the store (32 rollouts, each a TITO session of --calls
LLM calls of ~--prompt + --response token IDs): enqueue, per rollout dequeue + first heartbeat + the gateway's
per-call ``add_spans`` (one call each, as the gateway stores a call before answering) + finish with the
reward, then the adapter's read-back (``iter_samples``) and ``add_metrics``. The step's wall time is not
measured here (it needs the engine and the trainer): divide by the step time of the run you compare with
(benchmarks/README.md gives the calc run's). In-process store, or ``--http`` through ``spanlab store serve``.

Run: .venv/bin/python benchmarks/store_step.py [--rollouts 32] [--calls 4] [--http] [--reps 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from spanlab.adapters.grpo import iter_samples
from spanlab.store import SpanStore, StoreAPI
from spanlab.types import LLMCall, Rollout, Span, reward_span


def one_step(store: StoreAPI, args: argparse.Namespace, step: int) -> float:
    rng = np.random.default_rng(step)
    t0 = time.perf_counter()
    rollouts = store.enqueue([Rollout(input={"task_id": f"t{step}-{i // 4}"}) for i in range(args.rollouts)])
    for _ in rollouts:
        rollout, attempt = store.dequeue(worker_id="w")
        store.heartbeat(attempt.attempt_id)
        prompt = rng.integers(0, 50_000, args.prompt).astype(np.int32)
        for k in range(args.calls):  # a TITO session: each call's prompt is the session so far
            response = rng.integers(0, 50_000, args.response).astype(np.int32)
            mask = np.concatenate([np.zeros(len(prompt), np.uint8), np.ones(len(response), np.uint8)])
            store.add_spans([Span(rollout_id=rollout.rollout_id, attempt_id=attempt.attempt_id, name="chat",
                                  kind="llm_call", attributes={"tito": {"mode": "tito", "segment": 0, "offset": 0,
                                                                        "call": k}},
                                  llm=LLMCall(model="m", prompt_token_ids=prompt, response_token_ids=response,
                                              response_logprobs=np.full(len(response), -0.5, np.float32),
                                              loss_mask=mask))])
            prompt = np.concatenate([prompt, response])
        store.finish_attempt(attempt.attempt_id, "succeeded",
                             [reward_span(rollout.rollout_id, attempt.attempt_id, float(rng.random() < 0.5))])
    samples = list(iter_samples(store, [r.rollout_id for r in rollouts]))
    assert len(samples) == args.rollouts, len(samples)
    store.add_metrics("bench", "grpo", step, {"reward_mean": 0.5, "n_samples": len(samples)})
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rollouts", type=int, default=32)
    ap.add_argument("--calls", type=int, default=4)
    ap.add_argument("--prompt", type=int, default=1000)
    ap.add_argument("--response", type=int, default=200)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--http", action="store_true", help="through a `spanlab store serve` process")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "step.duckdb"
        server = None
        if args.http:
            from tests.stores import ServerProcess

            server = ServerProcess(db).start()
            store: StoreAPI = server.client()
        else:
            store = SpanStore(db)
        try:
            times = [one_step(store, args, step) for step in range(args.reps + 1)][1:]  # the first warms up
        finally:
            store.close()
            if server is not None:
                server.stop()
    calls = args.rollouts * (3 + args.calls)
    print(f"store time per step ({'HTTP' if args.http else 'in-process'}, {args.rollouts} rollouts x {args.calls} "
          f"calls, {calls} store calls + read-back): median {statistics.median(times):.3f} s "
          f"(runs {', '.join(f'{t:.3f}' for t in times)})")


if __name__ == "__main__":
    main()
