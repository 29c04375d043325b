"""Arithmetic word problems for the calculator agent, generated from a seed.

Levels: 1 = a bare operation ("What is 47 + 38?", with + - *), 2 = a one-step word problem (+ - * or
an exact division), 3 = two operations (solvable with one calculator expression such as
``23 + 4 * 6``), 4 and 5 = three and four operations. Each task carries the expression that solves
it, which the demonstrations (``demos.py``) use as the calculator call. Wordings live in
``phrasings.py``: ``phrasings="original"`` words every problem as the tutorial always did (one
template per kind), ``"all"`` uses every training template of the kind, in turn (stratified: the first
``n`` tasks of a level cover its templates and kinds as evenly as ``n`` allows, see ``templates_of``), each
with its choices of verbs and question forms drawn per question.

Splits. ``train``/``val``/``test`` are held out *by question*: a question belongs to one by a stable
hash of its text (80/10/10), whatever seed generated it, so no seed can leak a test question into
training. Two more splits are held out by what a question is like, which a model cannot pass by
memorizing templates: ``family`` words the asked levels' problems with templates no other split uses,
and ``depth`` asks problems one level deeper than any asked level (one more operation than any training
problem). ``sealed`` words levels 1-3 with templates written by another hand from a spec alone
(``sealed.py``): the check of a recipe chosen on the others. ``make_tasks`` draws questions from a seeded
stream and keeps those of the asked split, so it is deterministic for its arguments, and a larger ``n``
extends a smaller one. Answers stay below 10,000.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Sequence
from typing import Literal, TypedDict

from spanlab.agents.calc.phrasings import HELD_OUT, TRAIN, choose_variant, first_variant
from spanlab.agents.calc.sealed import sealed_templates
from spanlab.agents.task_args import check_task_args

Split = Literal["train", "val", "test", "family", "depth", "sealed"]
SPLITS: tuple[Split, ...] = ("train", "val", "test", "family", "depth", "sealed")
SEALED_LEVELS = (1, 2, 3)  # the levels the sealed wordings cover
Phrasings = Literal["original", "all"]
LEVELS = (1, 2, 3)  # the default levels; 4 and 5 exist for deeper training and the depth split
ALL_LEVELS = (1, 2, 3, 4, 5)
_SPLIT_BUCKETS: dict[str, range] = {"train": range(0, 80), "val": range(80, 90), "test": range(90, 100)}
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
    family: str  # the phrasing template: "<kind>/<index>" (index into TRAIN[kind], or "held-out/<i>")


Slots = dict[str, int | str]
Drawn = tuple[Slots, str, int]  # slots for the template, the expression, the answer
Draw = Callable[[random.Random, Slots], Drawn]


def split_of(question: str) -> Literal["train", "val", "test"]:
    """The question-held-out split a question belongs to, from a hash of its text (never from the seed)."""
    bucket = int.from_bytes(hashlib.sha256(question.encode()).digest()[:8], "big") % 100
    return next(s for s, r in _SPLIT_BUCKETS.items() if bucket in r)  # type: ignore[return-value]


# --- the problems: numbers, expression, answer. The draw order of levels 1-3 is the tutorial's since its
# first version, so "original" phrasings give the same questions for the same seed.
def _l1_add(rng: random.Random, s: Slots) -> Drawn:
    a, b = rng.randint(2, 99), rng.randint(2, 99)
    return {"a": a, "b": b}, f"{a} + {b}", a + b


def _l1_sub(rng: random.Random, s: Slots) -> Drawn:
    a, b = rng.randint(2, 99), rng.randint(2, 99)
    a, b = max(a, b), min(a, b)
    return {"a": a, "b": b}, f"{a} - {b}", a - b


def _l1_mul(rng: random.Random, s: Slots) -> Drawn:
    a, b = rng.randint(2, 20), rng.randint(2, 20)
    return {"a": a, "b": b}, f"{a} * {b}", a * b


def _l2_add(rng: random.Random, s: Slots) -> Drawn:
    a, b = rng.randint(5, 90), rng.randint(5, 90)
    return {"a": a, "b": b}, f"{a} + {b}", a + b


def _l2_sub(rng: random.Random, s: Slots) -> Drawn:
    a = rng.randint(20, 99)
    b = rng.randint(2, a - 1)
    return {"a": a, "b": b}, f"{a} - {b}", a - b


def _l2_mul(rng: random.Random, s: Slots) -> Drawn:
    a, b = rng.randint(2, 12), rng.randint(2, 15)
    return {"a": a, "b": b}, f"{a} * {b}", a * b


def _l2_div(rng: random.Random, s: Slots) -> Drawn:
    a, b = rng.randint(2, 12), rng.randint(2, 15)
    return {"a": a, "b": b, "ab": a * b}, f"{a * b} / {a}", b


def _l3_add_mul(rng: random.Random, s: Slots) -> Drawn:
    a, b, c = rng.randint(5, 60), rng.randint(2, 9), rng.randint(2, 12)
    return {"a": a, "b": b, "c": c}, f"{a} + {b} * {c}", a + b * c


def _l3_mul_sub(rng: random.Random, s: Slots) -> Drawn:
    b, c = rng.randint(2, 9), rng.randint(3, 12)
    a = rng.randint(1, b * c - 1)
    return {"a": a, "b": b, "c": c}, f"{b} * {c} - {a}", b * c - a


def _l3_sub_sub(rng: random.Random, s: Slots) -> Drawn:
    a = rng.randint(30, 99)
    b = rng.randint(2, a // 2)
    c = rng.randint(1, a - b - 1)
    return {"a": a, "b": b, "c": c}, f"{a} - {b} - {c}", a - b - c


def _l3_sum_mul(rng: random.Random, s: Slots) -> Drawn:
    a, b, c = rng.randint(2, 12), rng.randint(2, 9), rng.randint(2, 9)
    other = rng.choice([n for n in NAMES if n != s["name"]])
    return {"a": a, "b": b, "c": c, "other": other}, f"({b} + {c}) * {a}", (b + c) * a


def _l4_add_mul_sub(rng: random.Random, s: Slots) -> Drawn:
    a, b, c = rng.randint(5, 60), rng.randint(2, 9), rng.randint(2, 12)
    d = rng.randint(1, a + b * c - 1)
    return {"a": a, "b": b, "c": c, "d": d}, f"{a} + {b} * {c} - {d}", a + b * c - d


def _l4_mul_add_mul(rng: random.Random, s: Slots) -> Drawn:
    b, c, d, e = rng.randint(2, 9), rng.randint(2, 12), rng.randint(2, 9), rng.randint(2, 12)
    return {"b": b, "c": c, "d": d, "e": e}, f"{b} * {c} + {d} * {e}", b * c + d * e


def _l4_sum_mul_sub(rng: random.Random, s: Slots) -> Drawn:
    a, b, c = rng.randint(2, 12), rng.randint(2, 9), rng.randint(2, 9)
    d = rng.randint(1, (b + c) * a - 1)
    return {"a": a, "b": b, "c": c, "d": d}, f"({b} + {c}) * {a} - {d}", (b + c) * a - d


def _l4_sub_sub_sub(rng: random.Random, s: Slots) -> Drawn:
    a = rng.randint(40, 99)
    b = rng.randint(2, a // 3)
    c = rng.randint(1, a // 3)
    d = rng.randint(1, a - b - c - 1)
    return {"a": a, "b": b, "c": c, "d": d}, f"{a} - {b} - {c} - {d}", a - b - c - d


def _l5_mul_add_mul_sub(rng: random.Random, s: Slots) -> Drawn:
    slots, expression, total = _l4_mul_add_mul(rng, s)
    a = rng.randint(1, total - 1)
    return {**slots, "a": a}, f"{expression} - {a}", total - a


def _l5_add_mul_sub_sub(rng: random.Random, s: Slots) -> Drawn:
    slots, expression, total = _l4_add_mul_sub(rng, s)
    e = rng.randint(1, max(1, total - 1))
    return {**slots, "e": e}, f"{expression} - {e}", total - e


KINDS: dict[int, dict[str, Draw]] = {
    1: {"l1_add": _l1_add, "l1_sub": _l1_sub, "l1_mul": _l1_mul},
    2: {"l2_add": _l2_add, "l2_sub": _l2_sub, "l2_mul": _l2_mul, "l2_div": _l2_div},
    3: {"l3_add_mul": _l3_add_mul, "l3_mul_sub": _l3_mul_sub, "l3_sub_sub": _l3_sub_sub, "l3_sum_mul": _l3_sum_mul},
    4: {"l4_add_mul_sub": _l4_add_mul_sub, "l4_mul_add_mul": _l4_mul_add_mul, "l4_sum_mul_sub": _l4_sum_mul_sub,
        "l4_sub_sub_sub": _l4_sub_sub_sub},
    5: {"l5_mul_add_mul_sub": _l5_mul_add_mul_sub, "l5_add_mul_sub_sub": _l5_add_mul_sub_sub},
}


def _people(rng: random.Random) -> Slots:
    name, item, box = rng.choice(NAMES), rng.choice(ITEMS), rng.choice(CONTAINERS)
    # "other" is the next name, not a draw: a draw here would change the tutorial's question stream.
    return {"name": name, "item": item, "box": box, "other": NAMES[(NAMES.index(name) + 1) % len(NAMES)]}


def templates_of(level: int) -> list[tuple[str, int]]:
    """Every training template of ``level`` as ``(kind, index)``, kinds interleaved: the order ``phrasings="all"``
    cycles through, so any ``len(templates_of(level))`` consecutive tasks of a level use each template once."""
    kinds = tuple(KINDS[level])
    return [(k, i) for i in range(max(len(TRAIN[k]) for k in kinds)) for k in kinds if i < len(TRAIN[k])]


def _draw(rng: random.Random, level: int, split: Split, phrasings: Phrasings,
          template: tuple[str, int] | None = None) -> tuple[str, str, int, str]:
    """One problem of ``level`` worded for ``split``: question, expression, answer, family (``template``: this
    kind and training template, not a random one)."""
    slots = _people(rng) if level > 1 else {}
    kind = template[0] if template is not None else rng.choice(tuple(KINDS[level]))
    numbers, expression, answer = KINDS[level][kind](rng, slots)
    slots = {**slots, **numbers}
    if split == "family":
        index = rng.randrange(len(HELD_OUT[kind]))
        return HELD_OUT[kind][index].format(**slots), expression, answer, f"{kind}/held-out/{index}"
    if split == "sealed":
        templates = sealed_templates()[kind]
        index = rng.randrange(len(templates))
        return templates[index].format(**slots), expression, answer, f"{kind}/sealed/{index}"
    if phrasings == "original" and split != "depth":
        return first_variant(TRAIN[kind][0]).format(**slots), expression, answer, f"{kind}/0"
    index = template[1] if template is not None else rng.randrange(len(TRAIN[kind]))
    return choose_variant(TRAIN[kind][index], rng).format(**slots), expression, answer, f"{kind}/{index}"


def task_id(question: str) -> str:
    """Stable across seeds and runs: the same question always has the same id."""
    return "calc-" + hashlib.sha256(question.encode()).hexdigest()[:12]


def make_tasks(
    split: Split, n: int, seed: int = 0, levels: Sequence[int] = LEVELS, phrasings: Phrasings = "original"
) -> list[CalcTask]:
    """``n`` distinct tasks of ``split``, levels interleaved round-robin (``n // len(levels)`` or one more each).

    ``depth`` asks level ``max(levels) + 1`` whatever ``levels`` holds; ``family`` and ``sealed`` ask ``levels``
    (``sealed``: of levels 1-3 only).
    """
    check_task_args(split, n, levels, KINDS, splits=SPLITS)
    if phrasings not in ("original", "all"):
        raise ValueError(f"phrasings must be 'original' or 'all', got {phrasings!r}")
    if split == "depth":
        if max(levels) + 1 not in KINDS:
            raise ValueError(f"no depth split beyond level {max(levels)} (levels go up to {max(KINDS)})")
        levels = (max(levels) + 1,)
    if split == "sealed" and (beyond := sorted(set(levels) - set(SEALED_LEVELS))):
        raise ValueError(f"the sealed split words levels {list(SEALED_LEVELS)} only, not {beyond}")
    stream = split if split in ("depth", "family", "sealed") else ""
    rngs = {lv: random.Random(f"spanlab-calc:{seed}:{lv}{stream}") for lv in levels}
    # "all" on a split held out by question cycles through the level's templates (stratified: a warm start on the
    # first n train tasks sees every template and kind as evenly as n allows); the others draw them at random.
    cycle = {lv: templates_of(lv) for lv in levels} if phrasings == "all" and split in _SPLIT_BUCKETS else None
    seen: set[str] = set()
    tasks: list[CalcTask] = []
    for i in range(n):
        level = levels[i % len(levels)]
        template = cycle[level][(i // len(levels)) % len(cycle[level])] if cycle is not None else None
        for _ in range(_MAX_DRAWS_PER_TASK):
            question, expression, answer, family = _draw(rngs[level], level, split, phrasings, template)
            held_out_by_question = split in _SPLIT_BUCKETS
            if question not in seen and (not held_out_by_question or split_of(question) == split):
                break
        else:
            raise ValueError(f"cannot draw {n} distinct level-{level} {split} tasks (question space exhausted)")
        seen.add(question)
        tasks.append(CalcTask(task_id=task_id(question), question=question, answer=answer, level=level,
                              split=split, expression=expression, family=family))
    return tasks
