"""Sync vs async GRPO (K=1, K=2) on the same work, side by side: wall time, steps/min, rollouts/s, idle workers.

Isolates the scheduling, which is what the async loop changes: the agent is ``LongTailAgent``
(tests/agents_for_tests.py: a seeded lognormal time per rollout, plus straggler tasks whose first sample outlasts
two weight pushes or ``--straggler-s``), the trainer the real ``grpo_step`` on a tiny model plus
``--train-s`` of sleep for a real model's update (a sleep holds no core, as a GPU update would not hold the
workers' CPU) and ``--push-s`` for the reload. Every arm runs the same task draws, delays and trainer through
the real store (DuckDB in memory) and the local collector's workers; the async arms go through the same
``run_async`` and ``GroupQueue`` as ``spanlab train`` with ``loop: {mode: async}``. Columns: ``steady
steps/min`` leaves out the first step (both loops start workers and wait for their first groups there);
``worker idle`` is the share of the ``--concurrency`` rollout slots not running a rollout over the loop.

Leaves out: a real engine (on 2 cores vLLM and the trainer share the CPU, so a real model mostly shows the
contention, see docs/async.md) and held-out accuracy (a fake agent has none).

Run from the repo root: .venv/bin/python benchmarks/async_grpo.py [--steps 10] [--train-s 0.3]
"""

from __future__ import annotations

import argparse
import itertools
import logging
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from spanlab.algos.grpo.async_loop import run_async  # noqa: E402
from spanlab.algos.grpo.loop import run_sync  # noqa: E402
from spanlab.jobs.groups import GroupQueue  # noqa: E402
from spanlab.jobs.rollouts import RolloutCollector  # noqa: E402
from spanlab.store import SpanStore  # noqa: E402
from tests.agents_for_tests import task_draws, toy_tasks  # noqa: E402
from tests.async_parts import TinyTrainer  # noqa: E402

AGENT = "tests.agents_for_tests:LongTailAgent"


def run_arm(args: argparse.Namespace, max_staleness: int | None) -> dict[str, Any]:
    """One loop over the same work; ``max_staleness`` None = sync."""
    pool = toy_tasks(args.tasks, stragglers={f"t{i}": args.straggler_s for i in range(0, args.tasks, args.every)})
    delays = {"median_s": args.median_s, "sigma": args.sigma, "max_s": args.max_s, "seed": args.seed}
    with SpanStore(":memory:") as store:
        collector = RolloutCollector(store, "", AGENT, delays, concurrency=args.concurrency, timeout_s=120)
        trainer = TinyTrainer(store, train_s=args.train_s, push_s=args.push_s)
        draws = task_draws(pool, args.per_step, seed=args.seed)
        started = time.monotonic()
        if max_staleness is None:
            run_sync(trainer.parts(), lambda tasks, _step: collector.collect(tasks, mode="train",
                                                                              group_size=args.group),
                     enumerate(itertools.islice(draws, args.steps)))
        else:
            queue = GroupQueue(collector, itertools.chain.from_iterable(draws), args.group,
                               in_flight=args.in_flight or 2 * args.per_step, max_staleness=max_staleness)
            run_async(trainer.parts(), queue, collector.background(), range(args.steps), args.per_step)
        wall = time.monotonic() - started
        busy = store.query("SELECT coalesce(sum(end_time - start_time), 0) AS s FROM attempts")["s"].to_pylist()[0]
    steps = trainer.steps
    steady = steps[-1]["loop_s"] - steps[0]["loop_s"]
    trained = sum(len(ids) for _, ids in trainer.trained)
    hist = {0: float(trained)} if max_staleness is None else {  # a sync step trains on its own version only
        k: sum(m[f"staleness_{k}"] for m in steps) for k in range(max_staleness + 1)}
    return {
        "wall_s": wall, "steady_steps_per_min": 60 * (len(steps) - 1) / steady if steady > 0 else float("nan"),
        "rollouts_per_s": steps[-1]["rollouts_finished"] / wall, "trained_per_s": trained / wall,
        "dropped": sum(m.get("dropped_stale_rollouts", 0.0) for m in steps),
        "staleness": " ".join(f"{k}:{int(v)}" for k, v in sorted(hist.items())),
        "worker_idle": 1 - busy / (args.concurrency * wall),
        "reward_last": steps[-1]["reward_mean"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--per-step", type=int, default=2, help="groups per step (grpo.tasks_per_step)")
    parser.add_argument("--group", type=int, default=4, help="rollouts per group (grpo.group_size)")
    parser.add_argument("--in-flight", type=int, default=None, help="loop.in_flight_groups (default 2x per-step)")
    parser.add_argument("--concurrency", type=int, default=8, help="rollouts the workers run at once")
    parser.add_argument("--tasks", type=int, default=12)
    parser.add_argument("--every", type=int, default=6, help="every N-th task has a straggling first sample")
    parser.add_argument("--straggler-s", type=float, default=3.0)
    parser.add_argument("--median-s", type=float, default=0.08)
    parser.add_argument("--sigma", type=float, default=1.0)
    parser.add_argument("--max-s", type=float, default=0.8)
    parser.add_argument("--train-s", type=float, default=0.3)
    parser.add_argument("--push-s", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(1)
    arms = {"sync": None, "async K=1": 1, "async K=2": 2}
    results = {name: run_arm(args, k) for name, k in arms.items()}
    cells = {name: {c: f"{v:.3g}" if isinstance(v, float) else str(v) for c, v in row.items()}
             for name, row in results.items()}
    cols = list(next(iter(results.values())))
    widths = {c: max(len(c), *(len(row[c]) for row in cells.values())) + 2 for c in cols}
    print(f"{'':10}" + "".join(f"{c:>{widths[c]}}" for c in cols))
    for name, row in cells.items():
        print(f"{name:10}" + "".join(f"{row[c]:>{widths[c]}}" for c in cols))
    print(f"({args.steps} steps of {args.per_step} groups x {args.group}, {args.concurrency} rollouts at once, "
          f"train {args.train_s}s + push {args.push_s}s per step)")


if __name__ == "__main__":
    main()
