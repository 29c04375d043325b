"""The reasoning_gym task set without a model: splits from disjoint seeds, deterministic by seed, levels as the
family's curriculum steps, the reward is the family's own ``score_answer``, and bad families or settings are refused
by ``spanlab train --check`` in one line (the real CLI in-process, reasoning-gym's real generators)."""

from __future__ import annotations

from pathlib import Path

import pytest
import reasoning_gym
from reasoning_gym.factory import create_curriculum
from typer.testing import CliRunner

from spanlab.cli import app
from spanlab.jobs.tasks import load_task_set
from spanlab.tasksets.reasoning_gym import demonstration, make_tasks, score
from spanlab.tasksets.reasoning_gym.families import level_settings
from spanlab.tasksets.reasoning_gym.tasks import LEVEL_BLOCK, SPLITS

KWARGS = {"tasks": ["basic_arithmetic", "spell_backward"], "weights": {"basic_arithmetic": 3, "spell_backward": 1},
          "held_out": ["leg_counting"]}


def test_the_task_set_is_registered_by_name_with_its_demonstrations() -> None:
    task_set = load_task_set("reasoning_gym")
    assert task_set.make_tasks is make_tasks and task_set.demonstration is demonstration


def test_splits_come_from_disjoint_seeds_and_the_held_out_families_are_never_trained() -> None:
    splits = {split: make_tasks(split, 24, seed=3, levels=[2, 3], **KWARGS) for split in SPLITS}
    item_seeds = {split: {t["seed"] + t["index"] for t in tasks} for split, tasks in splits.items()}
    for i, a in enumerate(SPLITS):
        for b in SPLITS[i + 1:]:
            assert not item_seeds[a] & item_seeds[b], (a, b)
    questions = {split: {t["question"] for t in tasks} for split, tasks in splits.items()}
    assert not questions["train"] & (questions["val"] | questions["test"]) and not questions["val"] & questions["test"]
    assert {t["family"] for t in splits["held_out"]} == {"leg_counting"}
    for split in ("train", "val", "test"):
        assert {t["family"] for t in splits[split]} == {"basic_arithmetic", "spell_backward"}
        assert all(t["split"] == split and t["level"] in (2, 3) for t in splits[split])
    assert len({t["task_id"] for ts in splits.values() for t in ts}) == 4 * 24
    train = splits["train"]
    assert sum(t["family"] == "basic_arithmetic" for t in train) > sum(t["family"] == "spell_backward" for t in train)
    assert max(t["index"] for t in train) < LEVEL_BLOCK


def test_tasks_are_deterministic_by_seed_and_a_larger_n_extends_a_smaller_one() -> None:
    first = make_tasks("test", 10, seed=0, levels=[1, 2], **KWARGS)
    assert make_tasks("test", 10, seed=0, levels=[1, 2], **KWARGS) == first
    longer = make_tasks("test", 16, seed=0, levels=[1, 2], **KWARGS)[:10]  # only "size" differs
    assert [{**t, "size": 0} for t in longer] == [{**t, "size": 0} for t in first]
    assert [t["question"] for t in make_tasks("test", 10, seed=1, levels=[1, 2], **KWARGS)] != \
        [t["question"] for t in first]


def test_a_level_is_the_family_curriculum_step_and_config_overrides_it() -> None:
    curriculum = create_curriculum("basic_arithmetic")
    curriculum.set_global_level(2)
    assert level_settings("basic_arithmetic", 3) == {"min_terms": 2, "max_terms": 4, "min_digits": 1,
                                                     "max_digits": 3}
    assert curriculum.get_attr_value("num_terms") == 4 and level_settings("basic_arithmetic", 1)["max_terms"] == 2
    tasks = make_tasks("train", 4, seed=0, levels=[3], tasks=["basic_arithmetic"],
                       config={"basic_arithmetic": {"max_digits": 2}})
    assert all(t["settings"] == {"min_terms": 2, "max_terms": 4, "min_digits": 1, "max_digits": 2} for t in tasks)
    assert level_settings("acre", 2) == {}  # a family without a curriculum: its defaults at every level


