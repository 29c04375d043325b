"""``spanlab plot``: a PNG of a run from the store's ``train_metrics``: what training did, and where it ended.

Two panels, so that every number can be read (labels of close values once printed on top of each other):

- left, over the steps: the train reward (mean per step, +- s.e.) and the splits evaluated during training
  (``eval: {curve: ...}``, the skill RL trains) with each point's accuracy written beside it;
- right, the other held-out splits (those demonstrated) as bars per phase, start vs end (base, warm start,
  SFT rounds, final), each bar labelled with its accuracy.

The x axis counts steps done: at k, the policy after k steps (the rollouts of step k + 1, the held-out points
evaluated then; the final evaluation at the last k). A run that trained on older policies' samples
(``loop: {mode: async}``, docs/async.md) gets a third panel below: staleness, importance weights and mismatch KL
per step, with the rollouts dropped as stale as bars.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

from spanlab.errors import NotFoundError, SpanlabError
from spanlab.store.base import StoreAPI

logger = logging.getLogger(__name__)

OFF_POLICY_LINES = ("staleness_mean", "tis_weight_mean", "mismatch_kl")
# eval_accuracy_<phase> (the headline split) and eval_accuracy_<phase>_<split> (spanlab.jobs.job.Job._evaluate)
_HELD_OUT = re.compile(r"eval_accuracy_(base|warm_start|round_\d+|final)(?:_(.+))?")
PHASE_COLORS = {"base": "#9e9e9e", "warm_start": "#4c72b0", "final": "#2a9d4b"}
CURVE_COLORS = ("#dd8452", "#c44e52", "#8172b3", "#937860")  # none of them the train reward's blue


def latest_run_id(store: StoreAPI) -> str:
    rows = store.metrics()
    if not rows:
        raise NotFoundError("the store has no training metrics yet (run `spanlab train` first)")
    return rows[-1].run_id


def plot_run(store: StoreAPI, out: Path, run_id: str | None = None, headline: str | None = None) -> Path:
    """The run's PNG (module doc); ``headline``: the name of ``eval.split`` (default: read from its rollouts)."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on a training box
    import matplotlib.pyplot as plt

    run_id = run_id or latest_run_id(store)
    rows = [m.model_dump() for m in sorted(store.metrics(run_id), key=lambda m: m.step)]
    if not rows:
        raise NotFoundError(f"no metrics for run {run_id!r}")
    series: dict[str, dict[int, float]] = {}
    for r in rows:
        series.setdefault(r["name"], {})[r["step"]] = r["value"]
    bars = held_out_bars(series, headline or _headline_split(store, run_id, series))
    off_policy = "staleness_mean" in series
    fig = plt.figure(figsize=(12 if bars else 7, 7 if off_policy else 4.2), dpi=120)
    grid = fig.add_gridspec(2 if off_policy else 1, 2 if bars else 1, width_ratios=[3, 2] if bars else [1],
                            height_ratios=[3, 2] if off_policy else [1])
    _plot_training(fig.add_subplot(grid[0, 0]), series)
    if bars:
        _plot_bars(fig.add_subplot(grid[0, 1]), bars)
    if off_policy:
        _plot_off_policy(fig.add_subplot(grid[1, :]), series)
    fig.suptitle(f"spanlab run {run_id}")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out


def _plot_training(ax: Any, series: dict[str, dict[int, float]]) -> None:
    """Train reward per step and the held-out curves, each curve point labelled with its accuracy."""
    if mean := series.get("reward_mean"):
        steps = sorted(mean)
        # +- one standard error of the step's mean (0/1 rewards have a std near 0.5 whatever happens)
        err = [series.get("reward_std", {}).get(s, 0.0) / max(series.get("n_samples", {}).get(s, 1.0), 1.0) ** 0.5
               for s in steps]
        ax.errorbar(steps, [mean[s] for s in steps], yerr=err, marker="o", capsize=3, color="#4c72b0",
                    label="train reward (mean per step, +- s.e.)")
    for (name, (steps, ys)), color in zip(held_out_curves(series).items(), CURVE_COLORS * 4, strict=False):
        (line,) = ax.plot(steps, ys, marker="s", linestyle="-", color=color, label=f"held-out {name}")
        for x, y in zip(steps, ys, strict=True):
            ax.annotate(f"{100 * y:.1f}%", (x, y), textcoords="offset points", xytext=(0, 7), ha="center",
                        fontsize=8, color=line.get_color())
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set(xlabel="steps done (k: the policy after k steps)", ylabel="reward / accuracy", ylim=(-0.05, 1.1),
           title="training")
    ax.legend(loc="lower right", fontsize=8)


