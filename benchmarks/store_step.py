"""The span store's time in one GRPO step, split into what the step waits for and what only adds up.

What a step of ``tutorials/calc/grpo.yaml`` asks of the store (32 rollouts, ``rollouts.concurrency: 16``,
each a TITO session of --calls LLM calls of ~--prompt + --response token IDs), on a fresh DuckDB file:

* the algorithm's own calls, one after the other on the step's path: enqueue, the rewards of the batch
  (``final_rewards``: ``rollout_summaries``), the adapter's read-back (``iter_samples``) and ``add_metrics``;
* each rollout's calls, made by --concurrency rollouts at a time as the job's worker runs them: dequeue, the
  first heartbeat (not waited for: the worker beats beside the agent), the gateway's ``add_spans`` of every
  call (the gateway stores a call before it answers the agent, so the agent waits for that commit) and the
  finish with the reward. Between calls a rollout sleeps
  0 to 2 x --think-s (uniformly), standing in for the engine's generation (seconds in the real job, and
  different for each call), so the writer sees calls spread out as it does in the job rather than in bursts
  of --concurrency at once (equal sleeps kept the rollouts in step: a dequeue then waited ~130 ms for the
  burst ahead of it, where it takes ~10-25 ms alone). A rollout's store time is what it waited on
  these calls; the step waits for its slowest rollouts, so the store's share of the rollout phase is at
  most ``waves x`` the longest rollout store time (waves = rollouts / concurrency, rounded up).

On the step's path: the algorithm's calls + that bound, divided by the wall time of the same step measured in
the same run (enqueue to metrics, the sleeps standing in for generation included), gives the store's share of
that step. The share therefore scales with --think-s: it is the share of a step whose calls each generate for
about --think-s; the seconds on the path are what carries over to another step time. Later heartbeats (every
2 s of a rollout) run beside the agent and keep no call waiting but their own; they are left out. In-process
store, or ``--http`` through ``spanlab store serve``.

Run: .venv/bin/python benchmarks/store_step.py [--rollouts 32] [--concurrency 16] [--calls 4] [--http] [--reps 3]
"""

from __future__ import annotations

import argparse
import math
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from spanlab.adapters.sample_reader import iter_samples
from spanlab.jobs.rollouts import final_rewards
from spanlab.store import SpanStore, StoreAPI
from spanlab.types import LLMCall, Rollout, Span, reward_span


def one_rollout(store: StoreAPI, args: argparse.Namespace, seed: int) -> float:
    """One rollout's store calls as the worker and gateway make them; the seconds it waited on the store."""
    rng = np.random.default_rng(seed)
    waited = 0.0

    def call(fn, *a):
        nonlocal waited
        t0 = time.perf_counter()
        out = fn(*a)
        waited += time.perf_counter() - t0
        return out

    rollout, attempt = call(store.dequeue, "w")
    store.heartbeat(attempt.attempt_id)  # the worker beats beside the agent: writer load, no wait of the rollout's
    prompt = rng.integers(0, 50_000, args.prompt).astype(np.int32)
    for k in range(args.calls):  # a TITO session: each call's prompt is the session so far
        time.sleep(rng.uniform(0, 2 * args.think_s))  # generation times differ, so calls do not arrive in step
        response = rng.integers(0, 50_000, args.response).astype(np.int32)
        mask = np.concatenate([np.zeros(len(prompt), np.uint8), np.ones(len(response), np.uint8)])
        call(store.add_spans, [Span(
            rollout_id=rollout.rollout_id, attempt_id=attempt.attempt_id, name="chat", kind="llm_call",
            attributes={"tito": {"mode": "tito", "segment": 0, "offset": 0, "call": k}},
            llm=LLMCall(model="m", prompt_token_ids=prompt, response_token_ids=response,
                        response_logprobs=np.full(len(response), -0.5, np.float32), loss_mask=mask))])
        prompt = np.concatenate([prompt, response])
    call(store.finish_attempt, attempt.attempt_id, "succeeded",
         [reward_span(rollout.rollout_id, attempt.attempt_id, float(rng.random() < 0.5))])
    return waited


def one_step(store: StoreAPI, args: argparse.Namespace, step: int) -> dict[str, float]:
    t0 = time.perf_counter()
    rollouts = store.enqueue([Rollout(input={"task_id": f"t{step}-{i // 4}"}, metadata={"group_id": f"t{i // 4}"})
                              for i in range(args.rollouts)])
    algo = time.perf_counter() - t0
    t1 = time.perf_counter()
    with ThreadPoolExecutor(args.concurrency) as pool:
        waits = list(pool.map(lambda i: one_rollout(store, args, step * 1000 + i), range(args.rollouts)))
    phase = time.perf_counter() - t1
    t2 = time.perf_counter()
    ids = [r.rollout_id for r in rollouts]
    final_rewards(store, ids)
    samples = list(iter_samples(store, ids))
    assert len(samples) == args.rollouts, len(samples)
    store.add_metrics("bench", "grpo", step, {"reward_mean": 0.5, "n_samples": len(samples)})
    algo += time.perf_counter() - t2
    waves = math.ceil(args.rollouts / args.concurrency)
    return {"algo_s": algo, "rollout_max_s": max(waits), "rollout_mean_s": statistics.mean(waits),
            "path_s": algo + waves * max(waits), "sum_s": algo + sum(waits), "phase_s": phase,
            "step_s": time.perf_counter() - t0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rollouts", type=int, default=32)
    ap.add_argument("--concurrency", type=int, default=16, help="rollouts in flight (rollouts.concurrency)")
    ap.add_argument("--calls", type=int, default=4)
    ap.add_argument("--prompt", type=int, default=1000)
    ap.add_argument("--response", type=int, default=200)
    ap.add_argument("--think-s", type=float, default=0.25, help="mean sleep between a rollout's calls (generation)")
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
            runs = [one_step(store, args, step) for step in range(args.reps + 1)][1:]  # the first warms up
        finally:
            store.close()
            if server is not None:
                server.stop()
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    algo_runs = ", ".join(f"{r['algo_s']:.3f}" for r in runs)
    share_runs = ", ".join(f"{100 * r['path_s'] / r['step_s']:.2f}%" for r in runs)
    print(f"store time of one GRPO step ({'HTTP' if args.http else 'in-process'}, {args.rollouts} rollouts, "
          f"{args.concurrency} in flight, {args.calls} calls each, {args.think_s:g} s between calls), medians of "
          f"{args.reps}:")
    print(f"  algorithm's calls (enqueue, rewards, read-back, metrics): {med['algo_s']:.3f} s "
          f"(runs {algo_runs})")
    print(f"  a rollout's wait on the store: mean {med['rollout_mean_s']:.3f} s, slowest {med['rollout_max_s']:.3f} s")
    share = statistics.median(r["path_s"] / r["step_s"] for r in runs)
    print(f"  the step, measured (generation stood in by sleeps of mean {args.think_s:g} s per call): "
          f"{med['step_s']:.2f} s")
    print(f"  on the step's path (algorithm + waves x slowest rollout): {med['path_s']:.3f} s = "
          f"{100 * share:.2f}% of the step (runs {share_runs})")
    print(f"  every call added up (what the writer did, mostly beside generation): {med['sum_s']:.3f} s = "
          f"{100 * statistics.median(r['sum_s'] / r['step_s'] for r in runs):.1f}% of the step")


if __name__ == "__main__":
    main()
