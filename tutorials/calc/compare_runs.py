"""GRPO variants of the calc main job from one warm start: what each gained on level 4 and kept on levels 1-3.

Warm-start once (the main job with ``grpo.steps: 0``: it evaluates phase ``warm_start`` and writes
``runs/calc-ws/final``), run each variant from that folder (``engine.model``, no ``warm_start``, ``eval.base:
false``), then:

    python tutorials/calc/compare_runs.py --start runs/calc-ws.duckdb runs/calc-rl.duckdb runs/calc-ptx.duckdb

Prints, per variant: each split's accuracy at the start and the end, paired by task with a 95% bootstrap interval
(:mod:`spanlab.compare`); the demonstrated levels' paired change level by level (test and family pooled); and,
where the runs recorded it, the share of answers whose calculator expression used more operations than the
problem needs (``calc.extra_ops``), at the start and the end.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

from spanlab.agents.calc.operations import EXTRA_OPS_METRIC, call_expression, extra_operations
from spanlab.compare import Arm, build_table
from spanlab.jobs.rollouts import rollout_metrics
from spanlab.stats import paired_difference
from spanlab.store import SpanStore, StoreAPI

SPLITS = ("test", "family", "test_l4", "family_l4", "depth")
DEMONSTRATED = ("test", "family")


def by_task(store: StoreAPI, phase: str, splits: tuple[str, ...]) -> dict[tuple[str, str], tuple[int, float]]:
    """(split, task_id) -> (level, reward) of the held-out rollouts of ``phase``."""
    out: dict[tuple[str, str], tuple[int, float]] = {}
    for split in splits:
        for row in store.rollout_summaries(metadata={"phase": phase, "split": split}):
            if row.mode == "test" and isinstance(row.input, dict):
                out[(split, str(row.input["task_id"]))] = (int(row.input.get("level", 0)),
                                                           float(row.final_reward or 0.0))
    return out


def extra_ops_share(store: StoreAPI, phase: str) -> dict[str, float]:
    """split -> share of the held-out rollouts of ``phase`` whose answer's expression has more operations than
    the task needs: the runs' own ``calc.extra_ops`` metric spans, or, in a store recorded before that metric,
    the same rule applied to the recorded calls' calculator arguments."""
    shares: dict[str, float] = {}
    for split in SPLITS:
        rows = [r for r in store.rollout_summaries(metadata={"phase": phase, "split": split}) if r.mode == "test"]
        if not rows:
            continue
        recorded = rollout_metrics(store, [r.rollout_id for r in rows])
        values = [recorded[r.rollout_id][EXTRA_OPS_METRIC] for r in rows
                  if EXTRA_OPS_METRIC in recorded.get(r.rollout_id, {})]
        if not recorded:
            values = [v for r in rows if (v := _from_calls(store, r.rollout_id, r.input)) is not None]
        if values:
            shares[split] = sum(values) / len(values)
    return shares


def _from_calls(store: StoreAPI, rollout_id: str, task: dict) -> float | None:
    expressions = []
    for span in store.iter_spans(rollout_ids=[rollout_id], kinds=["llm_call"]):
        message = (span.llm.response_message if span.llm else None) or {}
        for call in message.get("tool_calls") or []:
            expression = call_expression((call.get("function") or {}).get("arguments"))
            if expression is not None:
                expressions.append(expression)
    return extra_operations(expressions, task)


def _fmt(shares: dict[str, float]) -> str:
    return ", ".join(f"{k} {100 * v:.1f}%" for k, v in shares.items()) or "(none recorded)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--start", type=Path, required=True, help="the warm start's store (phase warm_start)")
    parser.add_argument("runs", type=Path, nargs="+", help="the variants' stores (phase final)")
    parser.add_argument("--splits", default=",".join(SPLITS))
    parser.add_argument("--start-phase", default="warm_start", help="the start's phase (base: a run that evaluated "
                        "its start itself, e.g. on other level-4 wordings)")
    args = parser.parse_args()
    console = Console(width=200)
    splits = tuple(args.splits.split(","))
    start = Arm("start", "sft", args.start, args.start_phase, counts_rollouts=False)
    arms = [Arm(db.stem, "grpo", db, "final") for db in args.runs]
    console.print(build_table([start, *arms], start, splits))
    with SpanStore(args.start) as store:
        before = by_task(store, args.start_phase, DEMONSTRATED)
        console.print(f"\nstart: extra-operation share {_fmt(extra_ops_share(store, args.start_phase))}")
    for db in args.runs:
        with SpanStore(db) as store:
            after = by_task(store, "final", DEMONSTRATED)
            share = extra_ops_share(store, "final")
        console.print(f"\n{db.stem}: extra-operation share at the end {_fmt(share)}")
        common = sorted(set(before) & set(after))
        levels = sorted({before[k][0] for k in common})
        for level in [None, *levels]:  # None: the demonstrated levels pooled
            keys = [k for k in common if level is None or before[k][0] == level]
            label = "levels 1-3 pooled" if level is None else f"level {level}"
            diff = paired_difference([after[k][1] for k in keys], [before[k][1] for k in keys])
            console.print(f"  {label} (test + family, n={len(keys)}): "
                          f"{100 * sum(before[k][1] for k in keys) / len(keys):.1f}% -> "
                          f"{100 * sum(after[k][1] for k in keys) / len(keys):.1f}%, paired "
                          f"{100 * diff.mean:+.1f} [{100 * diff.low:+.1f}, {100 * diff.high:+.1f}]")


if __name__ == "__main__":
    main()
