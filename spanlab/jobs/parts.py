"""The named parts the framework builds once per job and hands to an algorithm, beside the ``Job`` door.

``Algorithm.run(job)`` stays the door plugins use (docs/algorithms.md). The built-in algorithms unpack it on their
first lines into these parts (and the trainer, ``Job.trainer``, and the demonstrations, ``Job.demonstrations``), so
nothing below ``run`` takes the whole job: a loop sees what it collects with, which tasks it draws, where its steps
go, and nothing else. Each part is a few bound callables of the job, so using a part does exactly what the job's
own method does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from spanlab.jobs.background import BackgroundRollouts
    from spanlab.jobs.report import Evaluation
    from spanlab.jobs.rollouts import RolloutBatch, RolloutCollector

Tasks = list[dict[str, Any]]


@dataclass(frozen=True)
class Collector:
    """Rollouts of the served policy: a batch a step waits for (``collect``: recorded, flushed, resumable), or
    workers that run for the whole loop (``background``) taking groups from a queue on ``rollouts``."""

    collect: Callable[..., RolloutBatch]  # (tasks, *, group_size=1, **metadata) -> the batch (Job.collect)
    rollouts: RolloutCollector  # the rig's collector, which a GroupQueue queues groups on
    flush: Callable[[], object]  # until the gateway's spans are in the store
    run_id: str
    served_name: Callable[[], str]  # the model name rollouts ask for now (the latest push's)
    sampling: dict[str, Any]  # the train rollouts' sampling overrides (``rollouts.temperature``)

    def background(self) -> BackgroundRollouts:
        """Workers sampling the policy served now, at the train temperature."""
        return self.rollouts.background(model=self.served_name(), **self.sampling)


@dataclass(frozen=True)
class TaskStream:
    """The ``rl`` split's tasks as steps draw them, seeded by the dataset seed (``Job.steps``, ``Job.task_draws``,
    ``Job.draw``), and the open step loop's bar (``note``)."""

    steps: Callable[[int, int, str], Iterator[tuple[int, Tasks]]]  # (n, tasks_per_step, label) -> (step, tasks)
    draws: Callable[[int], Iterator[Tasks]]  # (tasks_per_step) -> one draw after another
    draw: Callable[..., Tasks]  # (rng, n, exclude=...) -> n distinct tasks not in exclude
    note: Callable[[str], None]  # say what the open step is doing
    size: int  # tasks in the pool


@dataclass(frozen=True)
class StepLog:
    """Where a step's metrics go (report, resume state, ``train_metrics``, trackers, checkpoints) and the held-out
    evaluation an algorithm may add between steps."""

    log: Callable[[dict[str, float]], None]  # one step's flat metrics (Job.log_step)
    done: Callable[[], int]  # the steps logged so far (a resumed run's included)
    record: Callable[[dict[str, float]], None]  # metrics at the current step that are no step (train_metrics only)
    held_out: Callable[[str], Evaluation]  # (phase) -> the headline split's evaluation (Job.held_out)

