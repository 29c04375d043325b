"""Data-parallel updates on torch.distributed: the job's process is rank 0, N - 1 spawned processes join it.

Why this shape: rank 0 owns everything outside the update (the store, the engine, the gateway, the
rollouts), so only it reads the step's samples and pushes the new weights; the helpers hold a copy of the
model and its optimizer and do nothing but their share of each update. Each step rank 0 broadcasts the
update to run (a picklable function and its arguments, e.g. ``grpo_step`` and the samples) and runs it
itself; every rank computes the same plan from the same samples, works on its shard, and the gradients are
summed over ranks (:func:`all_reduce_grads`) before clipping and the optimizer step, so every rank takes the
same step and the models never drift apart. The process group is gloo on CPU and nccl with one GPU per
rank, rendezvous over a TCPStore on 127.0.0.1.

Why an explicit all-reduce and not DDP (``sharding: none``): ``token_logprobs`` calls the decoder and the LM
head directly (to run a shared prefix once and the head only on trained positions), which bypasses DDP's
forward and its reducer; and ranks get uneven numbers of micro-batches (or none). Summing every gradient
once per optimizer step is what DDP's ``no_sync`` plus a final synced backward would compute.

``sharding: fsdp`` shards the model with FSDP2 instead (:mod:`spanlab.training.sharding`): each rank holds
1/N of the parameters, gradients and optimizer state; the gradients are reduce-scattered (summed) in
backward, every forward and backward is a collective, so the ranks run the same number of micro-batches
(:meth:`Ranks.lockstep`). Rank 0 holds only its shard too: the weights it pushes are gathered from all
ranks (:meth:`DataParallel.full_state_dict`).

Left out: ranks on several machines (all ranks run on the job's host).

    with DataParallel(policy.model, make_model, make_optimizer, TrainerConfig(processes=2)) as dp:
        metrics = dp.run(grpo_step, samples=samples, config=settings, pad_id=pad_id)
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from spanlab.errors import SpanlabError
from spanlab.training.settings import LoraConfig
from spanlab.training.trainer_config import TrainerConfig

__all__ = ["DataParallel", "Ranks", "TrainerError", "all_reduce_grads", "gather", "load_trainable_model"]

logger = logging.getLogger(__name__)

ModelFactory = Callable[[], nn.Module]
OptimizerFactory = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]
_READY = "spanlab/ready/{}"
T = TypeVar("T")


class TrainerError(SpanlabError, RuntimeError):
    """A trainer rank failed to start or died."""


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


def load_trainable_model(model_dir: str | Path, lora: LoraConfig | None = None) -> nn.Module:
    """The architecture a helper rank trains (fp32, LoRA-wrapped when given); rank 0 then broadcasts its weights."""
    from transformers import AutoModelForCausalLM

    from spanlab.training.model import apply_lora

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    model.config.use_cache = False
    return apply_lora(model, lora) if lora is not None else model


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _device(config: TrainerConfig, rank: int) -> torch.device:
    if config.device == "gpu":
        torch.cuda.set_device(rank)
        return torch.device("cuda", rank)
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


def _prepare(model: nn.Module, config: TrainerConfig, device: torch.device) -> nn.Module:
    """The module this rank trains: ``model`` with rank 0's weights, on ``device``, or sharded over the ranks
    (FSDP2 moves each shard to the device itself, so a model too big for one never lands there whole)."""
    if config.sharding == "none":
        model.to(device)
    _broadcast_state(model, device)
    if config.sharding == "none":
        return model
    from spanlab.training.sharding import shard_model

    return shard_model(model, device)


def _init_group(config: TrainerConfig, store: dist.TCPStore, rank: int) -> None:
    dist.init_process_group("nccl" if config.device == "gpu" else "gloo", store=store, rank=rank,
                            world_size=config.processes, timeout=timedelta(seconds=config.timeout_s))


def _worker(rank: int, port: int, config: TrainerConfig, make_model: ModelFactory, make_optimizer: OptimizerFactory,
            threads: int) -> None:
    """A helper rank: build the model, join the group, take rank 0's weights, then run each broadcast update."""
    torch.set_num_threads(threads)
    device = _device(config, rank)
    model = make_model()
    store = dist.TCPStore("127.0.0.1", port, config.processes, is_master=False,
                          timeout=timedelta(seconds=config.timeout_s))
    store.set(_READY.format(rank), "1")
    _init_group(config, store, rank)
    try:
        model = _prepare(model, config, device)
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


