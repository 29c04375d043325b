"""Spider-like text-to-SQL tasks over spanlab's own small SQLite databases, generated from a seed.

Three levels (``templates.py``): 1 = one table, filter and select ("Which employees were hired in
2015?"), 2 = one table with aggregates, GROUP BY or ORDER BY ... LIMIT, 3 = joins. Every task names
its database (``db``), and carries the question and a gold query; the reward compares execution
results, not SQL text, so any query that returns the gold rows is right.

The question space is enumerated from the databases' real values and each gold query is run while
building it: a template instance whose gold result is empty or only NULLs is dropped, so every task
has a non-trivial answer. Splits are disjoint by construction, as in the calc task set: a question
belongs to ``train``/``val``/``test`` by a stable hash of its database and text (80/10/10), whatever
the seed. ``make_tasks`` then draws from a seeded stream (a template uniformly, then one of its
questions), so it is deterministic for ``(split, n, seed, levels)``, templates with many slot values
do not crowd out the others, and a larger ``n`` extends a smaller one.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from typing import Any, Literal, TypedDict

from spanlab.agents.sql.databases import DATABASE_NAMES, db_path
from spanlab.agents.sql.execution import connect_readonly
from spanlab.agents.sql.templates import TEMPLATES, Template
from spanlab.agents.task_args import check_task_args

Split = Literal["train", "val", "test"]
SPLITS: tuple[Split, ...] = ("train", "val", "test")
LEVELS = (1, 2, 3)
_SPLIT_BUCKETS: dict[Split, range] = {"train": range(0, 80), "val": range(80, 90), "test": range(90, 100)}


class SQLTask(TypedDict):
    task_id: str
    level: int
    db: str
    question: str
    gold_sql: str
    split: str


def split_of(db: str, question: str) -> Split:
    """The split a question belongs to, from a hash of its database and text (never from the seed)."""
    bucket = int.from_bytes(hashlib.sha256(f"{db}\n{question}".encode()).digest()[:8], "big") % 100
    return next(s for s, r in _SPLIT_BUCKETS.items() if bucket in r)


def task_id(db: str, question: str) -> str:
    """Stable across seeds and runs: the same question on the same database always has the same id."""
    return "sql-" + hashlib.sha256(f"{db}\n{question}".encode()).hexdigest()[:12]


def sql_literal(value: Any) -> str:
    """``value`` as an SQL literal (strings quoted, quotes doubled)."""
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    return repr(value)


def _instances(template: Template, conn: Any) -> list[tuple[str, str]]:
    """(question, gold_sql) of every slot filling of ``template`` whose gold result is non-empty."""
    slot_rows = conn.execute(template.slots).fetchall() if template.slots else [()]
    found = []
    for slots in slot_rows:
        gold = template.sql.format(*(sql_literal(v) for v in slots))
        rows = conn.execute(gold).fetchall()
        if rows and any(v is not None for row in rows for v in row):
            found.append((template.question.format(*slots), gold))
    return found


def question_space(levels: Sequence[int] = LEVELS) -> dict[int, list[tuple[Template, list[tuple[str, str]]]]]:
    """Per level, each template with its valid (question, gold_sql) instances, in a fixed order."""
    space: dict[int, list[tuple[Template, list[tuple[str, str]]]]] = {lv: [] for lv in levels}
    seen: set[tuple[str, str]] = set()  # a question two templates can phrase alike is kept once
    for name in DATABASE_NAMES:
        conn = connect_readonly(db_path(name))
        try:
            for template in TEMPLATES:
                if template.db == name and template.level in space:
                    fresh = [(q, s) for q, s in _instances(template, conn) if (name, q) not in seen]
                    seen.update((name, q) for q, _ in fresh)
                    space[template.level].append((template, fresh))
        finally:
            conn.close()
    return space


def make_tasks(split: Split, n: int, seed: int = 0, levels: Sequence[int] = LEVELS) -> list[SQLTask]:
    """``n`` distinct tasks of ``split``, levels interleaved round-robin (``n // len(levels)`` or one more each)."""
    check_task_args(split, n, levels, LEVELS)
    if n == 0:
        return []
    pools = {
        lv: [(t.db, [(q, sql) for q, sql in inst if split_of(t.db, q) == split]) for t, inst in by_template]
        for lv, by_template in question_space(levels).items()
    }
    rngs = {lv: random.Random(f"spanlab-sql:{seed}:{lv}") for lv in levels}
    tasks: list[SQLTask] = []
    for i in range(n):
        level = levels[i % len(levels)]
        open_pools = [(db, qs) for db, qs in pools[level] if qs]
        if not open_pools:
            raise ValueError(f"cannot draw {n} distinct level-{level} {split} tasks (question space exhausted)")
        db, questions = rngs[level].choice(open_pools)
        question, gold = questions.pop(rngs[level].randrange(len(questions)))
        tasks.append(
            SQLTask(task_id=task_id(db, question), level=level, db=db, question=question, gold_sql=gold, split=split)
        )
    return tasks
