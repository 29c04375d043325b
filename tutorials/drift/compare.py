"""Compare the drift experiment's runs: one figure of both arms, every run drawn, and their paired gains.

Reads each run folder's ``report.json`` (written by ``spanlab train``: the flat metrics of every GRPO step and
the held-out evaluations, the learning curve's ``step-k`` ones included) and its store, and writes one PNG of
six panels sharing the step axis, a color per arm and a line style per run: train reward, the held-out curve
of ``--curve-split`` (test_l4: the skill RL trains), the per-step drift in nats (mean |logp_trainer -
logp_engine| over aligned trained tokens), the share of trained tokens and of samples whose IDs differ from the
sampled ones, the clipped-ratio fraction and the gradient norm. Prints a markdown table, one row per arm and
run: each split's final accuracy paired by task with the start and the run's mean drift statistics; then, per
split, each arm's mean gain with an interval over its runs and questions and the verdict of each arm against the
first. The gains are ``spanlab compare``'s (:mod:`spanlab.compare`), the code ``tutorials/calc/compare_runs.py``
uses too.

The start is each run's own start evaluation (``warm_start``, else ``base``, in its store), or, with
``--start``, one evaluation every run is paired with: a run folder or a store, and its phase
(``--start-phase``), e.g. the warm-start run the arms all started from. vLLM's sampling is not seeded, so the
runs of one arm are independent runs of one config, not seeds of a generator.

Run from the repo root after ``tutorials/drift/run.py`` (which prints this command for its runs):

    .venv/bin/python tutorials/drift/compare.py --start runs/drift/start \\
        --arm exact runs/drift/exact-1 runs/drift/exact-2 \\
        --arm retokenized runs/drift/retokenized-1 runs/drift/retokenized-2 --out runs/drift/drift.png

``replay.py`` measures the same drift statistics offline on any store, without training. Left out: bands
pooled across runs (each run is drawn on its own).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root: tutorials/stages.py

from spanlab.compare import Arm, held_out, load_evaluation
from spanlab.compare.gains import Run as Paired
from spanlab.compare.gains import SplitComparison, check_arms, compare_split
from spanlab.compare.render import points, summary_lines
from spanlab.errors import ConfigError
from spanlab.jobs.report import TrainReport
from spanlab.store import SpanStore
from tutorials.stages import run_store

logger = logging.getLogger("drift.compare")

STYLES = ("-", "--", ":", "-.")
PANELS = (  # (metric of each step, or "curve" / "reward", y label)
    ("reward", "train reward (mean per step, +- s.e.)"),
    ("curve", "held-out accuracy of the policy\nafter k steps ({split})"),
    ("drift_logp_abs_diff", "drift: mean |logp_trainer - logp_engine|\n(nats, aligned trained tokens)"),
    ("drift_token_frac", "share of tokens that differ\n(thin: share of samples)"),
    ("clip_frac", "clipped-ratio fraction"),
    ("grad_norm", "gradient norm"),
)
MEANS = (("drift_sample_frac", "drift samples", 3), ("drift_token_frac", "drift tokens", 4),
         ("drift_logp_abs_diff", "mean \\|Δlogp\\| (nats)", 4), ("clip_frac", "clip frac", 4),
         ("grad_norm", "grad norm", 3))


@dataclass(frozen=True)
class Run:
    """One training run of an arm: its report, its store and the evaluation its gains are paired with."""

    arm: str
    label: str
    report: TrainReport
    db: Path
    start: Arm

    def series(self, name: str) -> list[float]:
        return [float(step.get(name, math.nan)) for step in self.report.steps]


def start_phase(report: TrainReport) -> str | None:
    """The run's own start evaluation: after its warm start, else its base model (None: it evaluated neither)."""
    phases = {ev.phase for ev in report.evaluations}
    return next((p for p in ("warm_start", "base") if p in phases), None)


def load_run(arm: str, run_dir: Path, start: Arm | None) -> Run:
    db = run_store(run_dir)  # also checks that the run finished (its report.json)
    report = TrainReport.model_validate(json.loads((run_dir / "report.json").read_text()))
    if start is None:
        phase = start_phase(report)
        if phase is None:
            raise ConfigError(f"{run_dir}: the run evaluated no start of its own (eval.base: false, no warm start); "
                              "give the evaluation to pair with: --start RUN_OR_STORE --start-phase PHASE")
        start = Arm("start", "-", db, phase, counts_rollouts=False)
    return Run(arm, report.run_name or run_dir.name, report, db, start)


