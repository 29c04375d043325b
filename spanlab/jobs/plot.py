"""``spanlab plot``: a PNG of a run's reward curve (and held-out accuracy) from the store's ``train_metrics``.

Splits evaluated during training (``eval: {curve: ...}``) are drawn as curves over the steps beside the train
reward; the other held-out accuracies as reference lines.

A run that trained on older policies' samples (``loop: {mode: async}``, docs/async.md) gets a second panel:
staleness, importance weights and mismatch KL per step, with the rollouts dropped as stale as bars.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from spanlab.errors import NotFoundError
from spanlab.store.base import StoreAPI

OFF_POLICY_LINES = ("staleness_mean", "tis_weight_mean", "mismatch_kl")


def latest_run_id(store: StoreAPI) -> str:
    rows = store.metrics()
    if not rows:
        raise NotFoundError("the store has no training metrics yet (run `spanlab train` first)")
    return rows[-1].run_id


def plot_run(store: StoreAPI, out: Path, run_id: str | None = None) -> Path:
    """Reward mean +- std per step, with the held-out accuracies as horizontal reference lines."""
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
    off_policy = "staleness_mean" in series
    fig, axes = plt.subplots(2 if off_policy else 1, 1, figsize=(7, 6.5 if off_policy else 4), dpi=120,
                             squeeze=False)
    ax = axes[0][0]
    if mean := series.get("reward_mean"):
        steps = sorted(mean)
        ys = [mean[s] for s in steps]
        # +- one standard error of the step's mean (0/1 rewards have a std near 0.5 whatever happens)
        err = [series.get("reward_std", {}).get(s, 0.0) / max(series.get("n_samples", {}).get(s, 1.0), 1.0) ** 0.5
               for s in steps]
        ax.errorbar(steps, ys, yerr=err, marker="o", capsize=3, label="train reward (mean per step, +- s.e.)")
    for name, (steps, ys) in held_out_curves(series).items():
        ax.plot(steps, ys, marker="s", linestyle="-", label=f"held-out {name} (start, every few steps, final)")
    for name, values in sorted(series.items()):
        if name.startswith("eval_accuracy_") and not _has_curve(name, series):
            value = next(iter(values.values()))
            ax.axhline(value, linestyle="--", linewidth=1, color="gray")
            ax.text(0.01, value, f" held-out {name.removeprefix('eval_accuracy_')}: {100 * value:.1f}%",
                    transform=ax.get_yaxis_transform(), va="bottom", fontsize=8, color="dimgray")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set(xlabel="GRPO step", ylabel="reward", title=f"spanlab run {run_id}", ylim=(-0.05, 1.05))
    ax.legend(loc="lower right")
    if off_policy:
        _plot_off_policy(axes[1][0], series)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out


def held_out_curves(series: dict[str, dict[int, float]]) -> dict[str, tuple[list[int], list[float]]]:
    """The held-out splits evaluated during training (``eval.curve``): split -> (steps, accuracies)."""
    return {name.removeprefix("curve_"): (sorted(values), [values[s] for s in sorted(values)])
            for name, values in sorted(series.items()) if name.startswith("curve_")}


def _has_curve(name: str, series: dict[str, dict[int, float]]) -> bool:
    """An ``eval_accuracy_<phase>_<split>`` line whose split is drawn as a curve already."""
    return any(name.endswith(f"_{curve.removeprefix('curve_')}") for curve in series if curve.startswith("curve_"))


def _plot_off_policy(ax: Any, series: dict[str, dict[int, float]]) -> None:
    """Staleness, TIS weight and mismatch KL per step (lines), rollouts dropped as stale (bars, right axis)."""
    for name in OFF_POLICY_LINES:
        if values := series.get(name):
            steps = sorted(values)
            ax.plot(steps, [values[s] for s in steps], marker=".", label=name)
    ax.set(xlabel="GRPO step", ylabel="per step")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.legend(loc="upper left", fontsize=8)
    if dropped := series.get("dropped_stale_rollouts"):
        bars = ax.twinx()
        steps = sorted(dropped)
        bars.bar(steps, [dropped[s] for s in steps], alpha=0.25, color="gray", label="dropped as stale")
        bars.set_ylabel("rollouts dropped as stale")
        bars.legend(loc="upper right", fontsize=8)