def test_the_reward_is_the_family_score_answer_on_the_generated_item() -> None:
    tasks = make_tasks("val", 6, seed=0, levels=[1, 2], tasks=["basic_arithmetic", "spell_backward", "arc_1d"])
    for task in tasks:
        reference = reasoning_gym.create_dataset(task["family"], seed=task["seed"], size=task["size"],
                                                 **task["settings"])
        entry = reference[task["index"]]
        assert entry["question"] == task["question"]
        for answer in (task["answer"], task["answer"] + "0", "", None, task["answer"][:1]):
            graded = score(answer, task)
            assert graded["reward"] == reference.score_answer(answer, entry), (task["task_id"], answer)
            assert (graded["family"], graded["settings"], graded["entry"]) == \
                (task["family"], task["settings"], "regenerated")
        assert score(task["answer"], task)["reward"] == 1.0


def test_a_demonstration_is_the_packaged_prompt_and_the_scored_reference_answer() -> None:
    task = make_tasks("train", 1, seed=0, tasks=["basic_arithmetic"])[0]
    demo = demonstration(task)
    assert [m["role"] for m in demo["messages"]] == ["system", "user", "assistant"]
    assert demo["messages"][1]["content"] == task["question"]
    assert demo["messages"][2]["content"] == f"<answer>{task['answer']}</answer>"
    assert "<answer></answer>" in demo["messages"][0]["content"]
    unscored = make_tasks("train", 1, seed=0, tasks=["rush_hour"])[0]
    with pytest.raises(ValueError, match=r"rush_hour: its reference answer scores 0\.\d+, not 1\.0"):
        demonstration(unscored)


BASE = ("algorithm: grpo\nagent: {name: answer, kwargs: {max_tokens: 32}}\n"
        "grpo: {steps: 1, tasks_per_step: 2, group_size: 2}\n")


def _check(tmp_path: Path, dataset: str) -> tuple[int, str]:
    path = tmp_path / "train.yaml"
    evaluation = "" if "\neval:" in dataset else "\neval: {tasks: 2}"
    path.write_text(BASE + dataset + evaluation + f"\ndb: {tmp_path}/run.duckdb\nout_dir: {tmp_path}/runs\n")
    result = CliRunner().invoke(app, ["train", str(path), "--check"])
    return result.exit_code, result.output


@pytest.mark.parametrize(("kwargs", "expected"), [
    ("{tasks: [chain_sun]}", "unknown reasoning-gym family 'chain_sun'; did you mean chain_sum"),
    ("{tasks: [composite]}", "composite mixes families"),
    ("{tasks: [spell_backward], config: {spell_backward: {data_file: words_we_lack.txt}}}",
     "spell_backward needs data or a package that reasoning-gym does not ship"),
    ("{tasks: [chain_sum], config: {chain_sum: {min_terms: 5, max_terms: 3}}}",
     "chain_sum refuses settings"),
    ("{tasks: [chain_sum], config: {chain_sum: {max_term: 3}}}",
     "dataset.kwargs.config.chain_sum.max_term: chain_sum has no such setting; did you mean max_terms"),
    ("{tasks: [chain_sum], config: {chain_sum: {seed: 3}}}", "set by the task set"),
    ("{tasks: [chain_sum], held_out: [chain_sum]}", "'chain_sum' is also in tasks"),
    ("{tasks: [chain_sum, leg_counting], weights: [1]}", "weights: one positive number per family"),
])
def test_check_refuses_a_bad_family_or_setting_in_one_line(tmp_path: Path, kwargs: str, expected: str) -> None:
    code, output = _check(tmp_path, f"dataset: {{name: reasoning_gym, levels: [1], kwargs: {kwargs}}}")
    lines = output.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in output, output
    assert expected in lines[0], lines[0]


def test_check_accepts_a_config_with_a_held_out_split(tmp_path: Path) -> None:
    code, output = _check(tmp_path, "dataset: {name: reasoning_gym, levels: [1, 2], kwargs: {tasks: [chain_sum], "
                                    "held_out: [leg_counting]}}\neval: {tasks: 2, extra_splits: [held_out]}")
    assert code == 0, output
