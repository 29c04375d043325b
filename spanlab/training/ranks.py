"""One rank of a data-parallel update: its place (:class:`Ranks`), the collectives the update uses, and the loop
a helper rank runs, whichever way it was launched (spawned by the job, or started by ``torchrun``).

Why the helper loop lives here, apart from the launchers (:mod:`spanlab.training.data_parallel`): a spawned
helper and a torchrun helper differ only in how they join the process group and where their model factory
comes from; once joined they do the same thing (take rank 0's weights, then run each update rank 0
broadcasts until it broadcasts ``None``), so that is one function, :func:`follow_rank0`.

Why a helper waits for rank 0 without the trainer's timeout (:data:`HELPER_WAIT`): between two updates rank 0
collects the step's rollouts and pushes weights, and under torchrun the helpers start before rank 0 has even
started its engine; both can take longer than ``trainer.timeout_s``, and gloo fails a waiting receive after
the group's timeout. The helpers only ever follow rank 0, so they wait as long as it needs; rank 0 keeps
``trainer.timeout_s``, so a hung helper still fails the step there. A rank 0 that dies closes its sockets (the
helpers' collectives fail at once) and torchrun stops the group's other ranks.

Why ``torch.distributed.nn`` is imported here, before any rank joins a group: its functions take
``group=group.WORLD`` as a default argument, evaluated on import. Imported after ``init_process_group`` (a
torchrun helper loads its model after joining, and loading imports it), those defaults keep the group alive
past ``destroy_process_group``; gloo's threads are then torn down while the interpreter exits, which now and
then aborts the process ("terminate called without an active exception") and fails the whole torchrun job.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.nn  # before any group exists: see the module docstring
from torch import nn

from spanlab.training.trainer_config import TrainerConfig

__all__ = ["HELPER_WAIT", "Ranks", "all_reduce_grads", "backend", "device_for", "follow_rank0", "gather", "prepare"]

OptimizerFactory = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]
HELPER_WAIT = timedelta(days=7)


@dataclass(frozen=True)
class Ranks:
    """This process's place in the update: rank ``rank`` of ``world``; the default process group is theirs.

    ``sharded``: the model is FSDP-sharded, so its gradients are already reduced in backward and every rank
    must run each forward and backward together.
    """

    rank: int
    world: int
    sharded: bool = False

    def shard(self, items: list[Any]) -> list[Any]:
        """Every ``world``-th item from ``rank``: on a length-sorted list, each rank gets about as many tokens."""
        return items[self.rank::self.world]

    def lockstep(self, count: int) -> int:
        """How many micro-batches every rank runs when this one has ``count``: the most any rank has when the
        model is sharded (a rank with fewer runs weightless ones), else its own ``count``."""
        if not self.sharded:
            return count
        most = torch.tensor([count])
        dist.all_reduce(most, op=dist.ReduceOp.MAX)
        return int(most)

    def reduce_grads(self, params: Iterable[nn.Parameter]) -> None:
        """Sum the gradients over ranks (FSDP already reduce-scattered a sharded model's in backward)."""
        if not self.sharded:
            all_reduce_grads(params)


def all_reduce_grads(params: Iterable[nn.Parameter]) -> None:
    """Sum each gradient over ranks in place (a rank without a micro-batch adds zeros)."""
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)


def gather(obj: Any) -> list[Any]:
    """Every rank's ``obj`` (small picklable values such as metric sums), in rank order, on every rank."""
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def backend(config: TrainerConfig) -> str:
    """gloo on CPU, nccl with one GPU per rank."""
    return "nccl" if config.device == "gpu" else "gloo"


def device_for(config: TrainerConfig, local_rank: int) -> torch.device:
    """The device of the rank that is ``local_rank`` on its machine (its GPU on GPU: one per rank)."""
    if config.device == "gpu":
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def _broadcast_state(model: nn.Module, device: torch.device) -> None:
    """Rank 0's parameters and buffers into every rank's model, in place; a tensor off ``device`` (a model
    FSDP is about to shard onto the GPU) goes through a copy there, as nccl sends only GPU tensors."""
    with torch.no_grad():
        for tensor in model.state_dict().values():
            if tensor.device == device:
                dist.broadcast(tensor, src=0)
            else:
                moved = tensor.to(device)
                dist.broadcast(moved, src=0)
                tensor.copy_(moved)


def prepare(model: nn.Module, config: TrainerConfig, device: torch.device) -> nn.Module:
    """The module this rank trains: ``model`` with rank 0's weights, on ``device``, or sharded over the ranks
    (FSDP2 moves each shard to the device itself, so a model too big for one never lands there whole)."""
    if config.sharding == "none":
        model.to(device)
    _broadcast_state(model, device)
    if config.sharding == "none":
        return model
    from spanlab.training.sharding import shard_model

    return shard_model(model, device)


def follow_rank0(model: nn.Module, make_optimizer: OptimizerFactory, config: TrainerConfig, rank: int,
                 device: torch.device) -> None:
    """A joined helper rank's whole life: take rank 0's weights into ``model``, then run each update rank 0
    broadcasts (a picklable function and its arguments) on this rank's shard, until it broadcasts ``None``.
    Destroys the process group at the end, also after an error."""
    try:
        model = prepare(model, config, device)
        optimizer = make_optimizer(p for p in model.parameters() if p.requires_grad)
        ranks = Ranks(rank, config.processes, sharded=config.sharding == "fsdp")
        while True:
            message: list[Any] = [None]
            dist.broadcast_object_list(message, src=0, device=device)
            if message[0] is None:
                return
            fn, kwargs = message[0]
            fn(model, optimizer, ranks=ranks, **kwargs)
    finally:
        dist.destroy_process_group()
