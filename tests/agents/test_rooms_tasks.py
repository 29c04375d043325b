"""Room selector tasks and grading: deterministic, disjoint splits, one right room per request, partial credit."""

from __future__ import annotations

import json

import pytest

from spanlab.agents.rooms.agent import run_tool
from spanlab.agents.rooms.building import make_building
from spanlab.agents.rooms.tasks import answered_room, grade, make_tasks, request_of
from spanlab.jobs.tasks import load_task_set


def test_tasks_are_deterministic_disjoint_and_extend() -> None:
    splits = {s: make_tasks(s, 20, seed=0) for s in ("train", "val", "test")}
    assert splits["val"] == make_tasks("val", 20, seed=0)
    assert make_tasks("val", 8, seed=0) == splits["val"][:8]
    texts = [{t["request"] for t in ts} for ts in splits.values()]
    assert all(len(t) == 20 for t in texts) and not (texts[0] & texts[1] or texts[0] & texts[2] or texts[1] & texts[2])
    assert [t["level"] for t in splits["test"][:6]] == [1, 2, 3, 1, 2, 3]
    assert make_tasks("val", 5, seed=1) != make_tasks("val", 5, seed=0)
    assert load_task_set("rooms").make_tasks("train", 3, seed=0, levels=(2,)) == make_tasks("train", 3, 0, (2,))


def test_expected_room_is_the_policy_choice_among_fitting_rooms() -> None:
    building = make_building(0)
    for task in make_tasks("train", 30, seed=0):
        request = request_of(task)
        fitting = building.fitting(request)
        assert fitting and fitting[0].name == task["expected_room"]
        assert all(all(request.constraints(r).values()) for r in fitting)
        assert all((r.capacity, r.floor) >= (fitting[0].capacity, fitting[0].floor) for r in fitting)
        if task["level"] >= 2:
            assert set(task["equipment"]) <= set(building.room(task["expected_room"]).equipment)


def test_grade_full_partial_and_none() -> None:
    task = next(t for t in make_tasks("val", 30, seed=0) if t["level"] == 2)
    building = make_building(0)
    assert grade(f"Answer: {task['expected_room']}", task)["reward"] == 1.0
    too_small = min(building.rooms, key=lambda r: r.capacity)  # 2 seats: fails capacity at least
    g = grade(f"I would book {too_small.name}.", task)
    assert g["answer"] == too_small.name and "capacity" in g["missed"] and 0.0 <= g["reward"] < 0.5
    assert grade("no idea", task) == {"answer": None, "expected": task["expected_room"], "reward": 0.0, "met": [],
                                      "missed": []}


@pytest.mark.parametrize(("text", "room"), [
    ("Answer: Lyra", "Lyra"),
    ("Orion is busy. Answer: lyra (not Orion)", "Lyra"),
    ("Orion or maybe Vega", "Vega"),
    ("Answer: nothing fits", None),
    ("", None),
])
def test_answered_room(text: str, room: str | None) -> None:
    names = [r.name for r in make_building(0).rooms]
    assert answered_room(text, names) == room


def test_tools_answer_from_the_building_and_report_bad_calls() -> None:
    task = make_tasks("val", 1, seed=0)[0]
    args = json.dumps({"attendees": task["attendees"], "equipment": [], "accessible": False, "start": task["start"],
                       "duration_min": task["duration_min"]})
    rooms = [r["room"] for r in json.loads(run_tool(0, "find_rooms", args))]
    assert task["expected_room"] in rooms
    assert "error" in run_tool(0, "check_availability", '{"room": "Nowhere", "start": "09:00"}')
    assert "error" in run_tool(0, "find_rooms", '{"attendees": 3, "start": "25:99"}')
    assert "error" in run_tool(0, "book_it", "{}")
    assert "error" in run_tool(0, "find_rooms", "not json")
