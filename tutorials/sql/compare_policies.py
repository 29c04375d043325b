"""Per-role policies vs one shared policy vs the warm start alone on the SQL agent (issue 55's comparison).

Three rows:

- **warm start only**: the warm start with no RL, from base to after the warm start, so the row shows what the
  demonstrations give by themselves (``--start``: the store of a run that evaluated both phases, e.g. the per-role
  run itself);
- **shared**: one adapter for every role, the final reward broadcast (``policies_shared.yaml``);
- **per role**: an adapter per role, per-turn credit with ``scope: role`` (``policies.yaml``).

An arm's start is its own warm start when its run had one (``warm_start.role_demos: mined`` warm-starts each arm's
own adapters), else the ``--start`` store's warm start (arms started from that run's folder, ``engine.model``,
with ``eval.base: false``), else its base evaluation:

    python tutorials/sql/compare_policies.py --start runs/sql-policies-mined.duckdb \
        runs/sql-policies-shared-mined.duckdb runs/sql-policies-mined.duckdb

Everything is read back from the stores' held-out rollouts (``mode = 'test'``, ``metadata.phase`` and
``metadata.split = 'test'``): the final reward (accuracy) and the role metrics each rollout recorded
(:mod:`spanlab.agents.sql.roles`). Per row and metric: the start and the end, each a mean with a 95% bootstrap
interval, and end - start paired by task (``spanlab compare``'s pairing, :mod:`spanlab.compare`). Accuracy, the
writer's draft accuracy and the checker's verdict rate and accuracy are recorded on every held-out rollout, so they
pair by task; the rewriter's fix rate and the outcome rates (right drafts kept, wrong drafts fixed) are over the
rollouts they are about, which differ between phases, so they are shown with their counts and not paired. Then
per-role - shared at the end, paired by task, and per-role's gain - shared's gain (each arm's end - start per task:
the fair comparison where the arms start apart, each from its own warm start); per arm and held-out phase
(``eval.curve``'s ``step-K`` points, then ``final``) the tasks gained and lost since its start, which shows the
step at which GRPO begins to move greedy outcomes; and each arm's train reward per step and role (the
``role_summary`` view).
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import NamedTuple

from rich.console import Console

from spanlab.agents.sql.roles import (
    CHECKER_ACCURACY,
    CHECKER_VERDICT,
    DRAFT_RIGHT,
    REWRITER_FIX,
    RIGHT_DRAFT_KEPT,
    WRONG_DRAFT_FIXED,
)
from spanlab.compare import paired_by_task
from spanlab.jobs.rollouts import rollout_metrics
from spanlab.stats import Interval, bootstrap
from spanlab.store import SpanStore, StoreAPI

SPLIT = "test"
ACCURACY = "accuracy"
# (label, metric, paired): paired metrics are recorded on every held-out rollout of an agent with a checker
METRICS: tuple[tuple[str, str, bool], ...] = (
    ("accuracy", ACCURACY, True),
    ("writer's draft right", DRAFT_RIGHT, True),
    ("checker gives a verdict", CHECKER_VERDICT, True),
    ("checker's verdict right", CHECKER_ACCURACY, True),
    ("rewrites that match gold", REWRITER_FIX, False),
    ("right drafts kept", RIGHT_DRAFT_KEPT, False),
    ("wrong drafts fixed", WRONG_DRAFT_FIXED, False),
)
Scores = dict[str, dict[str, float]]  # metric -> task_id -> value


class Row(NamedTuple):
    """One row of the table: the held-out scores at its start (None: not evaluated) and at its end."""

    label: str
    start: Scores | None
    end: Scores


def scores(store: StoreAPI, phase: str) -> Scores:
    """metric -> task_id -> value over the held-out rollouts of ``phase``: the final reward as ``accuracy`` (a
    failed rollout scores 0) and each metric its last attempt recorded. Empty when the phase never ran."""
    held = [r for r in store.rollout_summaries(metadata={"phase": phase, "split": SPLIT})
            if r.mode == "test" and isinstance(r.input, dict)]
    if not held:
        return {}
    task_of = {r.rollout_id: str(r.input["task_id"]) for r in held}  # type: ignore[index]
    out: Scores = {ACCURACY: {task_of[r.rollout_id]: float(r.final_reward or 0.0) for r in held}}
    for rid, metrics in rollout_metrics(store, list(task_of)).items():
        for name, value in metrics.items():
            out.setdefault(name, {})[task_of[rid]] = value
    return out


def start_scores(store: StoreAPI, common: Scores | None = None) -> Scores | None:
    """A run's start: after its own warm start when it had one, else the common start (a run started from another's
    folder), else its base evaluation (None: it evaluated none)."""
    return scores(store, "warm_start") or common or scores(store, "base") or None


def curve_phases(store: StoreAPI) -> list[str]:
    """The run's held-out phases in training order: its start, each ``step-K`` of ``eval.curve``, ``final``."""
    found = {str(r.metadata.get("phase")) for r in store.rollout_summaries(metadata={"split": SPLIT})
             if r.mode == "test"}
    steps = sorted((p for p in found if p.startswith("step-")), key=lambda p: int(p.removeprefix("step-")))
    return [p for p in ("base", "warm_start") if p in found] + steps + (["final"] if "final" in found else [])


