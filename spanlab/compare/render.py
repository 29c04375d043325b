"""A comparison as markdown: one section per split, a row per run and per arm, arm-vs-arm rows, a verdict line.

Accuracies are in %, gains and differences in points (final minus start accuracy, times 100), intervals in
brackets. The text says what each interval rests on (how many seeds, whether runs were paired by seed), since a
reader otherwise takes an interval over 90 questions of one seed for one over seeds.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from spanlab.compare.gains import ArmDifference, ArmGain, Estimate, SplitComparison


class ArmSummary(BaseModel):
    """What an arm's runs are: their labels and seeds (None: a run without one)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    arm: str
    runs: list[str]
    seeds: list[int | None]


class Comparison(BaseModel):
    """Everything ``spanlab compare`` prints, as data (``--json``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    start: str | None  # None: each run paired with its own start
    start_phase: str | None
    reference: str | None
    arms: list[ArmSummary]
    splits: list[SplitComparison]
    level: float
    resamples: int
    bootstrap_seed: int


def points(e: Estimate) -> str:
    return f"{100 * e.mean:+.1f} [{100 * e.low:+.1f}, {100 * e.high:+.1f}]"


def _pct(share: float | None) -> str:
    return "-" if share is None else f"{100 * share:.1f}%"


def describe_arm(arm: ArmSummary) -> str:
    """One line: the arm's seeds, or that its runs are unseeded replicates, and what its interval counts."""
    seeds = [s for s in arm.seeds if s is not None]
    n = len(arm.runs)
    if not seeds:
        what = ("1 run without a seed" if n == 1 else
                f"{n} runs without a seed: independent replicates, not paired by seed with other arms")
    elif len(seeds) < n:
        what = (f"{n} runs, {n - len(seeds)} without a seed: independent replicates, not paired by seed with other "
                "arms")
    else:
        what = f"{n} seed{'s' if n > 1 else ''} ({', '.join(map(str, seeds))})"
    scope = "interval over questions only" if n == 1 else "interval over runs and questions"
    return f"- arm **{arm.arm}**: {what}; {scope} ({', '.join(arm.runs)})"


def _arm_rows(arm: ArmGain) -> list[str]:
    rows = []
    for run in arm.runs:
        seed = "-" if run.seed is None else str(run.seed)
        rows.append(f"| {arm.arm} | {run.run} | {seed} | {100 * run.start_accuracy:.1f}% "
                    f"| {100 * run.final_accuracy:.1f}% | {points(run.gain)} | {run.gain.verdict} "
                    f"| {_pct(run.extra_ops)} |")
    if len(arm.runs) > 1:
        kind = "seeds" if all(r.seed is not None for r in arm.runs) else "runs"
        rows.append(f"| {arm.arm} | **mean of {len(arm.runs)} {kind}** | | {100 * arm.start_accuracy:.1f}% "
                    f"| {100 * arm.final_accuracy:.1f}% | **{points(arm.gain)}** | **{arm.gain.verdict}** "
                    f"| {_pct(arm.extra_ops)} |")
    return rows


def _paired_by(diff: ArmDifference) -> str:
    if diff.paired_seeds:
        return f"seed ({', '.join(map(str, diff.paired_seeds))}) and question"
    return "question (no shared seeds: each arm's runs drawn on their own)"


def verdict_line(split: SplitComparison) -> str:
    """The split's verdict in one line: each arm against the reference, or, with no reference, against the start."""
    if split.versus:
        parts = [f"{d.arm} vs {d.reference}: {d.difference.verdict} ({points(d.difference)}, "
                 f"{_rests_on(d.difference)})" for d in split.versus]
    else:
        parts = [f"{a.arm} vs start: {a.gain.verdict} ({points(a.gain)}, {_rests_on(a.gain)})" for a in split.arms]
    return f"Verdict on {split.split}: " + "; ".join(parts) + "."


def summary_lines(split: SplitComparison) -> list[str]:
    """The split in plain lines (for scripts that print tables of their own): each arm's mean gain over the start,
    then the verdict line."""
    lines = [f"{split.split}: {arm.arm} gained {points(arm.gain)} over the start ({_rests_on(arm.gain)}): "
             f"{arm.gain.verdict}" for arm in split.arms]
    return [*lines, verdict_line(split)]


def _rests_on(e: Estimate) -> str:
    return f"{e.seeds} seed{'s' if e.seeds != 1 else ''} x {e.questions} questions"


def split_section(split: SplitComparison, start: str | None) -> list[str]:
    lines = [f"## {split.split}: {split.questions} questions", "",
             "| arm | run | seed | start | final | gain, points [95% CI] | vs start | extra-op share |",
             "|---|---|---|---|---|---|---|---|"]
    if start is not None:
        lines.append(f"| start | {start} | | {100 * split.start_accuracy:.1f}% | | | | "
                     f"{_pct(split.start_extra_ops)} |")
    for arm in split.arms:
        lines += _arm_rows(arm)
    if split.versus:
        lines += ["", "| arm | vs | paired by | difference in gain, points [95% CI] | verdict |",
                  "|---|---|---|---|---|"]
        lines += [f"| {d.arm} | {d.reference} | {_paired_by(d)} | {points(d.difference)} | {d.difference.verdict} |"
                  for d in split.versus]
    return [*lines, "", verdict_line(split), ""]


def markdown(comparison: Comparison) -> str:
    """The whole comparison: what was compared, how intervals are made, then one section per split."""
    start = (f"against the start **{comparison.start}** (phase {comparison.start_phase})"
             if comparison.start is not None else "each run against its own start")
    lines = [f"# Comparison of {len(comparison.arms)} arm{'s' if len(comparison.arms) != 1 else ''} {start}", "",
             *(describe_arm(arm) for arm in comparison.arms), "",
             f"Gain: final minus start accuracy on the same questions, in points. Intervals: "
             f"{100 * comparison.level:.0f}%, a bootstrap over seeds and questions ({comparison.resamples} draws, "
             f"seed {comparison.bootstrap_seed}). Verdict: better or worse when the interval excludes zero, else "
             "cannot tell.", ""]
    for split in comparison.splits:
        lines += split_section(split, comparison.start)
    return "\n".join(lines).rstrip() + "\n"
