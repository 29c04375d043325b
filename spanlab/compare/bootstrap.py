"""The interval of a mean gain over several seeds: a two-level bootstrap over seeds and questions.

A run's gain on a split is the mean over its questions of (final reward - start reward); an arm's gain is the
mean of its seeds' gains. Two things make it noisy: which seed (one config run twice differs by several points)
and which questions (a split is a sample of the questions the recipe should handle). Each bootstrap draw
resamples both: the seeds (rows) with replacement, and the questions (columns) with replacement.

The question draw is shared by every seed in it, because every seed answered the same questions: a question
every seed learns, or none does, moves all seeds together, and resampling it independently per seed would
divide that shared part by the number of seeds and give too narrow an interval (docs/compare.md has the
coverage check). An arm-vs-arm difference shares the question draw between the arms too (paired by question),
and, where the arms' runs share seeds, the seed draw (the difference is taken seed by seed first).

With one seed the interval is the question-level one, the same numbers as :func:`spanlab.stats.paired_difference`
and the paired gains ``spanlab train`` prints.
"""

from __future__ import annotations

import numpy as np

from spanlab.stats import Interval, bootstrap


def _counts(index_RN: np.ndarray, size: int) -> np.ndarray:
    """How often each of ``size`` items was drawn in each resample (rows of ``index_RN``)."""
    resamples = index_RN.shape[0]
    offsets_R1 = np.arange(resamples)[:, None] * size
    return np.bincount((index_RN + offsets_R1).ravel(), minlength=resamples * size).reshape(resamples, size)


def _resampled_means(gains_SQ: np.ndarray, questions_RQ: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """The mean of ``gains_SQ`` in each resample: its own seed draw, the shared question counts."""
    n_seeds, n_questions = gains_SQ.shape
    seeds_RS = _counts(rng.integers(0, n_seeds, size=(questions_RQ.shape[0], n_seeds)), n_seeds)
    return np.einsum("rs,sq,rq->r", seeds_RS, gains_SQ, questions_RQ) / (n_seeds * n_questions)


def seeds_and_questions(gains_SQ: np.ndarray, minus_SQ: np.ndarray | None = None, *, level: float = 0.95,
                        resamples: int = 2000, seed: int = 0) -> Interval:
    """mean(``gains_SQ``) - mean(``minus_SQ``) (seeds x questions, the same questions in the same column order) and
    its percentile interval; ``Interval.n`` is the number of questions.

    ``minus_SQ`` is for two arms whose runs do not share seeds: their seeds are drawn independently, their
    questions together. Arms that share seeds are compared by passing the seed-by-seed difference alone."""
    gains_SQ = np.asarray(gains_SQ, dtype=np.float64)
    if gains_SQ.ndim != 2 or gains_SQ.size == 0:
        raise ValueError(f"gains need at least one seed and one question, got shape {gains_SQ.shape}")
    if minus_SQ is None and gains_SQ.shape[0] == 1:  # one seed: exactly the question-level paired bootstrap
        return bootstrap(gains_SQ[0].tolist(), level=level, resamples=resamples, seed=seed)
    n_questions = gains_SQ.shape[1]
    mean = float(gains_SQ.mean())
    if minus_SQ is not None:
        minus_SQ = np.asarray(minus_SQ, dtype=np.float64)
        if minus_SQ.ndim != 2 or minus_SQ.shape[1] != n_questions or minus_SQ.shape[0] == 0:
            raise ValueError(f"compared gains need the same questions: {gains_SQ.shape} vs {minus_SQ.shape}")
        mean -= float(minus_SQ.mean())
    if n_questions < 2 and gains_SQ.shape[0] < 2 and (minus_SQ is None or minus_SQ.shape[0] < 2):
        return Interval(mean, mean, mean, n_questions)
    rng = np.random.default_rng(seed)
    questions_RQ = _counts(rng.integers(0, n_questions, size=(resamples, n_questions)), n_questions)
    means_R = _resampled_means(gains_SQ, questions_RQ, rng)
    if minus_SQ is not None:
        means_R = means_R - _resampled_means(minus_SQ, questions_RQ, rng)
    alpha = (1 - level) / 2
    return Interval(mean, float(np.quantile(means_R, alpha)), float(np.quantile(means_R, 1 - alpha)), n_questions)
