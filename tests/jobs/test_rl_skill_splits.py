"""A job whose RL learns a level no demonstration shows: demos of some levels only, weighted RL draws, held-out
splits at levels of their own, and a learning curve of the skill RL trains (``eval.curve``).

All checked with ``check_job`` (no engine): what each split holds is what the held-out numbers mean.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from spanlab.cli import app
from spanlab.jobs.config import parse_train_config
from spanlab.jobs.job import check_job, level_quota

CONFIG = {
    "algorithm": "grpo", "grpo": {"steps": 4, "tasks_per_step": 8},
    "dataset": {"name": "calc", "levels": [1, 2, 3, 4], "train_levels": {2: 1, 3: 1, 4: 2}},
    "warm_start": {"demos": 24, "levels": [1, 2, 3]},
    "eval": {"split": "test", "levels": [1, 2, 3], "tasks": 12, "curve": {"splits": ["test_l4"], "every": 2},
             "extra_splits": ["family", {"name": "test_l4", "split": "test", "levels": [4]},
                              {"name": "family_l4", "split": "family", "levels": [4]},
                              {"name": "depth", "split": "depth", "levels": [1, 2, 3, 4]}]},
}


def test_demos_skip_the_level_rl_alone_trains_and_every_split_asks_its_own_levels() -> None:
    _, _, splits = check_job(parse_train_config(CONFIG))
    levels = {key: {t["level"] for t in tasks} for key, tasks in splits.items()}
    assert levels["demos"] == {1, 2, 3} and len(splits["demos"]) >= 24
    assert levels["rl"] == {2, 3, 4} and levels["train"] == {1, 2, 3, 4}
    assert (levels["eval"], levels["eval:family"]) == ({1, 2, 3}, {1, 2, 3})
    assert (levels["eval:test_l4"], levels["eval:family_l4"], levels["eval:depth"]) == ({4}, {4}, {5})
    assert all(len(tasks) == 12 for key, tasks in splits.items() if key.startswith("eval"))
    # held out: no RL or demo question is asked in any evaluation, and the two level-4 splits share no template
    trained = {t["question"] for t in splits["train"]}
    assert not trained & {t["question"] for key, ts in splits.items() if key.startswith("eval") for t in ts}
    assert all("held-out" in t["family"] for t in splits["eval:family_l4"])
    assert not any("held-out" in t["family"] for t in splits["eval:test_l4"])


def test_demonstrated_levels_are_the_old_jobs_demos() -> None:
    """Adding a level RL alone trains does not change the demonstrations of the others (per-level streams)."""
    _, _, with_l4 = check_job(parse_train_config(CONFIG))
    old = {**CONFIG, "dataset": {"name": "calc", "levels": [1, 2, 3]}, "warm_start": {"demos": 24}}
    _, _, without = check_job(parse_train_config(old))
    assert with_l4["demos"][:24] == without["train"][:24]


def test_weighted_train_levels_give_each_step_its_share() -> None:
    from spanlab.jobs.job import Job

    config = parse_train_config(CONFIG)
    _, _, splits = check_job(config)
    job = Job.__new__(Job)  # task_draws reads only the config and the rl split
    job.config, job.splits = config, splits
    draws = list(itertools.islice(job.task_draws(8), 5))
    assert all(sorted(t["level"] for t in d) == [2, 2, 3, 3, 4, 4, 4, 4] for d in draws)
    assert all(len({t["task_id"] for t in d}) == 8 for d in draws)
    assert draws != [draws[0]] * 5  # each step draws anew
    again = Job.__new__(Job)
    again.config, again.splits = config, splits
    assert list(itertools.islice(again.task_draws(8), 5)) == draws  # seeded: --resume replays them


@pytest.mark.parametrize(("weights", "n", "expected"), [
    ({2: 1, 3: 1, 4: 2}, 16, {2: 4, 3: 4, 4: 8}),
    ({2: 1, 3: 1, 4: 1}, 16, {2: 5, 3: 5, 4: 6}),
    ({1: 0.1, 4: 0.9}, 3, {1: 0, 4: 3}),
])
def test_level_quota_adds_up(weights: dict[int, float], n: int, expected: dict[int, int]) -> None:
    assert level_quota(weights, n) == expected


@pytest.mark.parametrize(("change", "error"), [
    ({"warm_start": {"demos": 8, "levels": [5]}}, r"warm_start\.levels \[5\] must be a subset"),
    ({"dataset": {"name": "calc", "levels": [1, 2], "train_levels": {2: 0}}}, r"every weight must be a positive"),
    ({"dataset": {"name": "calc", "levels": [1, 2], "train_levels": {3: 1}}}, r"must be a subset of levels"),
    ({"eval": {"extra_splits": [{"name": "test", "split": "family"}]}}, r"'test' is the train split, the headline"),
    ({"eval": {"extra_splits": [{"name": "Bad Name", "split": "family"}]}}, r"eval\.extra_splits.*name"),
    ({"eval": {"curve": {"splits": ["nope"]}}}, r"curve\.splits: 'nope' is not an eval split"),
    ({"eval": {"extra_splits": [{"name": "x", "split": "nope"}]}}, r"eval\.extra_splits: task set 'calc': split"),
])
def test_bad_split_settings_are_one_line_errors(tmp_path: Path, change: dict, error: str) -> None:
    import yaml

    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump({**CONFIG, **change, "db": str(tmp_path / "r.duckdb"),
                                    "out_dir": str(tmp_path / "runs")}))
    result = CliRunner().invoke(app, ["train", str(path), "--check"])
    assert result.exit_code == 2, result.output
    assert re.search(error, " ".join(result.output.split())), result.output
    assert "Traceback" not in result.output



def test_dynamic_sampling_samples_new_tasks_until_enough_groups_have_a_signal() -> None:
    """DAPO's dynamic sampling in the sync loop: rounds of new tasks (never one the step asked already) while fewer
    than min_groups groups have reward variance, at most max_rounds of them; the batch holds every round."""
    from spanlab.algos.grpo.loop import _collect, groups_with_signal
    from spanlab.jobs.job import Job
    from spanlab.jobs.rollouts import RolloutBatch

    config = parse_train_config({**CONFIG, "grpo": {"steps": 1, "tasks_per_step": 4, "group_size": 2,
                                                    "dynamic_sampling": {"min_groups": 3, "max_rounds": 2}}})
    _, _, splits = check_job(config)
    asked: list[tuple[list[str], dict]] = []

    def collect(tasks: list[dict], *, group_size: int, **metadata: object) -> RolloutBatch:
        """Level-4 groups split (one right, one wrong); the others all right: one signal per level-4 task."""
        asked.append(([t["task_id"] for t in tasks], metadata))
        rewards = [r for t in tasks for r in ([1.0, 0.0] if t["level"] == 4 else [1.0, 1.0])]
        return RolloutBatch([f"r{len(asked)}-{i}" for i in range(len(rewards))], rewards, 1.0, 0)

    job = Job.__new__(Job)  # the task stream's draws read only the config and the rl split
    job.config, job.splits = config, splits
    first = next(job.task_draws(4))  # 1 x level 2, 1 x level 3, 2 x level 4: two groups with a signal
    batch = _collect(config.section, config.dataset.seed, collect, job.draw, first, 0)
    assert [m for _, m in asked] == [{"step": 0}, {"step": 0, "round": 1}]  # one more round gave 4 signals
    assert len({i for ids, _ in asked for i in ids}) == 8  # no task asked twice in a step
    assert len(batch.rollout_ids) == 16 and groups_with_signal(batch.rewards, 2) == 4 and batch.seconds == 2.0

    asked.clear()
    strict = config.section.model_copy(update={"dynamic_sampling": config.section.dynamic_sampling.model_copy(
        update={"min_groups": 100})})
    assert len(_collect(strict, config.dataset.seed, collect, job.draw, first, 1).rollout_ids) == 24
    assert len(asked) == 3  # capped at max_rounds
