"""What a training run reports: held-out accuracy per phase (with n), the agent's own metrics per phase, per-step
metrics, timings, and the paired gain of the final policy over its start.

Every phase evaluates the same tasks of a split in the same order (``split_tasks`` fixes them once), so
the final policy and its start can be compared task by task: a paired interval is much tighter than two
separate accuracies with their own noise, and it is what says whether training helped at all.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field
from rich.table import Table

from spanlab.adapters.trainable import Dropped

_SAMPLE_RULE_KEYS = tuple(Dropped().metrics())  # dropped_error_spans, ...: what each step's read left out


class MetricMean(BaseModel):
    """One agent metric (``ctx.add_metric``) over an evaluation: its mean over the ``n`` rollouts that recorded it."""

    mean: float
    n: int


def metric_means(per_rollout: Iterable[dict[str, float]]) -> dict[str, MetricMean]:
    """Each metric name's mean over the rollouts that recorded it (a rollout without it is not a zero)."""
    values: dict[str, list[float]] = {}
    for metrics in per_rollout:
        for name, value in metrics.items():
            values.setdefault(name, []).append(value)
    return {name: MetricMean(mean=sum(v) / len(v), n=len(v)) for name, v in sorted(values.items())}


class Evaluation(BaseModel):
    phase: str  # base | warm_start | final
    split: str = "test"  # the held-out split: eval.split (by question) or one of eval.extra_splits
    n: int
    accuracy: float
    by_level: dict[str, float] = Field(default_factory=dict)
    seconds: float = 0.0
    failed: int = 0
    rewards: list[float] = Field(default_factory=list, description="one per task, in the split's task order")
    metrics: dict[str, MetricMean] = Field(default_factory=dict, description="the agent's metrics, by name")


class PairedGain(BaseModel):
    """Final minus start accuracy on one split, over the same tasks: mean and a seeded bootstrap interval."""

    split: str
    start: str  # the phase compared against: warm_start when the run had one, else base
    n: int
    start_accuracy: float
    final_accuracy: float
    diff: float
    low: float
    high: float
    level: float = 0.95

    @property
    def excludes_zero(self) -> bool:
        return self.low > 0 or self.high < 0


