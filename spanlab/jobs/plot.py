"""``spanlab plot``: a PNG of a run's reward curve (and held-out accuracy) from the store's ``train_metrics``."""

from __future__ import annotations

from pathlib import Path

from spanlab.errors import NotFoundError
from spanlab.store.base import StoreAPI


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
    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    if mean := series.get("reward_mean"):
        steps = sorted(mean)
        ys = [mean[s] for s in steps]
        # +- one standard error of the step's mean (0/1 rewards have a std near 0.5 whatever happens)
        err = [series.get("reward_std", {}).get(s, 0.0) / max(series.get("n_samples", {}).get(s, 1.0), 1.0) ** 0.5
               for s in steps]
        ax.errorbar(steps, ys, yerr=err, marker="o", capsize=3, label="train reward (mean per step, +- s.e.)")
    for name, values in sorted(series.items()):
        if name.startswith("eval_accuracy_"):
            value = next(iter(values.values()))
            ax.axhline(value, linestyle="--", linewidth=1, color="gray")
            ax.text(0.01, value, f" held-out {name.removeprefix('eval_accuracy_')}: {100 * value:.1f}%",
                    transform=ax.get_yaxis_transform(), va="bottom", fontsize=8, color="dimgray")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set(xlabel="GRPO step", ylabel="reward", title=f"spanlab run {run_id}", ylim=(-0.05, 1.05))
    ax.legend(loc="lower right")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out
