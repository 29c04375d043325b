"""What a GRPO loop does with rollouts, whichever loop runs it (:mod:`.loop`'s sync one, :mod:`.async_loop`'s).

Why its own module: the sync loop starts the async one, and both take these parts; here, neither loop imports
the other for them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from spanlab.jobs.outcome import made_no_update


@dataclass(frozen=True)
class StepParts:
    """What a GRPO loop does with rollouts, whichever loop runs: the update of given rollouts, the weight push
    (its seconds), the metrics sink. The job wires the real ones; tests and benchmarks wire a tiny trainer."""

    update: Callable[[list[str]], dict[str, float]]  # rollout IDs -> the update's metrics
    push: Callable[[], float]
    log_step: Callable[[dict[str, float]], None]
    clock: Callable[[], float] = field(default=time.monotonic)

    def push_if_updated(self, metrics: Mapping[str, float]) -> float:
        """Push after an update only (its seconds; 0.0 when the step changed no weight): a step without an update
        keeps the served version, so the engine, the spans and the checkpoints count updates, not steps."""
        return 0.0 if made_no_update(metrics) else self.push()