def start_arm(path: Path, phase: str) -> Arm:
    """``--start``: a run folder (its store) or a store file, and the phase of its held-out evaluation."""
    return Arm("start", "-", path if path.suffix == ".duckdb" else run_store(path), phase, counts_rollouts=False)


def start_accuracy(start: Arm, split: str) -> float:
    """The start's held-out accuracy on ``split``: the curve's point at k = 0 for a run without its own."""
    with SpanStore(start.db) as store:
        rewards = held_out(store, start.phase, split)
    return sum(rewards.values()) / len(rewards) if rewards else math.nan


def curve(run: Run, split: str) -> tuple[list[int], list[float]]:
    """(k, held-out accuracy on ``split`` of the policy after k steps): the start, each ``eval.curve`` point, the
    end."""
    points = [(int(row["steps"]), row.get(split)) for row in run.report.curve()]
    for ev in run.report.evaluations:  # a split evaluated only at the start and the end is no column of curve()
        k = 0 if ev.phase == start_phase(run.report) else len(run.report.steps) if ev.phase == "final" else None
        if ev.split == split and k is not None:
            points = [(i, ev.accuracy if i == k and y is None else y) for i, y in points]
    if points and points[0][1] is None:
        points[0] = (0, start_accuracy(run.start, split))
    kept = [(k, float(y)) for k, y in points if y is not None]
    return [k for k, _ in kept], [y for _, y in kept]


