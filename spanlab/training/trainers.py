"""The trainer an algorithm updates its policy through, wherever the update runs: in this process or on ranks.

An algorithm says *what* one update is (its step function: ``step(model, optimizer, samples, **step_args)``, e.g.
``functools.partial(grpo_step, config=..., pad_id=...)``) and *which* samples it reads; the trainer says *where*
it runs and how the result reaches the engine. The framework picks one (:func:`spanlab.jobs.trainer.build_trainer`,
from ``trainer:``, ``policies:`` and ``--resume``), so no algorithm chooses between one process, data-parallel
ranks, FSDP or an adapter per role itself. The step function crosses into spawned ranks by pickling: keep it a
module-level function or a ``functools.partial`` of one.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from torch import nn

    from spanlab.adapters.samples import Sample
    from spanlab.training.data_parallel import DataParallel
    from spanlab.training.policy import Policy

TrainStep = Callable[..., dict[str, float]]  # (model, optimizer, samples, **step_args) -> the update's metrics
MakeOptimizer = Callable[[Iterable["nn.Parameter"]], "torch.optim.Optimizer"]
SampleRead = Callable[[Sequence[str] | None], Iterable["Sample"]]  # (roles to read, None: all) -> a step's samples


class Trainer(ABC):
    """Updates the policy on a step's samples and pushes what changed to the engine."""

    optimizer: torch.optim.Optimizer | None = None  # the state ``--resume`` restores (None: no state is saved)

    @abstractmethod
    def update(self, read: SampleRead, **step_args: Any) -> dict[str, float]:
        """Read the step's samples (``read(roles)``), run the step function on them; its metrics."""

    @abstractmethod
    def push(self) -> float:
        """Serve what the last update changed; the seconds it took."""


class OneProcessTrainer(Trainer):
    """The step in this process, on the policy's model and one optimizer (which ``--resume`` saves)."""

    def __init__(self, policy: Policy, step: TrainStep, optimizer: torch.optim.Optimizer, *,
                 agents: Sequence[str] | None) -> None:
        self.policy, self.step, self.optimizer, self.agents = policy, step, optimizer, agents

    def update(self, read: SampleRead, **step_args: Any) -> dict[str, float]:
        return self.step(self.policy.model, self.optimizer, list(read(self.agents)), **step_args)

    def push(self) -> float:
        return self.policy.push()


class RanksTrainer(Trainer):
    """The step on every data-parallel rank (``trainer.processes: N``); this process is rank 0, reads the samples
    and pushes. Sharded (FSDP), rank 0 holds only its shard: the push gathers the whole state first."""

    def __init__(self, policy: Policy, ranks: DataParallel, step: TrainStep, *,
                 agents: Sequence[str] | None) -> None:
        self.policy, self.ranks, self.step, self.agents = policy, ranks, step, agents

    def update(self, read: SampleRead, **step_args: Any) -> dict[str, float]:
        return self.ranks.run(self.step, samples=list(read(self.agents)), **step_args)

    def push(self) -> float:
        if not self.ranks.ranks.sharded:
            return self.policy.push()
        return self.policy.sync.push_state(self.ranks.full_state_dict()).total_s
