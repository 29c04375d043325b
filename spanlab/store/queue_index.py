"""The in-memory side of the rollout queue: who waits, in what order, and which attempts are live.

A DuckDB statement costs a millisecond or two, so reading the rollouts table for the oldest waiting
rollout, or for overdue attempts, on every dequeue caps the queue at a few dozen rollouts/s. The
store process owns its file, so it keeps the waiting rollouts and the live attempts here: rebuilt from
the tables (and the queue journal) on open, changed only once a transition is durable. Memory grows with
the waiting rollouts' inputs (a GRPO queue of 10,000 short tasks: a few MB).

It also knows what the tables have not seen yet: the journal's transitions and the heartbeat times
of live attempts (:meth:`pending`), which the store writes in one transaction when :meth:`due`.
"""

from __future__ import annotations

import heapq
import time
from dataclasses import dataclass, field
from typing import Any

from spanlab.store.journal import QueueJournal
from spanlab.types import Attempt, Rollout

MAX_PENDING = 1024  # transitions held before the tables must be written, whatever the interval


@dataclass
class QueueIndex:
    journal: QueueJournal = field(default_factory=lambda: QueueJournal(None))
    _heaps: dict[str, list[tuple[float, str]]] = field(default_factory=dict)
    _waiting: dict[str, Rollout] = field(default_factory=dict)
    active: dict[str, tuple[Rollout, Attempt]] = field(default_factory=dict)
    _beats: set[str] = field(default_factory=set)
    _pending_since: float | None = None  # monotonic time of the oldest change the tables have not seen

    def record(self, rollout: Rollout, attempt: Attempt, requires: list[str] | None = None, *,
               sync: bool = True, written: bool = False) -> None:
        """A transition: durable first (journal), then live."""
        self.journal.record(rollout, attempt, requires, sync=sync, written=written)
        self._changed()
        self.apply(rollout, attempt)

    def enqueued(self, rollouts: list[Rollout]) -> None:
        """New rollouts: durable first (journal), then waiting."""
        self.journal.enqueued(rollouts)
        self._changed()
        for r in rollouts:
            if r.status in ("queuing", "requeuing"):
                self.push(r)

    def _changed(self) -> None:
        if self._pending_since is None:
            self._pending_since = time.monotonic()

    def apply(self, rollout: Rollout, attempt: Attempt) -> None:
        self._beats.discard(attempt.attempt_id)
        if attempt.status in ("preparing", "running"):
            self.active[attempt.attempt_id] = (rollout, attempt)
        else:
            self.active.pop(attempt.attempt_id, None)
            if rollout.status == "requeuing":
                self.push(rollout)

    def beat(self, attempt_id: str, now: float) -> Attempt:
        """A running attempt's heartbeat: only its time moves, in memory, until the next write."""
        rollout, attempt = self.active[attempt_id]
        attempt = attempt.model_copy(update={"last_heartbeat_time": now})
        self.active[attempt_id] = (rollout, attempt)
        self._beats.add(attempt_id)
        self._changed()
        return attempt

    def due(self, interval_s: float) -> bool:
        """Whether the oldest change the tables have not seen is ``interval_s`` old (or too many wait)."""
        since = self._pending_since
        return len(self.journal) >= MAX_PENDING or (since is not None and time.monotonic() - since >= interval_s)

    def pending(self) -> tuple[list[Rollout], list[dict[str, Any]], list[Attempt]] | None:
        """(new rollouts, rollout states, attempt rows) the tables have not seen; None if nothing."""
        beats = {a: self.active[a][1] for a in self._beats if a in self.active}
        if not self.journal.attempts and not beats and not self.journal.new_rollouts:
            self._pending_since = None
            return None
        return (list(self.journal.new_rollouts.values()), list(self.journal.rollouts.values()),
                list({**self.journal.attempts, **beats}.values()))

    def written(self) -> None:
        """Once what :meth:`pending` returned is committed."""
        self.journal.clear()
        self._beats.clear()
        self._pending_since = None

    def push(self, rollout: Rollout) -> None:
        heapq.heappush(self._heaps.setdefault(rollout.mode, []), (rollout.enqueue_time, rollout.rollout_id))
        self._waiting[rollout.rollout_id] = rollout

    def discard(self, rollout_id: str) -> None:
        """Stop a rollout from being dequeued (lazy: its heap entry is skipped when reached)."""
        self._waiting.pop(rollout_id, None)

    def pop(self, mode: str | None) -> Rollout | None:
        """The oldest waiting rollout (of ``mode``, if given), removed."""
        modes = [mode] if mode else list(self._heaps)
        while True:
            candidates = [m for m in modes if self._heaps.get(m)]
            if not candidates:
                return None
            best = min(candidates, key=lambda m: self._heaps[m][0])
            _, rollout_id = heapq.heappop(self._heaps[best])
            rollout = self._waiting.pop(rollout_id, None)
            if rollout is not None:
                return rollout

    def overdue(self, now: float, timeout_grace_s: float = 0.0) -> list[tuple[str, str]]:
        """(attempt_id, "timeout" | "unresponsive") for live attempts past their rollout's limits.

        ``timeout_grace_s`` lets the worker, which enforces ``timeout_s`` itself from the moment it got
        the attempt, act first: the store only steps in for workers that died or hang.
        """
        out = []
        for attempt_id, (rollout, attempt) in self.active.items():
            cfg = rollout.config
            if cfg.timeout_s is not None and now - attempt.start_time > cfg.timeout_s + timeout_grace_s:
                out.append((attempt_id, "timeout"))
                continue
            last_sign_of_life = attempt.last_heartbeat_time or attempt.start_time
            if cfg.unresponsive_s is not None and now - last_sign_of_life > cfg.unresponsive_s:
                out.append((attempt_id, "unresponsive"))
        return out
