"""The reward of a reasoning_gym task: the family's own ``score_answer`` on the item it generated.

The item is generated again from the task (family, settings, seed, size, index), so ``score_answer`` sees the
entry with the types its family made (a JSON round trip turns the arc families' tuples into lists, and their
score drops). Where the regenerated question is not the task's (the hash-seeded families in another process,
:data:`~spanlab.tasksets.reasoning_gym.tasks.HASH_SEEDED`), the entry stored in the task is scored instead, and
:class:`Score` says so. A scorer that raises on an answer scores 0.0, with the error in the score.
"""

from __future__ import annotations

import functools
import json
from typing import Any, Literal, TypedDict

from spanlab.errors import one_line
from spanlab.tasksets.reasoning_gym.families import build_dataset


class Score(TypedDict):
    reward: float
    family: str
    level: int
    settings: dict[str, Any]
    expected: str  # the family's reference answer
    entry: Literal["regenerated", "stored"]  # which entry score_answer read
    error: str | None  # what score_answer raised (reward 0.0)


@functools.lru_cache(maxsize=64)
def _dataset(family: str, settings_json: str, seed: int, size: int) -> Any:
    return build_dataset(family, json.loads(settings_json), seed, size, f"task {family}")


def _entry(task: dict[str, Any]) -> tuple[Any, dict[str, Any], Literal["regenerated", "stored"]]:
    dataset = _dataset(task["family"], json.dumps(task["settings"], sort_keys=True), task["seed"], task["size"])
    entry = dataset[task["index"]]
    if entry["question"] == task["question"]:
        return dataset, entry, "regenerated"
    return dataset, task["entry"], "stored"


def score(answer: str | None, task: dict[str, Any]) -> Score:
    """``score_answer(answer, entry)`` of the task's family, with what it scored (for the reward span)."""
    dataset, entry, source = _entry(task)
    error = None
    try:
        reward = float(dataset.score_answer(answer, entry))
    except Exception as exc:  # a family's scorer may choke on an odd answer: that answer earns nothing
        reward, error = 0.0, one_line(exc, 200)
    return Score(reward=reward, family=task["family"], level=task["level"], settings=task["settings"],
                 expected=task["answer"], entry=source, error=error)
