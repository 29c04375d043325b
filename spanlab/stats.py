"""Confidence intervals for held-out scores (APO, the train report, the comparison): a seeded percentile bootstrap
over tasks.

Scores are means of a dozen or so bounded, lumpy rewards (0, partial credit, 1), where a normal
interval is poor; the bootstrap needs no distributional assumption and, seeded, is deterministic.
The winner-vs-start comparison is paired (same test tasks), which is much tighter than two intervals.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Interval:
    mean: float
    low: float
    high: float
    n: int

    def __str__(self) -> str:
        return f"{self.mean:.3f} [{self.low:.3f}, {self.high:.3f}] (n={self.n})"

    def as_dict(self) -> dict[str, float]:
        return {"mean": self.mean, "low": self.low, "high": self.high, "n": float(self.n)}


def bootstrap(values: Sequence[float], *, level: float = 0.95, resamples: int = 2000, seed: int = 0) -> Interval:
    """Mean of ``values`` and its percentile-bootstrap interval (degenerate for n < 2)."""
    x_N = np.asarray(values, dtype=np.float64)
    if x_N.size == 0:
        return Interval(float("nan"), float("nan"), float("nan"), 0)
    mean = float(x_N.mean())
    if x_N.size < 2:
        return Interval(mean, mean, mean, 1)
    rng = np.random.default_rng(seed)
    means_R = x_N[rng.integers(0, x_N.size, size=(resamples, x_N.size))].mean(axis=1)
    alpha = (1 - level) / 2
    return Interval(mean, float(np.quantile(means_R, alpha)), float(np.quantile(means_R, 1 - alpha)), int(x_N.size))


def paired_difference(after: Sequence[float], before: Sequence[float], **kwargs: float) -> Interval:
    """Interval of mean(after - before) over the same tasks."""
    a_N, b_N = np.asarray(after, dtype=np.float64), np.asarray(before, dtype=np.float64)
    if a_N.shape != b_N.shape:
        raise ValueError(f"paired scores need the same tasks: {a_N.shape} vs {b_N.shape}")
    return bootstrap((a_N - b_N).tolist(), **kwargs)  # type: ignore[arg-type]
