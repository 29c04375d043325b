"""What a finished (or running) job says about itself: whether its steps changed the weights, and how to serve
what it wrote.

Why a module of its own: a GRPO step whose groups all got one reward (every rollout right, or every one wrong)
has no advantage to follow and changes nothing, and a run made only of such steps still ends with a held-out
table and a ``final/`` folder. Without a loud line it reads as a trained model. The step metrics already say
it: GRPO's update returns ``skipped`` (1.0: no group had reward variance, no update). This module reads that
key; it never looks inside an algorithm. An algorithm whose metrics lack the key (SFT, APO) is not judged.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spanlab.engine.served_folder import serve_command

if TYPE_CHECKING:  # config reaches this module at run time (through checkpoints); the types only point back
    from spanlab.jobs.config import TrainConfig
    from spanlab.jobs.report import TrainReport

logger = logging.getLogger(__name__)

NO_UPDATE_KEY = "skipped"  # a step metric: 1.0 when the step changed no weight (GRPO: no group had reward variance)
LEARNED_NOTHING_EXIT = 3  # `spanlab train`'s exit status for a run whose every step skipped its update


def made_no_update(metrics: Mapping[str, Any]) -> bool:
    """Whether one step's metrics say it changed no weight."""
    return metrics.get(NO_UPDATE_KEY) == 1.0


def warn_if_no_update(step: int, metrics: Mapping[str, Any]) -> None:
    """A WARNING for a step that changed no weight, with what to look at (called after each logged step).

    ``step`` counts from 1, as the progress bar (``step 2/9``), the rollout phases and ``step-K`` folders do."""
    if made_no_update(metrics):
        logger.warning(
            "step %d made NO update: no group had reward variance (mean reward %.2f over %d samples: every group "
            "all right or all wrong). The policy did not change and the engine keeps serving it", step,
            float(metrics.get("reward_mean", float("nan"))), int(metrics.get("n_samples", 0)),
        )


def updated_steps(steps: Sequence[Mapping[str, Any]]) -> int | None:
    """How many steps changed the weights; None when the steps' metrics do not say (no ``skipped`` key)."""
    judged = [s for s in steps if NO_UPDATE_KEY in s]
    if not judged:
        return None
    return sum(not made_no_update(s) for s in judged) + len(steps) - len(judged)


def learned_nothing(report: TrainReport) -> bool:
    """True when the run had steps and none of them changed the weights."""
    return bool(report.steps) and updated_steps(report.steps) == 0


def warm_start_warnings(config: TrainConfig, splits: Mapping[str, list[dict[str, Any]]]) -> list[tuple[int, str]]:
    """``(logging level, text)`` lines of ``spanlab train --check`` about a GRPO run that may learn nothing.

    A WARNING when RL starts from the base model on every level it trains (no warm start, or demos of none of
    the train levels): if the base model never earns a reward, every group's rollouts all get 0 and no step
    updates. An INFO line when only some train levels have no demos (a config may mean that: RL one level
    beyond the demonstrations), since groups at the demonstrated levels can still have a mixed outcome."""
    if config.algorithm != "grpo":
        return []
    rl_levels = {t["level"] for t in splits.get("rl", []) if t.get("level") is not None}
    ws = config.warm_start
    if ws is None:
        return [(logging.WARNING, "no warm_start: RL starts from the base model; if it never earns a reward, no "
                                  "group has reward variance and no step updates (add warm_start, as the "
                                  "tutorials do)")]
    demos = splits.get("demos", splits.get("train", []))[:ws.demos]  # what the warm start trains on
    demo_levels = {t["level"] for t in demos if t.get("level") is not None}
    if not (missing := sorted(rl_levels - demo_levels)):
        return []
    if rl_levels & demo_levels:
        return [(logging.INFO, f"warm_start: train levels {missing} have no demos (demos cover "
                               f"{sorted(demo_levels)}): RL there starts from what the other levels taught")]
    return [(logging.WARNING, f"warm_start: its {ws.demos} demos cover levels {sorted(demo_levels)}, none of the "
                              f"train levels {missing}: RL starts from the base model and may find no reward "
                              "variance (check warm_start.levels, warm_start.demos and dataset.train_levels)")]


def end_lines(report: TrainReport, run_dir: Path) -> list[tuple[str, str]]:
    """``(style, text)`` lines that end ``spanlab train``: where things are, how to serve the model, and a
    loud line when no step updated the weights."""
    lines = [("", f"run {report.run_id} in {report.seconds / 60:.1f} min; spans in {report.db}; "
                  f"report in {run_dir / 'report.json'}")]
    if (plot := run_dir / "reward.png").is_file():
        lines.append(("", f"reward and held-out curves: {plot} (again: spanlab plot --db {report.db})"))
    if dropped := {k: n for k, n in report.dropped().items() if k.startswith("dropped_")}:
        counts = ", ".join(f"{n} {k.removeprefix('dropped_').replace('_', ' ')}" for k, n in dropped.items())
        lines.append(("yellow", f"left out of training by the sample rule: {counts} (per step: the dropped_* "
                                "metrics; docs/adapters.md)"))
    nothing = learned_nothing(report)
    if nothing:
        lines.append(("bold red", f"LEARNED NOTHING: none of the {len(report.steps)} {report.algorithm} steps "
                                  "updated the weights (no group had reward variance). Check the warm start "
                                  "and train levels: spanlab train CONFIG --check"))
    final = run_dir / "final"
    if (final / "config.json").is_file():
        what = "model (not changed by any step)" if nothing else "trained model"
        lines.append(("", f"{what}: {final} (serve it: {serve_command(final)})"))
    return lines
