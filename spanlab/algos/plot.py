"""``spanlab plot``: a PNG of a run's reward curve (and held-out accuracy) from the store's ``train_metrics``."""

from __future__ import annotations

from pathlib import Path

from spanlab.errors import NotFoundError
from spanlab.store.base import StoreAPI


def latest_run_id(store: StoreAPI) -> str:
    rows = store.query("SELECT run_id FROM train_metrics ORDER BY time DESC LIMIT 1").to_pylist()
    if not rows:
        raise NotFoundError("the store has no training metrics yet (run `spanlab train` first)")
    return rows[0]["run_id"]


def plot_run(store: StoreAPI, out: Path, run_id: str | None = None) -> Path:
    """Reward mean +- std per step, with the held-out accuracies as horizontal reference lines."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on a training box
    import matplotlib.pyplot as plt

    run_id = run_id or latest_run_id(store)
    rows = store.query(
        "SELECT step, name, value FROM train_metrics WHERE run_id = ? ORDER BY step", [run_id]
    ).to_pylist()
    if not rows:
        raise NotFoundError(f"no metrics for run {run_id!r}")
    series: dict[str, dict[int, float]] = {}
    for r in rows:
        series.setdefault(r["name"], {})[r["step"]] = r["value"]
    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    if mean := series.get("reward_mean"):
        steps = sorted(mean)
        std = series.get("reward_std", {})
        ys = [mean[s] for s in steps]
        ax.plot(steps, ys, marker="o", label="train reward (mean per step)")
        ax.fill_between(steps, [y - std.get(s, 0.0) for s, y in zip(steps, ys, strict=True)],
                        [y + std.get(s, 0.0) for s, y in zip(steps, ys, strict=True)], alpha=0.2)
    for name, values in sorted(series.items()):
        if name.startswith("eval_accuracy_"):
            (step, value), = values.items()
            ax.axhline(value, linestyle="--", linewidth=1, color="gray")
            ax.annotate(f"held-out {name.removeprefix('eval_accuracy_')}: {100 * value:.0f}%", (step, value),
                        textcoords="offset points", xytext=(4, 4), fontsize=8)
    ax.set(xlabel="GRPO step", ylabel="reward", title=f"spanlab run {run_id}", ylim=(-0.05, 1.05))
    ax.legend(loc="lower right")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out
