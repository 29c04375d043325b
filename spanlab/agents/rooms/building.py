"""A small synthetic office building from a seed: rooms, their equipment, one day of bookings, and the rules.

The building is the ground truth the room selector's tools read and its grader scores against. The
booking policy decides ties, so every request has exactly one right room: among the rooms that meet
every constraint (capacity, equipment, free for the whole slot, step-free access when asked), the one
with the smallest capacity, then the lowest floor, then the first name. The default prompt does not
state the policy; a prompt optimizer can learn it from the graded rollouts.
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass, field
from typing import Any

ROOM_NAMES = ("Orion", "Lyra", "Vega", "Draco", "Cygnus", "Aquila", "Perseus", "Carina", "Hydra", "Lynx", "Pavo",
              "Auriga")
EQUIPMENT = ("projector", "whiteboard", "video_conference", "phone")
CAPACITIES = (2, 4, 4, 6, 6, 8, 8, 10, 12, 16, 20, 30)
DAY_START, DAY_END = 8 * 60, 18 * 60  # bookable minutes of the day


def hhmm(minutes: int) -> str:
    return f"{minutes // 60:02d}:{minutes % 60:02d}"


def minutes_of(text: str) -> int:
    """``"14:30"`` -> 870; raises ValueError on anything else (tool arguments come from a model)."""
    hours, _, mins = text.strip().partition(":")
    value = int(hours) * 60 + int(mins or 0)
    if not (0 <= value < 24 * 60):
        raise ValueError(f"not a time of day: {text!r}")
    return value


@dataclass(frozen=True)
class Room:
    name: str
    floor: int
    capacity: int
    equipment: frozenset[str]
    accessible: bool
    bookings: tuple[tuple[int, int], ...] = field(default=())  # (start, end) minutes, sorted

    def is_free(self, start: int, duration: int) -> bool:
        return all(end <= start or begin >= start + duration for begin, end in self.bookings)

    def describe(self) -> dict[str, Any]:
        return {"room": self.name, "floor": self.floor, "capacity": self.capacity,
                "equipment": sorted(self.equipment), "accessible": self.accessible}


@dataclass(frozen=True)
class Request:
    attendees: int
    start: int
    duration: int
    equipment: frozenset[str] = frozenset()
    accessible: bool = False

    def constraints(self, room: Room) -> dict[str, bool]:
        """Each constraint of this request and whether ``room`` meets it (the grader's partial credit)."""
        met = {"capacity": room.capacity >= self.attendees, "available": room.is_free(self.start, self.duration)}
        if self.equipment:
            met["equipment"] = self.equipment <= room.equipment
        if self.accessible:
            met["accessible"] = room.accessible
        return met


@dataclass(frozen=True)
class Building:
    seed: int
    rooms: tuple[Room, ...]

    def room(self, name: str) -> Room | None:
        return next((r for r in self.rooms if r.name.lower() == name.strip().lower()), None)

    def fitting(self, request: Request) -> list[Room]:
        """Rooms meeting every constraint, best first by the booking policy."""
        ok = [r for r in self.rooms if all(request.constraints(r).values())]
        return sorted(ok, key=lambda r: (r.capacity, r.floor, r.name))

    def best(self, request: Request) -> Room | None:
        fitting = self.fitting(request)
        return fitting[0] if fitting else None

    # --- the agent's tools (JSON-able results; arguments are validated, errors are returned as text) ------
    def find_rooms(self, attendees: int = 1, equipment: list[str] | None = None, accessible: bool = False,
                   start: str | None = None, duration_min: int = 30) -> list[dict[str, Any]]:
        """Rooms with enough seats and the equipment (and free for the slot when ``start`` is given), by name."""
        want = {e.strip().lower() for e in equipment or []}
        rooms = [r for r in self.rooms if r.capacity >= int(attendees) and want <= r.equipment
                 and (r.accessible or not accessible)]
        if start is not None:
            begin = minutes_of(start)
            rooms = [r for r in rooms if r.is_free(begin, int(duration_min))]
        return [r.describe() for r in sorted(rooms, key=lambda r: r.name)]

    def list_rooms(self) -> list[dict[str, Any]]:
        return [r.describe() for r in sorted(self.rooms, key=lambda r: r.name)]

    def check_availability(self, room: str, start: str, duration_min: int = 30) -> dict[str, Any]:
        found = self.room(room)
        if found is None:
            return {"error": f"no room named {room!r}; rooms: {', '.join(r.name for r in self.rooms)}"}
        begin = minutes_of(start)
        busy = [f"{hhmm(b)}-{hhmm(e)}" for b, e in found.bookings if not (e <= begin or b >= begin + int(duration_min))]
        return {"room": found.name, "start": hhmm(begin), "duration_min": int(duration_min), "free": not busy,
                "conflicts": busy}


def _bookings(rng: random.Random) -> tuple[tuple[int, int], ...]:
    slots: list[tuple[int, int]] = []
    for _ in range(rng.randint(1, 4)):
        duration = rng.choice((30, 60, 60, 90, 120))
        start = rng.randrange(DAY_START, DAY_END - duration + 1, 30)
        if all(end <= start or begin >= start + duration for begin, end in slots):
            slots.append((start, start + duration))
    return tuple(sorted(slots))


@functools.lru_cache(maxsize=32)
def make_building(seed: int = 0) -> Building:
    """The building of ``seed``: 12 rooms on 3 floors, 1-4 bookings each (deterministic, cached)."""
    rng = random.Random(f"spanlab-rooms:building:{seed}")
    capacities = list(CAPACITIES)
    rng.shuffle(capacities)
    rooms = []
    for name, capacity in zip(ROOM_NAMES, capacities, strict=True):
        floor = rng.randint(1, 3)
        equipment = frozenset(e for e in EQUIPMENT if rng.random() < (0.3 + capacity / 40))
        rooms.append(Room(name=name, floor=floor, capacity=capacity, equipment=equipment,
                          accessible=floor == 1 or rng.random() < 0.5, bookings=_bookings(rng)))
    return Building(seed=seed, rooms=tuple(rooms))