class DataParallel:
    """Rank 0 of a ``config.processes``-rank update of ``model``; a context manager that owns the helper processes.

    ``make_model`` builds the same architecture in a helper (its weights are replaced by rank 0's);
    ``make_optimizer`` is called with the trainable parameters on every rank, so all ranks step alike.
    Both are pickled into the helpers (module-level functions or ``functools.partial`` of them).
    With ``sharding: fsdp`` the updates get ``trained`` (``model`` sharded in place, wrapped in a
    ``TokenLogprobs``); ``model`` then holds only rank 0's shard, also after the context ends.
    """

    def __init__(self, model: nn.Module, make_model: ModelFactory, make_optimizer: OptimizerFactory,
                 config: TrainerConfig, *, threads: int | None = None) -> None:
        if config.processes < 2:
            raise ValueError("DataParallel needs trainer.processes >= 2; use the model directly for one")
        config.check_devices()
        self.model, self.config = model, config
        self._make_model, self._make_optimizer = make_model, make_optimizer
        total = threads or torch.get_num_threads()
        self._threads = max(1, total // config.processes) if config.device == "cpu" else total
        self._procs: list[Any] = []
        self._saved_threads = torch.get_num_threads()
        self.optimizer: torch.optim.Optimizer | None = None
        self.trained: nn.Module = model
        self.ranks = Ranks(0, config.processes, sharded=config.sharding == "fsdp")

    def __enter__(self) -> DataParallel:
        port = _free_port()
        context = mp.get_context("spawn")
        store = dist.TCPStore("127.0.0.1", port, self.config.processes, is_master=True,
                              timeout=timedelta(seconds=self.config.timeout_s), wait_for_workers=False)
        for rank in range(1, self.config.processes):
            proc = context.Process(target=_worker, daemon=True, name=f"spanlab-trainer-rank{rank}",
                                   args=(rank, port, self.config, self._make_model, self._make_optimizer,
                                         self._threads))
            proc.start()
            self._procs.append(proc)
        try:
            self._wait_ready(store)
            torch.set_num_threads(self._threads)
            _init_group(self.config, store, 0)
            self.trained = _prepare(self.model, self.config, _device(self.config, 0))
            self.optimizer = self._make_optimizer(p for p in self.trained.parameters() if p.requires_grad)
        except BaseException:
            self._stop_helpers()
            raise
        self._store = store  # the master store lives as long as the group
        logger.info("data-parallel trainer: %d ranks (%s), %d threads each", self.config.processes,
                    self.config.device, self._threads)
        return self

    def _wait_ready(self, store: dist.TCPStore) -> None:
        """Until every helper has built its model and connected; a helper that dies first fails here, not in a hang."""
        deadline = time.monotonic() + self.config.timeout_s
        keys = [_READY.format(rank) for rank in range(1, self.config.processes)]
        while not store.check(keys):
            for rank, proc in enumerate(self._procs, start=1):
                if not proc.is_alive():
                    raise TrainerError(f"trainer.processes: rank {rank} exited with code {proc.exitcode} "
                                       "before joining (its log is above)")
            if time.monotonic() > deadline:
                raise TrainerError(f"trainer.processes: ranks not ready within trainer.timeout_s "
                                   f"({self.config.timeout_s:g} s)")
            time.sleep(0.05)

    def run(self, fn: Callable[..., T], **kwargs: Any) -> T:
        """Run ``fn(model, optimizer, ranks=..., **kwargs)`` on every rank (the helpers get it by broadcast);
        rank 0's result."""
        for rank, proc in enumerate(self._procs, start=1):
            if not proc.is_alive():
                raise TrainerError(f"trainer.processes: rank {rank} died (exit code {proc.exitcode})")
        dist.broadcast_object_list([(fn, kwargs)], src=0, device=_device(self.config, 0))
        return fn(self.trained, self.optimizer, ranks=self.ranks, **kwargs)

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The whole model's state dict (HF names) on rank 0: what a weight push sends. Sharded, it is gathered
        from every rank into CPU memory; otherwise it is rank 0's own copy."""
        if not self.ranks.sharded:
            return self.model.state_dict()
        return self.run(_full_state_dict)

    def fingerprints(self) -> list[tuple[float, float]]:
        """(sum, sum of squares) of every rank's parameters, in float64: equal on all ranks when in sync
        (unsharded ranks: a sharded rank holds its own part)."""
        return self.run(_fingerprint)["ranks"]

    def __exit__(self, exc_type: object, *_: object) -> None:
        try:
            if exc_type is None:  # the helpers wait in the broadcast: tell them to stop
                dist.broadcast_object_list([None], src=0, device=_device(self.config, 0))
                for proc in self._procs:
                    proc.join(timeout=30)
        finally:
            self._stop_helpers()
            if dist.is_initialized():
                dist.destroy_process_group()
            torch.set_num_threads(self._saved_threads)

    def _stop_helpers(self) -> None:
        """Terminate (then kill) the helpers still running: after an error they may wait in a collective."""
        for proc in self._procs:
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=10)
        self._procs.clear()


def _full_state_dict(model: nn.Module, optimizer: object, *, ranks: Ranks) -> dict[str, torch.Tensor]:
    from spanlab.training.sharding import full_state_dict

    return full_state_dict(model)  # type: ignore[arg-type]  # sharded: the TokenLogprobs shard_model built


def _fingerprint(model: nn.Module, optimizer: object, *, ranks: Ranks) -> dict[str, Any]:
    with torch.no_grad():
        flat = [p.detach().double() for p in model.parameters()]
        mine = (float(sum(t.sum() for t in flat)), float(sum((t * t).sum() for t in flat)))
    return {"ranks": gather(mine)}

