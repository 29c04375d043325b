"""``make_tasks`` of the reasoning_gym task set: questions generated locally by reasoning-gym's families.

Splits come from disjoint seeds: reasoning-gym seeds item ``i`` of a dataset with seed ``s`` by ``s + i``, so each
split owns a block of 2**24 item seeds and each level a sub-block of 2**20 in it (``item_seed``): no two splits of
one ``dataset.seed`` share an item seed, and no two levels of a family repeat one draw. A family with few distinct
questions (chain_sum at level 1) can still draw one question under two seeds: disjoint seeds, not a check of the
text. ``train``, ``val`` and ``test`` draw from ``tasks``; ``held_out`` draws from the ``held_out`` families only,
which no split that trains ever holds. Which family each task comes from is a seeded draw by ``weights``, levels
take turns within a family, so ``make_tasks`` is deterministic for its arguments and a larger ``n`` extends a
smaller one (the tasks' ``size`` aside; acre draws its whole dataset from its size, so its questions change too).
A task carries what scoring needs (:mod:`~spanlab.tasksets.reasoning_gym.scoring`): the family, its settings
(the level's, then ``config``'s), the item's seed, size and index, and the generated entry.

Five families (``HASH_SEEDED``) iterate over sets of strings, so their questions also depend on Python's hash
seed: set ``PYTHONHASHSEED`` for the same questions in every process.
"""

from __future__ import annotations

import json
import logging
import os
import random
from collections.abc import Sequence
from typing import Any, Literal, TypedDict

from pydantic import ValidationError

from spanlab.agents.task_args import check_task_args
from spanlab.config_errors import problem_line
from spanlab.tasksets.reasoning_gym.families import LEVELS, build_dataset, level_settings
from spanlab.tasksets.reasoning_gym.options import ReasoningGymOptions

logger = logging.getLogger(__name__)

Split = Literal["train", "val", "test", "held_out"]
SPLITS: tuple[Split, ...] = ("train", "val", "test", "held_out")
SEED_BLOCK = 2**24  # item seeds per split
LEVEL_BLOCK = 2**20  # item seeds per level within a split: make_tasks refuses an n that would reach the next one
HASH_SEEDED = frozenset({"isomorphic_strings", "knight_swap", "polynomial_multiplication", "ransom_note",
                         "word_ladder"})  # reasoning-gym 0.1.25: questions differ between processes


class ReasoningGymTask(TypedDict):
    task_id: str
    question: str
    answer: str  # the family's reference answer (some families accept others: score_answer decides)
    family: str
    level: int
    settings: dict[str, Any]  # the family's config fields this task was generated with (seed and size aside)
    split: str
    seed: int  # the dataset's seed: the item's own is seed + index
    size: int
    index: int
    entry: dict[str, Any]  # reasoning-gym's item (question, answer, metadata), JSON-safe


def item_seed(seed: int, split: str, level: int) -> int:
    """The first item seed of ``split`` at ``level`` for ``dataset.seed`` (below 2**32, as numpy seeds must be)."""
    block = (seed * len(SPLITS) + SPLITS.index(split)) % (2**32 // SEED_BLOCK)  # type: ignore[arg-type]
    return block * SEED_BLOCK + (level - 1) * LEVEL_BLOCK


def parse_options(kwargs: dict[str, Any]) -> ReasoningGymOptions:
    """The task set's kwargs, checked; ValueError in one line naming the key."""
    try:
        return ReasoningGymOptions.model_validate(kwargs)
    except ValidationError as exc:
        line = problem_line(ReasoningGymOptions, exc.errors()[0])
        raise ValueError(line if line.startswith("dataset.kwargs") else f"dataset.kwargs.{line}") from None


def _schedule(options: ReasoningGymOptions, split: str, n: int, seed: int,
              levels: Sequence[int]) -> list[tuple[str, int, int]]:
    """(family, level, index within that family and level) of each of the ``n`` tasks, in order."""
    weights = options.family_weights if split != "held_out" else dict.fromkeys(options.held_out, 1.0)
    families = list(weights)
    rng = random.Random(f"spanlab-reasoning-gym:{seed}:{split}")
    per_family: dict[str, int] = dict.fromkeys(families, 0)
    per_level: dict[tuple[str, int], int] = {}
    order = []
    for _ in range(n):
        family = rng.choices(families, [weights[f] for f in families])[0]
        level = levels[per_family[family] % len(levels)]
        per_family[family] += 1
        index = per_level.get((family, level), 0)
        per_level[(family, level)] = index + 1
        order.append((family, level, index))
    return order


def make_tasks(split: Split, n: int, seed: int = 0, levels: Sequence[int] = (1,), *, tasks: Sequence[str] = (),
               weights: Sequence[float] | dict[str, float] | None = None,
               config: dict[str, dict[str, Any]] | None = None, held_out: Sequence[str] = ()) -> list[ReasoningGymTask]:
    """``n`` tasks of ``split`` (train, val, test: from ``tasks``; held_out: from ``held_out``) at ``levels``."""
    check_task_args(split, n, levels, LEVELS, SPLITS)
    options = parse_options({"tasks": tasks, "weights": weights, "config": config or {}, "held_out": held_out})
    if split == "held_out" and not options.held_out:
        raise ValueError("split held_out: dataset.kwargs.held_out names no family")
    if n > LEVEL_BLOCK:
        raise ValueError(f"n must be <= {LEVEL_BLOCK} (a level's block of item seeds), got {n}")
    order = _schedule(options, split, n, seed, levels)
    if HASH_SEEDED & {f for f, _, _ in order} and "PYTHONHASHSEED" not in os.environ:
        logger.warning("reasoning_gym: %s also depend on Python's hash seed; set PYTHONHASHSEED for the same "
                       "questions in every process", ", ".join(sorted(HASH_SEEDED & {f for f, _, _ in order})))
    sizes: dict[tuple[str, int], int] = {}
    for family, level, index in order:
        sizes[(family, level)] = max(sizes.get((family, level), 0), index + 1)
    datasets, settings = {}, {}
    for family, level in sizes:
        settings[(family, level)] = level_settings(family, level) | options.config.get(family, {})
        datasets[(family, level)] = build_dataset(family, settings[(family, level)], item_seed(seed, split, level),
                                                  sizes[(family, level)], f"dataset.kwargs.config.{family} (level "
                                                  f"{level})")
    out: list[ReasoningGymTask] = []
    for family, level, index in order:
        entry = datasets[(family, level)][index]
        safe = json.loads(json.dumps({k: entry.get(k) for k in ("question", "answer", "metadata")}, default=str))
        out.append(ReasoningGymTask(
            task_id=f"rg-{family}-l{level}-{split}-{seed}-{index}", question=str(entry["question"]),
            answer=str(entry["answer"]), family=family, level=level, settings=settings[(family, level)], split=split,
            seed=item_seed(seed, split, level), size=sizes[(family, level)], index=index, entry=safe))
    return out
