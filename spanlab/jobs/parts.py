"""The named parts the framework builds once per job and hands to an algorithm, beside the ``Job`` door.

``Algorithm.run(job)`` stays the door plugins use (docs/algorithms.md). The built-in algorithms unpack it on their
first lines into these parts (and the trainer, ``Job.trainer``), so nothing below ``run`` takes the whole job: a
loop sees what it collects with, which tasks it draws, where its steps go, and nothing else. The collector, task
stream and step log are bound callables of the job, so using a part does exactly what the job's own method does.

The demonstrations: the warm start and GRPO's demonstration term train on what :meth:`Demonstrations.stored`
returns, which is what the store holds (``demonstration`` spans, :mod:`spanlab.adapters.demonstrations`), not on
the generated conversations directly: every token a run trained on is then in its store, and a resumed run finds
the same demonstrations there instead of generating them again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from spanlab.adapters.conversation import encode_conversation
from spanlab.adapters.demonstrations import read_demonstrations, record_demonstrations
from spanlab.errors import ConfigError

if TYPE_CHECKING:
    from spanlab.adapters.samples import Sample
    from spanlab.jobs.background import BackgroundRollouts
    from spanlab.jobs.config import WarmStartConfig
    from spanlab.jobs.report import Evaluation
    from spanlab.jobs.rollouts import RolloutBatch, RolloutCollector
    from spanlab.jobs.tasks import TaskSet
    from spanlab.store.base import StoreAPI

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


@dataclass(frozen=True)
class Demonstrations:
    """The run's demonstrations in its store: where they are recorded, how they are made, which tasks they show.

    ``train``: the run's train tasks (a demonstration term picks its own from them); ``demo_tasks``: those of
    ``warm_start.levels``, the first ``warm_start.demos`` of which the warm start demonstrates."""

    store: StoreAPI
    run_id: str
    task_set: TaskSet
    tokenizer: Any
    model: str  # the model name recorded with each demonstration (``engine.model``)
    train: Tasks
    demo_tasks: Tasks
    warm_start_config: WarmStartConfig | None  # ``warm_start:``; None: the run has no warm start

    def stored(self, tasks: Tasks, source: str, *, key: str) -> list[Sample]:
        """The run's demonstrations of ``source``: read from the store when a run (this one, before --resume)
        recorded them, else generated for ``tasks``, recorded and read back. ``key``: the config key named in
        errors."""
        if found := read_demonstrations(self.store, run_id=self.run_id, sources=[source]):
            return found
        demonstration = self.task_set.demonstration
        if demonstration is None:
            raise ConfigError(f"{key}: task set {self.task_set.name!r} has no demonstrations; remove {key}")
        if not tasks:
            raise ConfigError(f"{key}: no train task to demonstrate (check its levels against dataset.levels)")
        conversations = [demonstration(t) for t in tasks]
        samples = [encode_conversation(self.tokenizer, d["messages"], d.get("tools")) for d in conversations]
        record_demonstrations(self.store, samples, tasks, model=self.model, source=source, run_id=self.run_id,
                              conversations=[d["messages"] for d in conversations])
        return read_demonstrations(self.store, run_id=self.run_id, sources=[source])

    def warm_start(self) -> list[Sample]:
        """The warm start's demonstrations (its first ``warm_start.demos`` demo tasks): what it trains on, and what
        GRPO's demonstration term replays in a run that has one."""
        ws = self.warm_start_config
        assert ws is not None, "only a run with a warm start has its demonstrations"
        return self.stored(self.demo_tasks[: ws.demos], "warm_start", key="warm_start")