def plot(runs: list[Run], out: Path, split: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = list(dict.fromkeys(r.arm for r in runs))
    fig, axes = plt.subplots(3, 2, figsize=(11, 9.5), dpi=100, sharex=True)
    for run in runs:
        color = f"C{arms.index(run.arm)}"
        style = STYLES[[r for r in runs if r.arm == run.arm].index(run) % len(STYLES)]
        label = f"{run.arm}: {run.label}"
        steps = list(range(1, len(run.report.steps) + 1))
        for ax, (name, _) in zip(axes.flat, PANELS, strict=True):
            if name == "reward":
                err = [s / max(n, 1.0) ** 0.5 for s, n in zip(run.series("reward_std"), run.series("n_samples"),
                                                               strict=True)]
                ax.errorbar(steps, run.series("reward_mean"), yerr=err, capsize=2, color=color, linestyle=style,
                            marker="o", markersize=3, label=label)
            elif name == "curve":
                ax.plot(*curve(run, split), color=color, linestyle=style, marker="s", markersize=4)
            else:
                ax.plot(steps, run.series(name), color=color, linestyle=style, marker="o", markersize=3)
                if name == "drift_token_frac":
                    ax.plot(steps, run.series("drift_sample_frac"), color=color, linestyle=style, linewidth=0.8,
                            alpha=0.6)
    for ax, (name, title) in zip(axes.flat, PANELS, strict=True):
        ax.set_ylabel(title.format(split=split), fontsize=8)
        ax.grid(alpha=0.3)
        if name == "drift_logp_abs_diff":  # exact IDs sit near 1e-4 nats, a mismatched template near 0.4
            ax.set_yscale("symlog", linthresh=1e-4)
            ax.set_yticks([0, 1e-4, 1e-3, 1e-2, 1e-1, 1])
        if name in ("drift_logp_abs_diff", "clip_frac", "grad_norm"):
            ax.set_ylim(bottom=0)
        if name in ("reward", "curve", "drift_token_frac"):
            ax.set_ylim(bottom=-0.02)
        if name in ("reward", "curve", "drift_token_frac"):
            ax.set_ylim(top=1.02)
    axes.flat[0].legend(fontsize=7, loc="best")
    for ax in axes[-1]:
        ax.set_xlabel("GRPO step (held-out: after k steps)")
        ax.xaxis.get_major_locator().set_params(integer=True)
    fig.suptitle("exact token IDs vs re-tokenized text: each run drawn (runs of one arm: same config, unseeded "
                 "sampling)", fontsize=10)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out


def _mean(values: list[float]) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return sum(finite) / len(finite) if finite else math.nan


def gains(runs: list[Run], splits: tuple[str, ...]) -> list[SplitComparison]:
    """Per split, each run's final evaluation paired by question with its start, the runs grouped by arm (the
    first arm is the reference of the others)."""
    starts, arms = {}, {}
    for run in runs:
        key = (run.start.db, run.start.phase)
        if key not in starts:
            starts[key] = load_evaluation(run.start.db, run.start.phase, splits, label="start")
        final = load_evaluation(run.db, "final", splits, label=run.label)
        arms.setdefault(run.arm, []).append(Paired(final, starts[key]))
    check_arms(arms)
    reference = next(iter(arms)) if len(arms) > 1 else None
    return [compare_split(arms, split, reference) for split in splits]


def table(runs: list[Run], splits: tuple[str, ...], compared: list[SplitComparison] | None = None) -> str:
    """One markdown row per arm and run: each split's start -> final accuracy and the paired gain with its 95%
    bootstrap interval (points), then the run's mean drift statistics over its steps."""
    compared = compared if compared is not None else gains(runs, splits)
    head = ["arm", "run", *(f"{s}: start -> final, paired gain [95% CI]" for s in splits),
            *(label for _, label, _ in MEANS), "steps", "wall (min)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for i, run in enumerate(runs):
        index = [r.arm for r in runs[:i]].count(run.arm)  # the run's place in its arm
        cells = [run.arm, run.label]
        for split in compared:
            got = next(a for a in split.arms if a.arm == run.arm).runs[index]
            cells.append(f"{100 * got.start_accuracy:.1f}% -> {100 * got.final_accuracy:.1f}%, {points(got.gain)} "
                         f"(n={got.gain.questions})")
        cells += [f"{_mean(run.series(name)):.{digits}f}" for name, _, digits in MEANS]
        cells += [str(len(run.report.steps)), f"{run.report.seconds / 60:.1f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def per_step(runs: list[Run]) -> str:
    """Each run's steps, one line per step: what the figure draws, as numbers."""
    lines = []
    names = ("reward_mean", "drift_sample_frac", "drift_token_frac", "drift_logp_abs_diff", "clip_frac", "grad_norm")
    for run in runs:
        lines.append(f"\n{run.arm}: {run.label} per step ({', '.join(names)}):")
        for i, step in enumerate(run.report.steps, start=1):
            lines.append(f"  step {i}: " + "  ".join(f"{step.get(n, math.nan):.4f}" for n in names))
    return "\n".join(lines)


def final_splits(runs: list[Run]) -> tuple[str, ...]:
    """The splits every run evaluated at its end, in the first run's order."""
    seen = [[ev.split for ev in r.report.evaluations if ev.phase == "final"] for r in runs]
    return tuple(s for s in seen[0] if all(s in other for other in seen[1:]))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arm", nargs="+", action="append", required=True, metavar=("NAME", "RUN_DIR"),
                        help="an arm's name, then its run folders (each with report.json); repeat for each arm")
    parser.add_argument("--start", type=Path, default=None, help="the start every run is paired with: a run "
                        "folder or a store (default: each run's own warm_start or base evaluation)")
    parser.add_argument("--start-phase", default="warm_start", help="the phase of --start's evaluation (base: a "
                        "run that evaluated its start itself)")
    parser.add_argument("--splits", default=None, help="comma-separated (default: every split all runs evaluated "
                        "at the end)")
    parser.add_argument("--curve-split", default="test_l4", help="the held-out split drawn as a curve")
    parser.add_argument("--out", type=Path, default=Path("runs/drift/drift.png"))
    args = parser.parse_args(argv)
    if any(len(group) < 2 for group in args.arm):
        parser.error("--arm NAME RUN_DIR [RUN_DIR ...]: give each arm at least one run folder")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        start = start_arm(args.start, args.start_phase) if args.start is not None else None
        runs = [load_run(group[0], Path(d), start) for group in args.arm for d in group[1:]]
        splits = tuple(args.splits.split(",")) if args.splits else final_splits(runs)
        logger.info("wrote %s", plot(runs, args.out, args.curve_split))
        compared = gains(runs, splits)
        summary = [line for split in compared for line in summary_lines(split)]
        sys.stdout.write(table(runs, splits, compared) + "\n\n" + "\n".join(summary) + "\n" + per_step(runs) + "\n")
    except ConfigError as exc:
        raise SystemExit(f"error: {exc}") from None


if __name__ == "__main__":
    main()