def decisions_moved(store: StoreAPI, start: dict[str, float]) -> list[tuple[str, float, int, int]]:
    """Per held-out phase after the start (each ``step-K``, then ``final``): (phase, accuracy, tasks gained, tasks
    lost) against ``start`` (the row's start accuracy, task by task), so the step at which greedy held-out outcomes
    begin to change can be read off (the GRPO budget that moves them)."""
    out = []
    for phase in curve_phases(store):
        if phase in ("base", "warm_start"):
            continue
        acc = scores(store, phase)[ACCURACY]
        common = start.keys() & acc.keys()
        out.append((phase, sum(acc.values()) / len(acc), sum(acc[t] > start[t] for t in common),
                    sum(acc[t] < start[t] for t in common)))
    return out


def _open(db: Path) -> SpanStore:
    if not db.is_file():
        raise FileNotFoundError(f"{db}: no such store (did that run finish?)")
    return SpanStore(db)


def rows(arms: dict[str, Path], start: Path | None = None) -> list[Row]:
    """The warm-start row (with ``start``) and one row per arm, read from the stores."""
    out: list[Row] = []
    common = None
    if start is not None:
        with _open(start) as store:
            common, base = scores(store, "warm_start"), scores(store, "base")
            if not common:
                raise ValueError(f"{start}: no held-out evaluation of phase warm_start (the common start)")
            out.append(Row("warm start only", base or None, common))
    for label, db in arms.items():
        with _open(db) as store:
            end = scores(store, "final")
            if not end:
                raise ValueError(f"{db}: no held-out evaluation of phase final (did the run finish?)")
            out.append(Row(label, start_scores(store, common), end))
    return out


def _cell(values: dict[str, float] | None, paired: bool) -> str:
    if not values:
        return "-"
    i = bootstrap(list(values.values()))
    if paired:
        return f"{100 * i.mean:.1f}% [{100 * i.low:.1f}, {100 * i.high:.1f}] (n={i.n})"
    return f"{100 * i.mean:.1f}% ({sum(values.values()):g}/{i.n})"


def _pts(i: Interval) -> str:
    return f"{100 * i.mean:+.1f} [{100 * i.low:+.1f}, {100 * i.high:+.1f}] (n={i.n})"


def paired(after: dict[str, float], before: dict[str, float]) -> Interval | None:
    """mean(after - before) over the tasks both scored, with its 95% interval (None: no common task): the pairing
    ``spanlab compare`` makes (:func:`spanlab.compare.paired_by_task`)."""
    return paired_by_task(after, before)