class TrainReport(BaseModel):
    run_id: str = Field(default_factory=lambda: f"run-{uuid.uuid4().hex[:12]}")
    run_name: str
    algorithm: str
    model: str
    db: str
    seed: int | None = None  # rollouts.seed: seeded runs of one config pair by it in spanlab compare (None: unseeded)
    evaluations: list[Evaluation] = Field(default_factory=list)
    warm_start: dict[str, float] | None = None
    steps: list[dict[str, float]] = Field(default_factory=list)
    seconds: float = 0.0

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(self.model_dump(), indent=2) + "\n")

    def paired_gains(self, *, level: float = 0.95, seed: int = 0) -> list[PairedGain]:
        """Per split, the final policy against its start (the warm start, else the base model) task by task.

        Splits whose start or final evaluation lacks per-task rewards (a report from before they were kept)
        or evaluated a different number of tasks are left out: an unpaired difference would not be this one.
        """
        from spanlab.stats import paired_difference  # numpy only: the seeded paired bootstrap

        by_split: dict[str, dict[str, Evaluation]] = {}
        for ev in self.evaluations:
            by_split.setdefault(ev.split, {})[ev.phase] = ev
        gains = []
        for split, phases in by_split.items():
            start = "warm_start" if "warm_start" in phases else "base"
            before, after = phases.get(start), phases.get("final")
            if before is None or after is None or not before.rewards or len(before.rewards) != len(after.rewards):
                continue
            d = paired_difference(after.rewards, before.rewards, level=level, seed=seed)
            gains.append(PairedGain(split=split, start=start, n=d.n, start_accuracy=before.accuracy,
                                    final_accuracy=after.accuracy, diff=d.mean, low=d.low, high=d.high, level=level))
        return gains

    def gains_table(self) -> Table:
        """The paired final-vs-start rows, one per split."""
        table = Table(title="final vs start on the same held-out tasks (paired bootstrap)")
        for col in ("split", "start", "n", "start acc", "final acc", "diff", "95% interval", "excludes 0"):
            table.add_column(col)
        for g in self.paired_gains():
            table.add_row(g.split, g.start, str(g.n), f"{100 * g.start_accuracy:.1f}%",
                          f"{100 * g.final_accuracy:.1f}%", f"{100 * g.diff:+.1f}",
                          f"[{100 * g.low:+.1f}, {100 * g.high:+.1f}]",
                          "yes" if g.excludes_zero else "no")
        return table

    def curve(self) -> list[dict[str, float | int | None]]:
        """The learning curve: for the policy after k steps (k = 0 .. steps), how many of them updated it (a step
        with no reward variance changes nothing: ``updates`` <= ``steps``), the train reward of the rollouts it
        sampled (step k + 1's) and its held-out accuracy on each split evaluated then (the warm start's, or the
        base model's without one, at k = 0; ``eval.curve``'s every few steps; the final one at k = steps)."""
        from spanlab.jobs.outcome import updated_steps

        n = len(self.steps)
        start = "warm_start" if any(ev.phase == "warm_start" for ev in self.evaluations) else "base"
        at: dict[int, dict[str, float]] = {}
        for ev in self.evaluations:
            k = 0 if ev.phase == start else n if ev.phase == "final" else (
                int(ev.phase.removeprefix("step-")) if ev.phase.startswith("step-") else None)
            if k is not None:
                at.setdefault(k, {})[ev.split] = ev.accuracy
        curve_splits = {split for k, accs in at.items() if 0 < k < n for split in accs}
        rows: list[dict[str, float | int | None]] = []
        for k in range(n + 1):
            step = self.steps[k] if k < n else {}
            updates = updated_steps(self.steps[:k])  # None: the steps do not say (SFT, APO): each counts
            rows.append({"steps": k, "updates": k if updates is None else updates,
                         "train_reward": step.get("reward_mean"),
                         "groups_with_signal": step.get("n_groups_with_signal"), "groups": step.get("n_groups"),
                         **{split: at.get(k, {}).get(split) for split in sorted(curve_splits)}})
        return rows

    def curve_table(self) -> Table:
        """:meth:`curve` as a table (the splits evaluated during training, ``eval.curve``, as columns)."""
        rows = self.curve()
        fixed = ("steps", "updates", "train_reward", "groups_with_signal", "groups")
        splits = [k for k in rows[0] if k not in fixed]
        table = Table(title="learning curve: the policy after k steps (updates: the steps that changed it)")
        for col in ("steps", "updates", "train reward", "groups with signal", *(f"held-out {s}" for s in splits)):
            table.add_column(col)
        for r in rows:
            signal = "" if r["groups"] is None else f"{r['groups_with_signal']:.0f}/{r['groups']:.0f}"
            table.add_row(str(r["steps"]), str(r["updates"]),
                          "" if r["train_reward"] is None else f"{r['train_reward']:.2f}", signal,
                          *("" if r[s] is None else f"{100 * r[s]:.1f}%" for s in splits))  # type: ignore[operator]
        return table

    def table(self) -> Table:
        """Held-out accuracy before and after, the figure a user runs the job for."""
        table = Table(title=f"{self.run_name}: held-out accuracy ({self.model})")
        for col in ("phase", "split", "n", "accuracy", "by level", "eval s"):
            table.add_column(col)
        for ev in self.evaluations:
            levels = "  ".join(f"L{k} {100 * v:.0f}%" for k, v in ev.by_level.items())
            table.add_row(ev.phase, ev.split, str(ev.n), f"{100 * ev.accuracy:.1f}%", levels, f"{ev.seconds:.0f}")
        return table

    def metrics_table(self) -> Table | None:
        """The agent's metrics (``ctx.add_metric``) per split, one column per evaluated phase but the curve's
        (``step-k``): the start and the end side by side. None when no evaluation recorded any."""
        phases = list(dict.fromkeys(ev.phase for ev in self.evaluations if not ev.phase.startswith("step-")))
        cells: dict[tuple[str, str], dict[str, MetricMean]] = {}
        for ev in self.evaluations:
            for name, m in ev.metrics.items():
                cells.setdefault((ev.split, name), {})[ev.phase] = m
        if not cells:
            return None
        table = Table(title="agent metrics on the held-out splits: mean (n rollouts that recorded it)")
        for col in ("split", "metric", *phases):
            table.add_column(col)
        for (split, name), by_phase in cells.items():
            table.add_row(split, name, *(f"{by_phase[p].mean:.3f} ({by_phase[p].n})" if p in by_phase else ""
                                         for p in phases))
        return table

    def phase_seconds(self) -> dict[str, float]:
        """Where the run's wall time went: the warm start, each evaluation phase (all its splits), the steps'
        rollouts, updates and weight pushes, and the rest (engine start, checkpoints, what no part times). A part
        the run did not have is left out; the parts sum to the run's seconds."""
        parts: dict[str, float] = {}
        if self.warm_start is not None and "seconds" in self.warm_start:
            parts["warm start"] = self.warm_start["seconds"]
        for ev in self.evaluations:
            key = f"evaluation {ev.phase}"
            parts[key] = parts.get(key, 0.0) + ev.seconds
        for key, name in (("rollout_s", "rollouts"), ("step_s", "updates"), ("sync_s", "weight pushes")):
            if any(key in step for step in self.steps):
                parts[name] = sum(step.get(key, 0.0) for step in self.steps)
        parts["other"] = max(0.0, self.seconds - sum(parts.values()))
        return parts

    def times_table(self) -> Table:
        """:meth:`phase_seconds` as a table, with each part's share of the run."""
        table = Table(title=f"wall time: {self.seconds / 60:.1f} min")
        for col in ("part", "min", "share"):
            table.add_column(col)
        for name, seconds in self.phase_seconds().items():
            share = f"{100 * seconds / self.seconds:.0f}%" if self.seconds > 0 else ""
            table.add_row(name, f"{seconds / 60:.1f}", share)
        return table

    def dropped(self) -> dict[str, int]:
        """What the sample rule left out over the run (:mod:`spanlab.adapters.trainable`): each step's
        ``dropped_*`` counts summed, the non-zero ones (``kept_failed_attempts`` too: trained on a set reward)."""
        totals = {k: int(sum(step.get(k, 0.0) for step in self.steps)) for k in _SAMPLE_RULE_KEYS}
        return {k: v for k, v in totals.items() if v}

    def summary(self) -> dict[str, Any]:
        headline = self.evaluations[0].split if self.evaluations else "test"
        acc = {ev.phase: ev.accuracy for ev in self.evaluations if ev.split == headline}
        by_split: dict[str, dict[str, float]] = {}
        metrics: dict[str, dict[str, dict[str, float]]] = {}
        for ev in self.evaluations:
            by_split.setdefault(ev.split, {})[ev.phase] = ev.accuracy
            for name, m in ev.metrics.items():
                metrics.setdefault(name, {}).setdefault(ev.split, {})[ev.phase] = m.mean
        return {"run_id": self.run_id, "accuracy": acc, "accuracy_by_split": by_split, "metrics_by_split": metrics,
                "steps": len(self.steps), "seconds": round(self.seconds),
                "phase_seconds": {k: round(v) for k, v in self.phase_seconds().items()},
                "paired_gains": [g.model_dump() for g in self.paired_gains()], "not_trained": self.dropped()}
