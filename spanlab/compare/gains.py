"""Arms of seeded runs against a shared start: each seed's gain, the arm's mean gain, arm against arm.

Pairing is what makes a few runs on a hundred questions say anything. Within a run, its final reward on a
question is paired with the start's on the same question (the gain); across arms, a run is paired with the other
arm's run of the same seed (seeded runs share their random numbers, so what differs is the recipe) and with the
same questions. Runs without a seed are independent replicates: still paired by question, but an arm-vs-arm
difference then draws each arm's runs on their own. Intervals: :mod:`spanlab.compare.bootstrap`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict

from spanlab.compare.bootstrap import seeds_and_questions
from spanlab.compare.runs import HeldOutScores
from spanlab.errors import ConfigError
from spanlab.stats import Interval

Verdict = Literal["better", "worse", "cannot tell"]


@dataclass(frozen=True)
class Run:
    """One run of an arm: its final evaluation and the evaluation it is paired with (usually the shared start)."""

    final: HeldOutScores
    start: HeldOutScores


@dataclass(frozen=True)
class Settings:
    """The bootstrap's settings: seeded, so a comparison prints the same numbers every time."""

    level: float = 0.95
    resamples: int = 2000
    seed: int = 0


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Estimate(_Model):
    """A mean difference in accuracy (a fraction; shown in points) with its interval and what it rests on."""

    mean: float
    low: float
    high: float
    seeds: int
    questions: int
    verdict: Verdict

    @classmethod
    def of(cls, interval: Interval, seeds: int) -> Estimate:
        return cls(mean=interval.mean, low=interval.low, high=interval.high, seeds=seeds, questions=interval.n,
                   verdict=verdict(interval))


class SeedGain(_Model):
    """One run's gain over its start on one split, with the question-level interval."""

    run: str
    seed: int | None
    start_accuracy: float
    final_accuracy: float
    gain: Estimate
    extra_ops: float | None  # at the end; None where the run did not record it


class ArmGain(_Model):
    """An arm on one split: its runs, and the mean over them with the interval over seeds and questions."""

    arm: str
    runs: list[SeedGain]
    start_accuracy: float
    final_accuracy: float
    gain: Estimate
    extra_ops: float | None  # mean over the runs that recorded it


class ArmDifference(_Model):
    """``arm``'s gain minus ``reference``'s, paired by question and, where both hold them, by seed."""

    arm: str
    reference: str
    paired_seeds: list[int]  # empty: the runs share no seed and are drawn on their own
    difference: Estimate


class SplitComparison(_Model):
    split: str
    questions: int
    start_accuracy: float
    start_extra_ops: float | None
    arms: list[ArmGain]
    versus: list[ArmDifference]


def verdict(interval: Interval) -> Verdict:
    """``better``/``worse`` when the interval excludes zero on that side, else ``cannot tell``."""
    return "better" if interval.low > 0 else "worse" if interval.high < 0 else "cannot tell"


def paired_by_task(after: Mapping[str, float], before: Mapping[str, float], *,
                   settings: Settings = Settings()) -> Interval | None:
    """mean(after - before) over the tasks both scored, sorted by task_id, with the question-level interval (None:
    no common task). Two single runs compared question by question, as every comparison here pairs them."""
    tasks = sorted(after.keys() & before.keys())
    if not tasks:
        return None
    return seeds_and_questions(np.array([[after[t] - before[t] for t in tasks]]), level=settings.level,
                               resamples=settings.resamples, seed=settings.seed)


def common_questions(arms: Mapping[str, Sequence[Run]], split: str) -> list[str]:
    """The questions every run and its start answered on ``split``, sorted. Runs that evaluated prefixes of one
    question list (a start on 60, the arms on 30) share the shorter list; any other difference is an error,
    since an unpaired comparison is not the one printed."""
    runs = [run for group in arms.values() for run in group]
    sets = [(scores.label, set(scores.rewards[split])) for run in runs for scores in (run.start, run.final)]
    smallest = min((ids for _, ids in sets), key=len)
    for label, ids in sets:
        if not smallest <= ids:
            raise ConfigError(f"{label}: its {split} questions differ from the other runs' ({len(smallest - ids)} "
                              f"of {len(smallest)} missing); not a paired comparison")
    return sorted(smallest)


def _gains_SQ(runs: Sequence[Run], split: str, questions: Sequence[str]) -> np.ndarray:
    return np.array([[run.final.rewards[split][q] - run.start.rewards[split][q] for q in questions] for run in runs])


