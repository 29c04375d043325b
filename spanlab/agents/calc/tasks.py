"""Arithmetic word problems for the calculator agent, generated from a seed.

Three levels: 1 = a bare operation ("What is 47 + 38?", with + - *), 2 = a one-step word problem
(+ - * or an exact division), 3 = a two-step word problem (two operations, solvable with one
calculator expression such as ``23 + 4 * 6`` or two calls). Each task also carries the expression
that solves it, which the demonstrations (``demos.py``) use as the calculator call.

Splits are disjoint by construction: a question belongs to ``train``/``val``/``test`` by a stable
hash of its text (80/10/10), whatever seed generated it, so no seed can leak a test question into
training. ``make_tasks`` draws questions from a seeded stream and keeps those of the asked split,
so it is deterministic for ``(split, n, seed, levels)``, and a larger ``n`` extends a smaller one.
All numbers stay small (answers below 10,000), so every answer is a plain int.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Sequence
from typing import Literal, TypedDict

from spanlab.agents.task_args import check_task_args

Split = Literal["train", "val", "test"]
SPLITS: tuple[Split, ...] = ("train", "val", "test")
LEVELS = (1, 2, 3)
_SPLIT_BUCKETS: dict[Split, range] = {"train": range(0, 80), "val": range(80, 90), "test": range(90, 100)}
_MAX_DRAWS_PER_TASK = 400

NAMES = ("Sam", "Ana", "Lee", "Maya", "Omar", "Lina", "Tom", "Zoe", "Ravi", "Ivy", "Ben", "Nora")
ITEMS = ("apples", "pencils", "stickers", "marbles", "cookies", "books", "cards", "shells", "coins", "stamps")
CONTAINERS = ("boxes", "bags", "packs", "jars", "baskets", "crates")


class CalcTask(TypedDict):
    task_id: str
    question: str
    answer: int
    level: int
    split: str
    expression: str  # a calculator expression whose value is the answer


Problem = tuple[str, str, int]  # question, expression, answer


def split_of(question: str) -> Split:
    """The split a question belongs to, from a hash of its text (never from the seed)."""
    bucket = int.from_bytes(hashlib.sha256(question.encode()).digest()[:8], "big") % 100
    return next(s for s, r in _SPLIT_BUCKETS.items() if bucket in r)


def _level1(rng: random.Random) -> Problem:
    op = rng.choice("+-*")
    if op == "*":
        a, b = rng.randint(2, 20), rng.randint(2, 20)
        return f"What is {a} * {b}?", f"{a} * {b}", a * b
    a, b = rng.randint(2, 99), rng.randint(2, 99)
    if op == "-":
        a, b = max(a, b), min(a, b)
        return f"What is {a} - {b}?", f"{a} - {b}", a - b
    return f"What is {a} + {b}?", f"{a} + {b}", a + b


def _level2(rng: random.Random) -> Problem:
    name, item, box = rng.choice(NAMES), rng.choice(ITEMS), rng.choice(CONTAINERS)
    kind = rng.choice(("add", "sub", "mul", "div"))
    if kind == "add":
        a, b = rng.randint(5, 90), rng.randint(5, 90)
        return f"{name} has {a} {item} and gets {b} more. How many {item} does {name} have now?", f"{a} + {b}", a + b
    if kind == "sub":
        a = rng.randint(20, 99)
        b = rng.randint(2, a - 1)
        return f"{name} has {a} {item} and gives away {b}. How many {item} are left?", f"{a} - {b}", a - b
    a, b = rng.randint(2, 12), rng.randint(2, 15)
    if kind == "mul":
        return f"There are {a} {box} with {b} {item} in each. How many {item} are there?", f"{a} * {b}", a * b
    return (
        f"{name} shares {a * b} {item} equally among {a} friends. How many {item} does each friend get?",
        f"{a * b} / {a}",
        b,
    )


def _level3(rng: random.Random) -> Problem:
    name, item, box = rng.choice(NAMES), rng.choice(ITEMS), rng.choice(CONTAINERS)
    kind = rng.choice(("add_mul", "mul_sub", "sub_sub", "sum_mul"))
    if kind == "add_mul":
        a, b, c = rng.randint(5, 60), rng.randint(2, 9), rng.randint(2, 12)
        return (
            f"{name} has {a} {item} and buys {b} {box} with {c} {item} in each. How many {item} does {name} have now?",
            f"{a} + {b} * {c}",
            a + b * c,
        )
    if kind == "mul_sub":
        b, c = rng.randint(2, 9), rng.randint(3, 12)
        a = rng.randint(1, b * c - 1)
        return (
            f"{name} has {b} {box} with {c} {item} in each and gives away {a} {item}. How many {item} are left?",
            f"{b} * {c} - {a}",
            b * c - a,
        )
    if kind == "sub_sub":
        a = rng.randint(30, 99)
        b = rng.randint(2, a // 2)
        c = rng.randint(1, a - b - 1)
        return (
            f"{name} has {a} {item}, gives {b} to a friend and then loses {c}. How many {item} are left?",
            f"{a} - {b} - {c}",
            a - b - c,
        )
    a, b, c = rng.randint(2, 12), rng.randint(2, 9), rng.randint(2, 9)
    other = rng.choice([n for n in NAMES if n != name])
    return (
        f"One pack of {item} costs {a} dollars. {name} buys {b} packs and {other} buys {c} packs. How many "
        f"dollars do they pay in total?",
        f"({b} + {c}) * {a}",
        (b + c) * a,
    )


GENERATORS: dict[int, Callable[[random.Random], Problem]] = {1: _level1, 2: _level2, 3: _level3}


def task_id(question: str) -> str:
    """Stable across seeds and runs: the same question always has the same id."""
    return "calc-" + hashlib.sha256(question.encode()).hexdigest()[:12]


def make_tasks(split: Split, n: int, seed: int = 0, levels: Sequence[int] = LEVELS) -> list[CalcTask]:
    """``n`` distinct tasks of ``split``, levels interleaved round-robin (``n // len(levels)`` or one more each)."""
    check_task_args(split, n, levels, GENERATORS)
    rngs = {lv: random.Random(f"spanlab-calc:{seed}:{lv}") for lv in levels}
    seen: set[str] = set()
    tasks: list[CalcTask] = []
    for i in range(n):
        level = levels[i % len(levels)]
        for _ in range(_MAX_DRAWS_PER_TASK):
            question, expression, answer = GENERATORS[level](rngs[level])
            if question not in seen and split_of(question) == split:
                break
        else:
            raise ValueError(f"cannot draw {n} distinct level-{level} {split} tasks (question space exhausted)")
        seen.add(question)
        tasks.append(
            CalcTask(
                task_id=task_id(question),
                question=question,
                answer=answer,
                level=level,
                split=split,
                expression=expression,
            )
        )
    return tasks
