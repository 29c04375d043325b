"""GRPO variants of the calc main job from one warm start: what each gained on level 4 and kept on levels 1-3.

Warm-start once (the main job with ``grpo.steps: 0``: it evaluates phase ``warm_start`` and writes
``runs/calc-ws/final``), run each variant from that folder (``engine.model``, no ``warm_start``, ``eval.base:
false``), then:

    python tutorials/calc/compare_runs.py --start runs/calc-ws.duckdb runs/calc-rl.duckdb runs/calc-ptx.duckdb

Prints ``spanlab compare``'s tables with each run as an arm of its own (the first is the reference): per split, each
run's gain over the start paired by question with a 95% interval, each run against the first, the share of
answers whose calculator expression used more operations than the problem needs (``calc.extra_ops``), and a
verdict. Then what is calc's own: the demonstrated levels' paired change level by level (test and family pooled).
Variants run with several seeds are compared with ``spanlab compare --arm NAME RUN...`` itself.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

from spanlab.compare import compare, load_evaluation, markdown, paired_by_task
from spanlab.compare.extra_ops import extra_ops_share as _extra_ops_share
from spanlab.errors import ConfigError
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
    """split -> extra-operation share of the held-out rollouts of ``phase`` (:mod:`spanlab.compare.extra_ops`)."""
    return _extra_ops_share(store, phase, SPLITS)


def levels(start: Path, start_phase: str, run: Path) -> list[str]:
    """The demonstrated levels' paired change, pooled and level by level (test and family together)."""
    with SpanStore(start) as store:
        before = by_task(store, start_phase, DEMONSTRATED)
    with SpanStore(run) as store:
        after = by_task(store, "final", DEMONSTRATED)
    common = sorted(set(before) & set(after))
    lines = []
    for level in [None, *sorted({before[k][0] for k in common})]:  # None: the demonstrated levels pooled
        keys = [k for k in common if level is None or before[k][0] == level]
        label = "levels 1-3 pooled" if level is None else f"level {level}"
        diff = paired_by_task({str(k): after[k][1] for k in keys}, {str(k): before[k][1] for k in keys})
        if diff is None:
            continue
        lines.append(f"  {label} (test + family, n={len(keys)}): "
                     f"{100 * sum(before[k][1] for k in keys) / len(keys):.1f}% -> "
                     f"{100 * sum(after[k][1] for k in keys) / len(keys):.1f}%, paired "
                     f"{100 * diff.mean:+.1f} [{100 * diff.low:+.1f}, {100 * diff.high:+.1f}]")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--start", type=Path, required=True, help="the warm start's store (phase warm_start)")
    parser.add_argument("runs", type=Path, nargs="+", help="the variants' stores (phase final)")
    parser.add_argument("--splits", default=",".join(SPLITS))
    parser.add_argument("--start-phase", default="warm_start", help="the start's phase (base: a run that evaluated "
                        "its start itself, e.g. on other level-4 wordings)")
    args = parser.parse_args()
    console = Console(soft_wrap=True)  # markdown tables: one row per line
    splits = args.splits.split(",")
    try:
        start = load_evaluation(args.start, args.start_phase, splits)
        arms = {db.name.removesuffix(".duckdb"): [load_evaluation(db, "final", splits)] for db in args.runs}
        console.print(markdown(compare(start, arms)), markup=False, highlight=False)
        for db, arm in zip(args.runs, arms.values(), strict=True):
            console.print(f"{db.stem}: demonstrated levels, paired by question", markup=False, highlight=False)
            for line in levels(start.db, args.start_phase, arm[0].db):
                console.print(line, markup=False, highlight=False)
    except ConfigError as exc:
        parser.error(str(exc))


if __name__ == "__main__":
    main()