def _mean(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def arm_gain(arm: str, runs: Sequence[Run], split: str, questions: Sequence[str], settings: Settings) -> ArmGain:
    """Each run's gain (question-level interval) and the arm's mean gain (seed-and-question interval)."""
    gains_SQ = _gains_SQ(runs, split, questions)
    kwargs = {"level": settings.level, "resamples": settings.resamples, "seed": settings.seed}
    seeds = []
    for run, gains_Q in zip(runs, gains_SQ, strict=True):
        finals = [run.final.rewards[split][q] for q in questions]
        starts = [run.start.rewards[split][q] for q in questions]
        seeds.append(SeedGain(run=run.final.label, seed=run.final.seed, start_accuracy=float(np.mean(starts)),
                              final_accuracy=float(np.mean(finals)),
                              gain=Estimate.of(seeds_and_questions(gains_Q[None, :], **kwargs), 1),
                              extra_ops=run.final.extra_ops.get(split)))
    return ArmGain(arm=arm, runs=seeds, start_accuracy=float(np.mean([s.start_accuracy for s in seeds])),
                   final_accuracy=float(np.mean([s.final_accuracy for s in seeds])),
                   gain=Estimate.of(seeds_and_questions(gains_SQ, **kwargs), len(runs)),
                   extra_ops=_mean([s.extra_ops for s in seeds]))


def shared_seeds(arm: Sequence[Run], reference: Sequence[Run]) -> list[int]:
    """The seeds both arms ran, when every run of both has one (else none: unseeded runs are not paired)."""
    seeds = [run.final.seed for run in (*arm, *reference)]
    if any(seed is None for seed in seeds):
        return []
    return sorted({r.final.seed for r in arm} & {r.final.seed for r in reference})  # type: ignore[type-var]


def arm_difference(arm: str, runs: Sequence[Run], reference: str, reference_runs: Sequence[Run], split: str,
                   questions: Sequence[str], settings: Settings) -> ArmDifference:
    """``arm``'s gain minus ``reference``'s: seed by seed on their shared seeds, else each arm drawn on its own."""
    kwargs = {"level": settings.level, "resamples": settings.resamples, "seed": settings.seed}
    seeds = shared_seeds(runs, reference_runs)
    if seeds:
        ours = _gains_SQ([next(r for r in runs if r.final.seed == s) for s in seeds], split, questions)
        theirs = _gains_SQ([next(r for r in reference_runs if r.final.seed == s) for s in seeds], split, questions)
        interval, n = seeds_and_questions(ours - theirs, **kwargs), len(seeds)
    else:
        ours, theirs = _gains_SQ(runs, split, questions), _gains_SQ(reference_runs, split, questions)
        interval, n = seeds_and_questions(ours, theirs, **kwargs), min(len(runs), len(reference_runs))
    return ArmDifference(arm=arm, reference=reference, paired_seeds=seeds, difference=Estimate.of(interval, n))


def check_arms(arms: Mapping[str, Sequence[Run]]) -> None:
    """Each arm has runs, one per seed: two runs of one seed in an arm would count one sample twice."""
    for name, runs in arms.items():
        if not runs:
            raise ConfigError(f"arm {name!r} has no runs")
        seeds = [run.final.seed for run in runs if run.final.seed is not None]
        if len(seeds) != len(set(seeds)):
            twice = sorted({s for s in seeds if seeds.count(s) > 1})
            raise ConfigError(f"arm {name!r}: more than one run with seed {twice[0]} (give one run per seed)")


def compare_split(arms: Mapping[str, Sequence[Run]], split: str, reference: str | None,
                  settings: Settings = Settings()) -> SplitComparison:
    """One split: every arm's gains, and every other arm against ``reference`` (None: no arm-vs-arm rows)."""
    questions = common_questions(arms, split)
    gains = [arm_gain(name, runs, split, questions, settings) for name, runs in arms.items()]
    versus = [] if reference is None else [
        arm_difference(name, runs, reference, arms[reference], split, questions, settings)
        for name, runs in arms.items() if name != reference]
    starts = list({id(run.start): run.start for runs in arms.values() for run in runs}.values())
    return SplitComparison(split=split, questions=len(questions),
                           start_accuracy=float(np.mean([g.start_accuracy for g in gains])),
                           start_extra_ops=starts[0].extra_ops.get(split) if len(starts) == 1 else None,
                           arms=gains, versus=versus)
