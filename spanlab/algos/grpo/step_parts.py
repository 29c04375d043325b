"""What a GRPO loop does with rollouts, whichever loop runs it (:mod:`.loop`'s sync one, :mod:`.async_loop`'s).

Why its own module: the sync loop starts the async one, and both take these parts; here, neither loop imports
the other for them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class StepParts:
    """What a GRPO loop does with rollouts, whichever loop runs: the update of given rollouts, the weight push
    (its seconds), the metrics sink. The job wires the real ones; tests and benchmarks wire a tiny trainer."""

    update: Callable[[list[str]], dict[str, float]]  # rollout IDs -> the update's metrics
    push: Callable[[], float]
    log_step: Callable[[dict[str, float]], None]
    clock: Callable[[], float] = field(default=time.monotonic)
