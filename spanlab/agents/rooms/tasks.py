"""Booking requests for the room selector, with the right room computed from the seeded building.

Three levels: 1 = people + time slot, 2 = plus one or two pieces of equipment, 3 = plus step-free
access. Every task has at least one room meeting all its constraints, and ``expected_room`` is the one
the booking policy picks (``building.py``). The building is ``make_building(seed)``; the agent rebuilds
it from ``task["seed"]``, so a task is self-contained.

Splits are disjoint: a request belongs to ``train``/``val``/``test`` by a stable hash of its text
(one third each); ``make_tasks`` draws requests from a seeded stream and keeps those of the asked split,
so it is deterministic for ``(split, n, seed, levels)`` and a larger ``n`` extends a smaller one. The
tutorial uses about 60 tasks (20 per split); many more exist.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Sequence
from typing import Literal, TypedDict

from spanlab.agents.rooms.building import DAY_END, DAY_START, EQUIPMENT, Request, hhmm, make_building
from spanlab.agents.task_args import check_task_args

Split = Literal["train", "val", "test"]
SPLITS: tuple[Split, ...] = ("train", "val", "test")
LEVELS = (1, 2, 3)
_MAX_DRAWS_PER_TASK = 2000
_EQUIPMENT_WORDS = {"projector": "a projector", "whiteboard": "a whiteboard",
                    "video_conference": "video conferencing", "phone": "a conference phone"}
_OPENERS = ("Book a room for {n} people", "I need a meeting room for {n} people", "Find a room for {n} of us",
            "Please reserve a room for {n} people")


class RoomsTask(TypedDict):
    task_id: str
    request: str
    attendees: int
    start: str
    duration_min: int
    equipment: list[str]
    accessible: bool
    expected_room: str
    level: int
    split: str
    seed: int


def split_of(request: str) -> Split:
    bucket = int.from_bytes(hashlib.sha256(request.encode()).digest()[:8], "big") % 3
    return SPLITS[bucket]


def request_of(task: RoomsTask | dict) -> Request:
    start_h, _, start_m = task["start"].partition(":")
    return Request(attendees=task["attendees"], start=int(start_h) * 60 + int(start_m),
                   duration=task["duration_min"], equipment=frozenset(task["equipment"]),
                   accessible=task["accessible"])


def _draw(rng: random.Random, level: int) -> tuple[str, Request]:
    n = rng.choice((2, 3, 4, 5, 6, 7, 8, 10, 12, 14))
    duration = rng.choice((30, 60, 60, 90))
    start = rng.randrange(DAY_START, DAY_END - duration + 1, 30)
    equipment: list[str] = sorted(rng.sample(EQUIPMENT, rng.choice((1, 1, 2)))) if level >= 2 else []
    accessible = level >= 3
    text = rng.choice(_OPENERS).format(n=n) + f" at {hhmm(start)} for {duration} minutes."
    if equipment:
        text += " We need " + " and ".join(_EQUIPMENT_WORDS[e] for e in equipment) + "."
    if accessible:
        text += rng.choice((" One attendee uses a wheelchair.", " The room must be step-free accessible."))
    return text, Request(attendees=n, start=start, duration=duration, equipment=frozenset(equipment),
                         accessible=accessible)


def task_id(request: str, seed: int) -> str:
    return "rooms-" + hashlib.sha256(f"{seed}:{request}".encode()).hexdigest()[:12]


def make_tasks(split: Split, n: int, seed: int = 0, levels: Sequence[int] = LEVELS) -> list[RoomsTask]:
    """``n`` distinct requests of ``split`` for building ``seed``, levels interleaved round-robin."""
    check_task_args(split, n, levels, LEVELS)
    building = make_building(seed)
    rngs = {lv: random.Random(f"spanlab-rooms:tasks:{seed}:{lv}") for lv in levels}
    seen: set[str] = set()
    tasks: list[RoomsTask] = []
    for i in range(n):
        level = levels[i % len(levels)]
        for _ in range(_MAX_DRAWS_PER_TASK):
            text, request = _draw(rngs[level], level)
            best = building.best(request)
            if best is not None and text not in seen and split_of(text) == split:
                break
        else:
            raise ValueError(f"cannot draw {n} distinct level-{level} {split} requests for building {seed}")
        seen.add(text)
        tasks.append(RoomsTask(task_id=task_id(text, seed), request=text, attendees=request.attendees,
                               start=hhmm(request.start), duration_min=request.duration,
                               equipment=sorted(request.equipment), accessible=request.accessible,
                               expected_room=best.name, level=level, split=split, seed=seed))
    return tasks


class Grade(TypedDict):
    answer: str | None  # the room the final answer names (None: no known room)
    expected: str
    reward: float
    met: list[str]
    missed: list[str]


_ANSWER = re.compile(r"answer\s*[:=-]", re.IGNORECASE)


def answered_room(text: str | None, names: Sequence[str]) -> str | None:
    """The room a final answer names: the last room after the last "Answer:", else the last room named."""
    text = text or ""
    marks = list(_ANSWER.finditer(text))
    tail = text[marks[-1].end():] if marks else text
    pattern = re.compile(r"\b(" + "|".join(re.escape(n) for n in names) + r")\b", re.IGNORECASE)
    after = pattern.findall(tail) if marks else []
    hits = after[:1] or pattern.findall(text)[-1:]  # "Answer: Lyra (not Orion)" means Lyra
    return next(n for n in names if n.lower() == hits[0].lower()) if hits else None


def grade(text: str | None, task: RoomsTask | dict) -> Grade:
    """1.0 for the policy's room; another known room earns 0.5 x the fraction of constraints it meets."""
    building = make_building(task["seed"])
    answer = answered_room(text, [r.name for r in building.rooms])
    room = building.room(answer) if answer else None
    if room is None:
        return Grade(answer=None, expected=task["expected_room"], reward=0.0, met=[], missed=[])
    met = request_of(task).constraints(room)
    reward = 1.0 if room.name == task["expected_room"] else 0.5 * sum(met.values()) / len(met)
    return Grade(answer=room.name, expected=task["expected_room"], reward=reward,
                 met=[k for k, v in met.items() if v], missed=[k for k, v in met.items() if not v])
