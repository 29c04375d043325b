"""The generated arithmetic tasks: deterministic per seed, disjoint splits, correct answers."""

from __future__ import annotations

import json

import pytest

from spanlab.agents.calc.mcp_server import evaluate
from spanlab.agents.calc.tasks import SPLITS, make_tasks, split_of


def test_same_seed_same_tasks_other_seed_other_tasks() -> None:
    assert make_tasks("train", 30, seed=3) == make_tasks("train", 30, seed=3)
    assert make_tasks("train", 30, seed=3) != make_tasks("train", 30, seed=4)
    assert make_tasks("val", 40, seed=1)[:20] == make_tasks("val", 20, seed=1), "a larger n extends a smaller one"


def test_tasks_are_json_and_well_formed() -> None:
    tasks = make_tasks("test", 60, seed=0)
    assert json.loads(json.dumps(tasks)) == tasks
    assert [t["level"] for t in tasks[:6]] == [1, 2, 3, 1, 2, 3]
    for t in tasks:
        assert {"task_id", "question", "answer", "level", "split"} <= t.keys()
        assert t["split"] == "test" and type(t["answer"]) is int and 0 <= t["answer"] < 10_000
        assert t["task_id"].startswith("calc-")
    assert len({t["question"] for t in tasks}) == len({t["task_id"] for t in tasks}) == 60


def test_answers_are_correct() -> None:
    """The answer is the value of the expression, and the expression uses the question's numbers."""
    for t in make_tasks("train", 300, seed=7):
        assert evaluate(t["expression"]) == str(t["answer"])
        numbers = [tok.strip("()") for tok in t["expression"].split() if tok.strip("()").isdigit()]
        assert all(n in t["question"] for n in numbers), t


@pytest.mark.parametrize("level", [1, 2, 3])
def test_levels(level: int) -> None:
    tasks = make_tasks("train", 20, seed=0, levels=[level])
    assert {t["level"] for t in tasks} == {level}
    ops = [sum(t["expression"].count(op) for op in "+-*/") for t in tasks]
    if level == 1:
        assert all(t["question"].startswith("What is ") for t in tasks) and set(ops) == {1}
    else:
        assert not any(t["question"].startswith("What is ") for t in tasks)
        assert set(ops) == ({1} if level == 2 else {2})


def test_splits_never_share_a_question_whatever_the_seed() -> None:
    questions = {s: {t["question"] for seed in (0, 1, 2) for t in make_tasks(s, 150, seed=seed)} for s in SPLITS}
    assert not questions["train"] & questions["val"]
    assert not questions["train"] & questions["test"]
    assert not questions["val"] & questions["test"]
    assert all(split_of(q) == s for s, qs in questions.items() for q in qs)


def test_bad_arguments_are_rejected() -> None:
    with pytest.raises(ValueError, match="split"):
        make_tasks("dev", 3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="levels"):
        make_tasks("train", 3, levels=[4])
    assert make_tasks("train", 0) == []
