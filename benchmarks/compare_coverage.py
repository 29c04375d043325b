"""How often ``spanlab compare``'s 95% interval holds the true mean gain, against a bootstrap that resamples the
questions of each seed on their own.

Simulated arms: S seeds answer the same Q questions. Each question has its own chance of being gained (shared by
every seed: some questions every seed learns, some none does; a Beta(0.7, 0.7) spread), each seed shifts it a
little (normal, sd 0.05), and each answer is drawn from that chance. The true mean gain is 0.5. For each simulated
arm, both intervals are computed; the script prints how often each holds 0.5 and its mean width. Left out: any
model or store (the intervals only see the seeds x questions matrix).

    python benchmarks/compare_coverage.py --trials 300
"""

from __future__ import annotations

import argparse
import logging

import numpy as np

from spanlab.compare.bootstrap import seeds_and_questions

logger = logging.getLogger("compare_coverage")


def per_seed_questions(gains_SQ: np.ndarray, rng: np.random.Generator, resamples: int) -> tuple[float, float]:
    """The other two-level bootstrap: resample seeds, then each chosen seed's questions independently."""
    n_seeds, n_questions = gains_SQ.shape
    seeds_RS = rng.integers(0, n_seeds, size=(resamples, n_seeds))
    questions_RSQ = rng.integers(0, n_questions, size=(resamples, n_seeds, n_questions))
    means_R = gains_SQ[seeds_RS[:, :, None], questions_RSQ].mean(axis=(1, 2))
    return float(np.quantile(means_R, 0.025)), float(np.quantile(means_R, 0.975))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=300)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--questions", type=int, default=90)
    parser.add_argument("--resamples", type=int, default=1000)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    rng = np.random.default_rng(1)
    held = {"shared question draw (spanlab compare)": [], "questions drawn per seed": []}
    widths: dict[str, list[float]] = {name: [] for name in held}
    for trial in range(args.trials):
        chance_Q = rng.beta(0.7, 0.7, args.questions)
        shift_S = rng.normal(0.0, 0.05, args.seeds)
        chance_SQ = np.clip(chance_Q[None, :] + shift_S[:, None], 0, 1)
        gains_SQ = (rng.random(chance_SQ.shape) < chance_SQ).astype(float)
        ours = seeds_and_questions(gains_SQ, resamples=args.resamples, seed=trial)
        for name, (low, high) in zip(held, [(ours.low, ours.high), per_seed_questions(gains_SQ, rng, args.resamples)],
                                     strict=True):
            held[name].append(low <= 0.5 <= high)
            widths[name].append(high - low)
    for name in held:
        logger.info("%s: holds the true mean in %.1f%% of %d arms, mean width %.1f points", name,
                    100 * np.mean(held[name]), args.trials, 100 * np.mean(widths[name]))


if __name__ == "__main__":
    main()
