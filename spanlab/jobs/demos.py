"""A run's demonstrations: generated from the task set, recorded in the store, read back for training.

The warm start and GRPO's demonstration term train on what :meth:`Demonstrations.stored` returns, which is what
the store holds (``demonstration`` spans, :mod:`spanlab.adapters.demonstrations`), not on the generated
conversations directly: every token a run trained on is then in its store, and a resumed run finds the same
demonstrations there instead of generating them again.

The framework builds one :class:`Demonstrations` per job (``Job.demonstrations``) and hands it to whoever trains
on demonstrations; nothing here holds or takes the job itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from spanlab.adapters.conversation import encode_conversation
from spanlab.adapters.demonstrations import read_demonstrations, record_demonstrations
from spanlab.adapters.samples import Sample
from spanlab.errors import ConfigError
from spanlab.jobs.config import WarmStartConfig
from spanlab.jobs.tasks import TaskSet
from spanlab.store.base import StoreAPI

Tasks = list[dict[str, Any]]


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