def _plot_bars(ax: Any, bars: dict[str, dict[str, float]]) -> None:
    """Held-out accuracy per split (groups) and phase (bars), each bar labelled with its value."""
    phases = sorted({p for accs in bars.values() for p in accs}, key=_phase_order)
    width = 0.8 / len(phases)
    for i, phase in enumerate(phases):
        xs = [j + (i - (len(phases) - 1) / 2) * width for j, accs in enumerate(bars.values()) if phase in accs]
        ys = [accs[phase] for accs in bars.values() if phase in accs]
        drawn = ax.bar(xs, ys, width * 0.95, label=phase.replace("_", " "), color=PHASE_COLORS.get(phase))
        ax.bar_label(drawn, labels=[f"{100 * y:.1f}%" for y in ys], fontsize=7, padding=2)
    ax.set_xticks(range(len(bars)), list(bars))
    pad = 0.7 if len(bars) > 1 else 1.2  # one split's bars stay bars, not the panel's whole width
    ax.set_xlim(-pad, len(bars) - 1 + pad)
    ax.set(ylabel="held-out accuracy", ylim=(0, 1.15), title="held-out splits: start vs end")
    ax.legend(loc="upper right", fontsize=8, ncols=len(phases))


def held_out_curves(series: dict[str, dict[int, float]]) -> dict[str, tuple[list[int], list[float]]]:
    """The held-out splits evaluated during training (``eval.curve``): split -> (steps, accuracies)."""
    return {name.removeprefix("curve_"): (sorted(values), [values[s] for s in sorted(values)])
            for name, values in sorted(series.items()) if name.startswith("curve_")}


def held_out_bars(series: dict[str, dict[int, float]], headline: str) -> dict[str, dict[str, float]]:
    """split -> phase -> accuracy of the held-out evaluations not drawn as a curve (``headline``: the name of the
    split whose metrics carry no split name, drawn first)."""
    curves, bars = held_out_curves(series), {}
    for name, values in series.items():
        if (match := _HELD_OUT.fullmatch(name)) is None or (split := match.group(2) or headline) in curves:
            continue
        bars.setdefault(split, {})[match.group(1)] = next(iter(values.values()))
    splits = sorted(bars, key=lambda split: split != headline)  # the headline first, the rest as they came
    return {split: dict(sorted(bars[split].items(), key=lambda kv: _phase_order(kv[0]))) for split in splits}


def _phase_order(phase: str) -> tuple[int, int]:
    if phase.startswith("round_"):
        return 2, int(phase.removeprefix("round_"))
    return {"base": (0, 0), "warm_start": (1, 0), "final": (3, 0)}.get(phase, (2, 0))


def _headline_split(store: StoreAPI, run_id: str, series: dict[str, dict[int, float]]) -> str:
    """The headline split's name (``eval.split``), which its metrics leave out: the split of the run's held-out
    rollouts that no other metric names; "held-out" when the rollouts do not tell."""
    named = {m.group(2) for name in series if (m := _HELD_OUT.fullmatch(name)) is not None and m.group(2)}
    run = run_id.replace("'", "''")
    try:
        table = store.query(f"SELECT DISTINCT metadata->>'split' AS split FROM rollout_summary "
                            f"WHERE mode = 'test' AND metadata->>'run_id' = '{run}'", 100)
    except SpanlabError as exc:  # a store that cannot answer SQL: the label only is generic
        logger.info("headline split of run %s unknown: %s", run_id, exc)
        return "held-out"
    left = {s for s in table.column("split").to_pylist() if s is not None} - named if table.num_rows else set()
    return left.pop() if len(left) == 1 else "held-out"


def _plot_off_policy(ax: Any, series: dict[str, dict[int, float]]) -> None:
    """Staleness, TIS weight and mismatch KL per step (lines), rollouts dropped as stale (bars, right axis)."""
    for name in OFF_POLICY_LINES:
        if values := series.get(name):
            steps = sorted(values)
            ax.plot(steps, [values[s] for s in steps], marker=".", label=name)
    ax.set(xlabel="steps done", ylabel="per step", title="off-policy: how old the trained samples were")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.legend(loc="upper left", fontsize=8)
    if dropped := series.get("dropped_stale_rollouts"):
        bars = ax.twinx()
        steps = sorted(dropped)
        bars.bar(steps, [dropped[s] for s in steps], alpha=0.25, color="gray", label="dropped as stale")
        bars.set_ylabel("rollouts dropped as stale")
        bars.legend(loc="upper right", fontsize=8)
