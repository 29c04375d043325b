"""The SQL task set: deterministic, disjoint splits, every gold query runs on the real database and returns rows."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest

from spanlab.agents.sql import make_tasks
from spanlab.agents.sql.databases import DATABASE_NAMES, database, db_path, schema_text
from spanlab.agents.sql.execution import connect_readonly, run_sql
from spanlab.agents.sql.tasks import LEVELS, SPLITS, question_space, split_of, task_id
from spanlab.jobs.tasks import load_task_set
from spanlab.runner.agent import REGISTERED_AGENTS

_JOIN = re.compile(r"\bJOIN\b")
_AGGREGATE = re.compile(r"\b(COUNT|SUM|AVG|MAX|MIN)\(|\bGROUP BY\b|\bORDER BY\b")


def test_same_arguments_same_tasks_and_larger_n_extends() -> None:
    a = make_tasks("train", 30, seed=3)
    assert a == make_tasks("train", 30, seed=3)
    assert make_tasks("train", 45, seed=3)[:30] == a
    assert make_tasks("train", 30, seed=4) != a
    assert json.loads(json.dumps(a)) == a
    assert set(a[0]) == {"task_id", "level", "db", "question", "gold_sql", "split"}


def test_splits_are_disjoint_whatever_the_seed() -> None:
    keys = {split: set() for split in SPLITS}
    for split in SPLITS:
        for seed in (0, 1):
            for task in make_tasks(split, 90 if split != "train" else 300, seed=seed):
                assert task["split"] == split == split_of(task["db"], task["question"])
                keys[split].add((task["db"], task["question"]))
    assert not keys["train"] & keys["val"] and not keys["train"] & keys["test"] and not keys["val"] & keys["test"]


def test_every_gold_query_runs_and_returns_rows() -> None:
    tasks = [t for split in SPLITS for t in make_tasks(split, 120 if split != "train" else 240, seed=0)]
    assert len({t["task_id"] for t in tasks}) == len(tasks) == 480
    for task in tasks:
        assert task["task_id"] == task_id(task["db"], task["question"])
        result = run_sql(task["db"], task["gold_sql"])
        assert result.ok and result.rows and not result.truncated, (task, result.error)
        assert any(v is not None for row in result.rows for v in row), task


def test_levels_mean_what_they_say() -> None:
    tasks = make_tasks("val", 60, seed=0)
    assert [t["level"] for t in tasks] == [1, 2, 3] * 20
    assert {t["db"] for t in tasks} == set(DATABASE_NAMES)
    for task in tasks:
        sql = task["gold_sql"]
        joined, aggregated = bool(_JOIN.search(sql)), bool(_AGGREGATE.search(sql))
        expected = {1: (False, False), 2: (False, True), 3: (True, aggregated)}[task["level"]]
        assert (joined, aggregated) == expected, task
    assert {t["level"] for t in make_tasks("test", 10, levels=[3])} == {3}


def test_question_space_has_hundreds_per_level() -> None:
    for level, by_template in question_space().items():
        questions = [(t.db, q) for t, instances in by_template for q, _ in instances]
        assert len(questions) == len(set(questions)) >= 500, level
        assert all(instances for _, instances in by_template), "every template yields questions"
        val = [k for k in questions if split_of(*k) == "val"]
        assert len(val) >= 40, level


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"split": "dev", "n": 1}, "split"),
        ({"split": "val", "n": -1}, "n must be"),
        ({"split": "val", "n": 1, "levels": [4]}, "levels"),
        ({"split": "val", "n": 1, "levels": []}, "levels"),
        ({"split": "test", "n": 1000, "levels": [2]}, "exhausted"),
    ],
)
def test_bad_arguments(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make_tasks(**kwargs)


def test_databases_are_deterministic_and_sort_keys_are_distinct(tmp_path: Path) -> None:
    for name in DATABASE_NAMES:
        assert database(name) == database(name)
        path = db_path(name, root=tmp_path)
        assert path.read_bytes() == db_path(name, root=tmp_path).read_bytes()
        assert db_path(name, root=tmp_path) == path and len(list(tmp_path.glob(f"{name}-*"))) == 1
        for table in database(name).tables:
            assert 6 <= len(table.rows) <= 40
            assert f"CREATE TABLE {table.name} (" in schema_text(name)
    conn = connect_readonly(db_path("company", root=tmp_path))
    for table, column in [("employees", "salary"), ("employees", "name")]:
        assert conn.execute(f"SELECT COUNT(*) = COUNT(DISTINCT {column}) FROM {table}").fetchone() == (1,)
    conn.close()
    for name, table, column in [("shop", "products", "price"), ("library", "books", "pages"),
                                ("school", "enrollments", "score")]:  # fmt: skip
        assert run_sql(name, f"SELECT COUNT(*) = COUNT(DISTINCT {column}) FROM {table}").rows == [(1,)]
    with pytest.raises(ValueError, match="unknown SQL database"):
        database("nope")


def test_registered_as_agent_and_task_set() -> None:
    assert REGISTERED_AGENTS["sql"] == "spanlab.agents.sql:SQLAgent"
    task_set = load_task_set("sql")
    assert task_set.make_tasks("val", 3) == make_tasks("val", 3) and task_set.demonstration is not None
    assert LEVELS == (1, 2, 3)


def test_ninety_and_more_held_out_tasks_at_the_policies_levels() -> None:
    """Issue 55 evaluates the policies on >= 90 held-out tasks at levels 1-3 (tutorials/sql/policies.yaml): the
    test split holds 150 distinct ones, each level a third, and no test question is a training question."""
    test = make_tasks("test", 150, seed=0, levels=(1, 2, 3))
    keys = {(t["db"], t["question"]) for t in test}
    assert len(keys) == 150 and [t["level"] for t in test] == [1, 2, 3] * 50
    train = {(t.db, q) for by_template in question_space().values() for t, instances in by_template
             for q, _ in instances if split_of(t.db, q) == "train"}
    assert len(train) >= 1500 and not keys & train
    assert make_tasks("test", 90, seed=0) == test[:90]  # the first 90 of them: a larger eval extends a smaller


def test_the_levels_tasks_are_pinned() -> None:
    """Runs evaluated before are compared with runs evaluated after: the tasks of levels 1-3 must not change."""
    tasks = [make_tasks(s, n, 0, (1, 2, 3)) for s, n in (("train", 240), ("val", 90), ("test", 150))]
    digest = hashlib.sha256(json.dumps(tasks, sort_keys=True).encode()).hexdigest()
    assert digest == "16c98cedf912f8ce09b44191f1e2f49f14983845e76c222df53c4565e8a4f39b"