def gains(row: Row, metric: str) -> dict[str, float] | None:
    """Per task, end - start: where two arms start apart (each its own warm start), their gains compare fairly
    where their ends alone would not."""
    before, after = (row.start or {}).get(metric), row.end.get(metric)
    if not before or not after:
        return None
    return {t: after[t] - before[t] for t in after.keys() & before.keys()}


def _diff(after: dict[str, float] | None, before: dict[str, float] | None) -> str:
    i = paired(after, before) if after and before else None
    return "-" if i is None else _pts(i)


def train_rewards(store: StoreAPI) -> list[dict[str, object]]:
    """Per training step and role: calls, mean final reward and mean intermediate reward."""
    return store.query(
        "SELECT step, role, policy, llm_calls, final_reward_mean, intermediate_reward_mean FROM role_summary "
        "WHERE mode = 'train' ORDER BY step, role").to_pylist()


def report(arms: dict[str, Path], start: Path | None = None) -> str:
    """The markdown tables (module docstring). ``arms``: label -> store, the shared arm first, per role second."""
    table = rows(arms, start)
    lines = ["| row | metric | start | end | end - start, points (paired by task) |", "|---|---|---|---|---|"]
    for row in table:
        for label, metric, is_paired in METRICS:
            before = row.start.get(metric) if row.start else None
            after = row.end.get(metric)
            if before is None and after is None:
                continue
            diff = _diff(after, before) if is_paired else "not paired (other rollouts)"
            lines.append(f"| {row.label} | {label} | {_cell(before, is_paired)} | {_cell(after, is_paired)} "
                         f"| {diff} |")
    a, b = table[-2], table[-1]
    lines += ["", f"| metric | {b.label} - {a.label} at the end, points (paired by task) "
              f"| {b.label}'s gain - {a.label}'s gain since each one's start (paired by task) |", "|---|---|---|"]
    for label, metric, is_paired in METRICS:
        if is_paired and metric in a.end and metric in b.end:
            lines.append(f"| {label} | {_diff(b.end[metric], a.end[metric])} "
                         f"| {_diff(gains(b, metric), gains(a, metric))} |")
    lines += ["", "| arm | phase | accuracy | tasks gained since the start | tasks lost |", "|---|---|---|---|---|"]
    for row, db in zip(table[-len(arms):], arms.values(), strict=True):
        if row.start and ACCURACY in row.start:
            with _open(db) as store:
                for phase, acc, gained, lost in decisions_moved(store, row.start[ACCURACY]):
                    lines.append(f"| {row.label} | {phase} | {100 * acc:.1f}% | {gained} | {lost} |")
    lines += ["", "| arm | step | role | policy | calls | final reward | intermediate reward |",
              "|---|---|---|---|---|---|---|"]
    for label, db in arms.items():
        with _open(db) as store:
            for r in train_rewards(store):
                inter = r["intermediate_reward_mean"]
                step = "warm start (mining)" if r["step"] is None else r["step"]  # train rollouts outside any step
                lines.append(f"| {label} | {step} | {r['role']} | {r['policy']} | {r['llm_calls']} "
                             f"| {float(r['final_reward_mean'] or 0):.3f} "  # type: ignore[arg-type]
                             f"| {'-' if inter is None else f'{float(inter):.3f}'} |")  # type: ignore[arg-type]
    return "\n".join(lines)


def main() -> None:
    logging.basicConfig(level=logging.WARNING)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("shared", type=Path, help="the store of the one-shared-policy run")
    parser.add_argument("per_role", type=Path, help="the store of the per-role-policies run")
    parser.add_argument("--start", type=Path, help="the store that evaluated both arms' common (warm) start")
    args = parser.parse_args()
    try:
        text = report({"shared": args.shared, "per role": args.per_role}, args.start)
    except (FileNotFoundError, ValueError) as exc:
        parser.error(str(exc))
    Console(soft_wrap=True).print(text, markup=False, highlight=False)  # a markdown table: one row per line


if __name__ == "__main__":
    main()
