"""One table across single runs: held-out accuracy per split with 95% intervals, paired against a common start.

Used by ``tutorials/compare/run.py``, which runs each algorithm from the same start into a store of its own.
Everything here is read back from those stores (the framework's held-out rollouts carry
``metadata.phase`` and ``metadata.split``; the training rollouts are every rollout whose mode is not
``test``), not from configs or reports, so the table shows what ran. Intervals are the seeded percentile
bootstrap of :mod:`spanlab.stats`; a difference is paired by task (every run evaluates the same
held-out tasks: same task set, seed and ``eval.tasks``), which is tighter than comparing two intervals.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from spanlab.errors import ConfigError
from spanlab.stats import Interval, bootstrap, paired_difference
from spanlab.store import SpanStore, StoreAPI


@dataclass(frozen=True)
class Arm:
    """One row: the run in store ``db`` whose held-out evaluation ``phase`` (e.g. ``final``) is shown."""

    label: str
    algorithm: str
    db: Path
    phase: str
    wall_s: float | None = None
    counts_rollouts: bool = True  # False: a row that shares a store with another (the base model in the start's)
    after: Path | None = None  # the store of the arm this one continued from: its training rollouts count too
    after_wall_s: float | None = None
    fallback: str | None = None  # shown when ``phase`` never ran (an APO search that kept its start has no final)


def held_out(store: StoreAPI, phase: str, split: str) -> dict[str, float]:
    """task_id -> reward of the held-out rollouts of ``phase`` on ``split`` (a failed rollout scores 0)."""
    rewards: dict[str, float] = {}
    for row in store.rollout_summaries(metadata={"phase": phase, "split": split}):
        if row.mode == "test" and isinstance(row.input, dict):
            rewards[str(row.input["task_id"])] = float(row.final_reward or 0.0)
    return rewards


def failed_held_out(store: StoreAPI, phase: str, splits: Sequence[str]) -> int:
    """Held-out rollouts of ``phase`` that did not succeed (an engine error, a timeout): scored 0 above."""
    return sum(1 for split in splits for row in store.rollout_summaries(metadata={"phase": phase, "split": split})
               if row.mode == "test" and row.status != "succeeded")


def training_rollouts(store: StoreAPI) -> int:
    """Rollouts the run spent on training or search: every rollout not run for the held-out evaluation."""
    return sum(1 for row in store.rollout_summaries() if row.mode != "test")


@dataclass(frozen=True)
class SplitResult:
    accuracy: Interval
    diff: Interval | None  # paired vs the baseline; None for the baseline itself


@dataclass(frozen=True)
class Row:
    arm: Arm
    splits: dict[str, SplitResult]
    rollouts: int | None
    after_rollouts: int | None
    failed: int = 0  # held-out rollouts of the shown phase that failed (counted as reward 0)


def _rewards(db: Path, phase: str, splits: Sequence[str]) -> tuple[dict[str, dict[str, float]], int, int]:
    """(task_id -> reward per split, training rollouts, failed held-out rollouts) of one store."""
    if not db.is_file():
        raise ConfigError(f"{db}: no such store (did that stage run?)")
    with SpanStore(db) as store:
        by_split = {split: held_out(store, phase, split) for split in splits}
        return by_split, training_rollouts(store), failed_held_out(store, phase, splits)


def measure(arms: Sequence[Arm], baseline: Arm, splits: Sequence[str], *, seed: int = 0) -> list[Row]:
    """Each arm's accuracy per split and its paired difference to ``baseline``, on the tasks every arm ran.

    The baseline may hold more tasks than the arms (calc's held-out tasks are a prefix of a longer list, so a
    start evaluated on 60 and arms on 30 share those 30); every row is measured on the tasks all rows ran,
    and the rows' task sets must be nested within the baseline's, or it is an error, not an unpaired comparison."""
    start = _rewards(baseline.db, baseline.phase, splits)[0]
    measured, failed = [], {}
    for arm in arms:
        rewards, rollouts, failed[arm.label] = _rewards(arm.db, arm.phase, splits)
        if arm.fallback is not None and not any(rewards.values()):
            rewards, _, failed[arm.label] = _rewards(arm.db, arm.fallback, splits)
        after = _rewards(arm.after, "final", ())[1] if arm.after is not None else None
        measured.append((arm, rewards, rollouts, after))
    for split in splits:
        sets = {arm.label: set(rewards[split]) for arm, rewards, _, _ in measured}
        for arm, _, _, _ in measured:
            if not sets[arm.label]:
                raise ConfigError(f"{arm.db}: no held-out rollouts of phase {arm.phase!r} on split {split!r}")
        smallest = min(sets.values(), key=len) & set(start[split])
        for label, ids in sets.items():  # nested lists of the same tasks (prefixes), or not a paired comparison
            if not smallest <= ids or not ids <= set(start[split]):
                raise ConfigError(f"{label}: its {split} tasks differ from the other runs' ({len(ids)} tasks, "
                                  f"{len(ids - set(start[split]))} not in the baseline's); not a paired comparison")
    common = {split: sorted(set.intersection(set(start[split]), *[set(r[split]) for _, r, _, _ in measured]))
              for split in splits}
    rows = []
    for arm, rewards, rollouts, after in measured:
        results = {}
        for split in splits:
            ids = common[split]
            ours, theirs = [rewards[split][t] for t in ids], [start[split][t] for t in ids]
            diff = None if arm == baseline else paired_difference(ours, theirs, seed=seed)
            results[split] = SplitResult(bootstrap(ours, seed=seed), diff)
        rows.append(Row(arm, results, rollouts if arm.counts_rollouts else None, after, failed[arm.label]))
    return rows


def _pct(i: Interval) -> str:
    return f"{100 * i.mean:.1f}% [{100 * i.low:.1f}, {100 * i.high:.1f}]"


def _diff(i: Interval | None) -> str:
    return "-" if i is None else f"{100 * i.mean:+.1f} [{100 * i.low:+.1f}, {100 * i.high:+.1f}]"


def _minutes(s: float | None) -> str:
    return "-" if s is None or math.isnan(s) else f"{s / 60:.1f}"


def markdown(rows: Sequence[Row], splits: Sequence[str]) -> str:
    """The rows as a markdown table (accuracy in %, differences in points, 95% intervals in brackets)."""
    n = {s: rows[0].splits[s].accuracy.n for s in splits} if rows else {}
    head = ["arm", "algorithm"]
    for split in splits:
        head += [f"{split} (n={n[split]}) accuracy [95% CI]", f"{split}: vs start, points [95% CI]"]
    head += ["training rollouts", "wall (min)", "held-out failed"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        cells = [row.arm.label, row.arm.algorithm]
        for split in splits:
            cells += [_pct(row.splits[split].accuracy), _diff(row.splits[split].diff)]
        rollouts = "-" if row.rollouts is None else str(row.rollouts)
        wall = _minutes(row.arm.wall_s) if row.arm.counts_rollouts else "(in the start's)"
        if row.after_rollouts is not None and row.rollouts is not None:
            rollouts = f"{row.rollouts + row.after_rollouts} ({row.after_rollouts} + {row.rollouts})"
            wall = f"{wall} (+ {_minutes(row.arm.after_wall_s)})"
        lines.append("| " + " | ".join([*cells, rollouts, wall, str(row.failed)]) + " |")
    return "\n".join(lines)


def build_table(arms: Sequence[Arm], baseline: Arm, splits: Sequence[str], *, seed: int = 0) -> str:
    return markdown(measure(arms, baseline, splits, seed=seed), splits)


def load_winner(db: Path, apo_json: Path, resource: str = "prompt") -> str:
    """The POML template of the prompt version an APO run chose (``summary.best_version`` of its apo.json)."""
    if not apo_json.is_file():
        raise ConfigError(f"{apo_json}: no such file (did the APO run finish?)")
    version = int(json.loads(apo_json.read_text())["summary"]["best_version"])
    with SpanStore(db) as store:
        return str(store.get_resource(resource, version).payload["template"])
