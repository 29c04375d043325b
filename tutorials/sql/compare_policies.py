"""Per-role policies vs one shared policy on the SQL agent: held-out accuracy and the checker's verdict accuracy.

Reads the stores of two runs that started from the same weights and evaluated the same held-out tasks. Run as
the tutorial configs are, each run evaluates its start itself (``base`` after a warm start is its own held-out
phase, ``warm_start``):

    python tutorials/sql/compare_policies.py runs/sql-policies-shared.duckdb runs/sql-policies.duckdb

To spend the start's evaluation and warm start once, warm-start one run with ``grpo.steps: 0`` (it evaluates
phase ``warm_start`` and writes ``runs/NAME/final``), start both arms from that folder (``engine.model``, no
``warm_start``, ``eval.base: false``), and name its store:

    python tutorials/sql/compare_policies.py --start runs/sql-warm.duckdb shared.duckdb per-role.duckdb

Prints the accuracy and the checker's verdict accuracy (the mean of the ``sql.verdict`` rewards, one per held-out
rollout) at the start and at the end of each arm, each with a 95% bootstrap interval; the paired differences (per
task) final - start and per-role - shared at the end; then each arm's train reward per step and role, from the
``role_summary`` view.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from rich.console import Console

from spanlab.compare import held_out
from spanlab.stats import Interval, bootstrap, paired_difference
from spanlab.store import SpanStore, StoreAPI

SPLIT = "test"
PHASES = ("base", "warm_start", "final")
Scores = dict[str, dict[str, float]]  # metric -> task_id -> score


def verdicts(store: StoreAPI, phase: str) -> dict[str, float]:
    """task_id -> the checker's verdict reward in the held-out rollout of ``phase`` (0 or 1)."""
    if phase not in PHASES:
        raise ValueError(f"phase must be one of {PHASES}, got {phase!r}")
    rows = store.query(
        "SELECT r.input->>'$.task_id' AS task_id, avg(s.reward_value) AS v FROM spans s "
        "JOIN rollouts r USING (rollout_id) WHERE s.kind = 'reward' AND s.reward_name = 'sql.verdict' "
        f"AND r.mode = 'test' AND r.metadata->>'$.phase' = '{phase}' GROUP BY 1").to_pylist()
    return {str(r["task_id"]): float(r["v"]) for r in rows}


def train_rewards(store: StoreAPI) -> list[dict[str, object]]:
    """Per training step and role: calls, mean final reward and mean intermediate reward."""
    return store.query(
        "SELECT step, role, policy, llm_calls, final_reward_mean, intermediate_reward_mean FROM role_summary "
        "WHERE mode = 'train' ORDER BY step, role").to_pylist()


def _pct(i: Interval) -> str:
    return f"{100 * i.mean:.1f}% [{100 * i.low:.1f}, {100 * i.high:.1f}]"


def _pts(i: Interval) -> str:
    return f"{100 * i.mean:+.1f} [{100 * i.low:+.1f}, {100 * i.high:+.1f}]"


def _paired(a: dict[str, float], b: dict[str, float]) -> Interval:
    """mean(a - b) over the tasks both scored."""
    tasks = sorted(a.keys() & b.keys())
    return paired_difference([a[t] for t in tasks], [b[t] for t in tasks])


def scores(store: StoreAPI, phase: str) -> Scores:
    return {"accuracy": held_out(store, phase, SPLIT), "verdict accuracy": verdicts(store, phase)}


def start_scores(store: StoreAPI) -> Scores:
    """The run's start: after its warm start when it had one, else its base evaluation."""
    warm = scores(store, "warm_start")
    return warm if warm["accuracy"] else scores(store, "base")


def report(arms: dict[str, Path], start: Path | None = None) -> str:
    """The markdown tables (module docstring); ``start``: the store that evaluated both arms' common start."""
    common = None
    if start is not None:
        with SpanStore(start) as store:
            common = start_scores(store)
    begin: dict[str, Scores] = {}
    end: dict[str, Scores] = {}
    steps: dict[str, list[dict[str, object]]] = {}
    for label, db in arms.items():
        with SpanStore(db) as store:
            begin[label] = common if common is not None else start_scores(store)
            end[label] = scores(store, "final")
            steps[label] = train_rewards(store)
    lines = ["| arm | metric | start | final | final - start, points |", "|---|---|---|---|---|"]
    for label in arms:
        for metric in ("accuracy", "verdict accuracy"):
            first, last = bootstrap(list(begin[label][metric].values())), bootstrap(list(end[label][metric].values()))
            diff = _paired(end[label][metric], begin[label][metric])
            lines.append(f"| {label} | {metric} | {_pct(first)} (n={first.n}) | {_pct(last)} (n={last.n}) "
                         f"| {_pts(diff)} |")
    (a, b) = list(arms)
    lines += ["", f"| metric | {b} - {a} at the end, points (paired by task) | n |", "|---|---|---|"]
    for metric in ("accuracy", "verdict accuracy"):
        diff = _paired(end[b][metric], end[a][metric])
        lines.append(f"| {metric} | {_pts(diff)} | {diff.n} |")
    lines += ["", "| arm | step | role | policy | calls | final reward | intermediate reward |",
              "|---|---|---|---|---|---|---|"]
    for label, rows in steps.items():
        for r in rows:
            inter = r["intermediate_reward_mean"]
            lines.append(f"| {label} | {r['step']} | {r['role']} | {r['policy']} | {r['llm_calls']} "
                         f"| {float(r['final_reward_mean'] or 0):.3f} "  # type: ignore[arg-type]
                         f"| {'-' if inter is None else f'{float(inter):.3f}'} |")  # type: ignore[arg-type]
    return "\n".join(lines)


def main() -> None:
    logging.basicConfig(level=logging.WARNING)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("shared", type=Path, help="the store of the one-shared-policy run")
    parser.add_argument("per_role", type=Path, help="the store of the per-role-policies run")
    parser.add_argument("--start", type=Path, help="the store that evaluated both arms' common start")
    args = parser.parse_args()
    for db in (args.shared, args.per_role, args.start):
        if db is not None and not db.is_file():
            parser.error(f"{db}: no such store")
    Console().print(report({"shared": args.shared, "per-role": args.per_role}, args.start), markup=False)


if __name__ == "__main__":
    main()
