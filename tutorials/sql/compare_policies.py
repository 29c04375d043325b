"""Per-role policies vs one shared policy on the SQL agent: held-out accuracy and the checker's verdict accuracy.

Reads the stores of two runs that started from the same weights (``policies_shared.yaml`` and
``policies.yaml`` with ``engine.model`` set to one warm-started folder) and evaluated the same held-out tasks:

    python tutorials/sql/compare_policies.py runs/sql-policies-shared.duckdb runs/sql-policies.duckdb

Prints one markdown table: per arm and phase (``base`` = the common start, ``final``), the accuracy and the
checker's verdict accuracy (the mean of the ``sql.verdict`` rewards, one per held-out rollout), each with a 95%
bootstrap interval; then the paired differences (per task) final - start within each arm and per-role - shared
at the end. Then each arm's train reward per step and role, from the ``role_summary`` view.
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
PHASES = ("base", "final")


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


def report(arms: dict[str, Path]) -> str:
    scores: dict[str, dict[str, dict[str, dict[str, float]]]] = {}  # arm -> metric -> phase -> task -> score
    steps: dict[str, list[dict[str, object]]] = {}
    for label, db in arms.items():
        with SpanStore(db) as store:
            scores[label] = {"accuracy": {p: held_out(store, p, SPLIT) for p in PHASES},
                             "verdict accuracy": {p: verdicts(store, p) for p in PHASES}}
            steps[label] = train_rewards(store)
    lines = ["| arm | metric | start | final | final - start, points |", "|---|---|---|---|---|"]
    for label, metrics in scores.items():
        for metric, by_phase in metrics.items():
            start, final = (bootstrap(list(by_phase[p].values())) for p in PHASES)
            diff = _paired(by_phase["final"], by_phase["base"])
            lines.append(f"| {label} | {metric} | {_pct(start)} (n={start.n}) | {_pct(final)} (n={final.n}) "
                         f"| {_pts(diff)} |")
    (a, b) = list(arms)
    lines += ["", f"| metric | {b} - {a} at the end, points (paired by task) | n |", "|---|---|---|"]
    for metric in ("accuracy", "verdict accuracy"):
        diff = _paired(scores[b][metric]["final"], scores[a][metric]["final"])
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
    args = parser.parse_args()
    for db in (args.shared, args.per_role):
        if not db.is_file():
            parser.error(f"{db}: no such store")
    Console().print(report({"shared": args.shared, "per-role": args.per_role}), markup=False)


if __name__ == "__main__":
    main()
