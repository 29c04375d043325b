"""Data-parallel updates on torch.distributed: the job's process is rank 0, N - 1 helper ranks join it.

Why this shape: rank 0 owns everything outside the update (the store, the engine, the gateway, the
rollouts), so only it reads the step's samples and pushes the new weights; the helpers hold a copy of the
model and its optimizer and do nothing but their share of each update. Each step rank 0 broadcasts the
update to run (a picklable function and its arguments, e.g. ``grpo_step`` and the samples) and runs it
itself; every rank computes the same plan from the same samples, works on its shard, and the gradients are
summed over ranks (:func:`all_reduce_grads`) before clipping and the optimizer step, so every rank takes the
same step and the models never drift apart. The process group is gloo on CPU and nccl with one GPU per rank.

Two ways to start the helpers, one helper loop (:func:`spanlab.training.ranks.follow_rank0`):

- spawned (the default): the job spawns N - 1 processes on its own machine, which meet it at a TCPStore
  on 127.0.0.1;
- torchrun (``torchrun ... -m spanlab train cfg.yaml``, any number of machines): torchrun starts every
  rank; rank 0 runs the job, the others run :func:`serve_torchrun_rank`, and all join through torch's own
  rendezvous (``init_method="env://"``). Rank 0 then broadcasts its trainer settings and the model and
  optimizer factories, so a helper needs nothing but the config file's ``trainer`` section to join (the
  model folder the factory names must exist at the same path on every machine).

Why an explicit all-reduce and not DDP (``sharding: none``): ``token_logprobs`` calls the decoder and the LM
head directly (to run a shared prefix once and the head only on trained positions), which bypasses DDP's
forward and its reducer; and ranks get uneven numbers of micro-batches (or none). Summing every gradient
once per optimizer step is what DDP's ``no_sync`` plus a final synced backward would compute.

``sharding: fsdp`` shards the model with FSDP2 instead (:mod:`spanlab.training.sharding`): each rank holds
1/N of the parameters, gradients and optimizer state; the gradients are reduce-scattered (summed) in
backward, every forward and backward is a collective, so the ranks run the same number of micro-batches
(:meth:`Ranks.lockstep`). Rank 0 holds only its shard too: the weights it pushes are gathered from all
ranks (:meth:`DataParallel.full_state_dict`).

    with DataParallel(policy.model, make_model, make_optimizer, TrainerConfig(processes=2)) as dp:
        metrics = dp.run(grpo_step, samples=samples, config=settings, pad_id=pad_id)
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable, Iterable
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from spanlab.errors import SpanlabError
from spanlab.training.launch import Launch, torchrun_launch
from spanlab.training.ranks import (
    HELPER_WAIT,
    Ranks,
    all_reduce_grads,
    backend,
    device_for,
    follow_rank0,
    gather,
    prepare,
)
from spanlab.training.settings import LoraConfig
from spanlab.training.trainer_config import TrainerConfig

__all__ = ["DataParallel", "Ranks", "TrainerError", "all_reduce_grads", "gather", "load_trainable_model",
           "serve_torchrun_rank"]

logger = logging.getLogger(__name__)

ModelFactory = Callable[[], nn.Module]
OptimizerFactory = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]
_READY = "spanlab/ready/{}"
T = TypeVar("T")


class TrainerError(SpanlabError, RuntimeError):
    """A trainer rank failed to start or died."""


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


def _worker(rank: int, port: int, config: TrainerConfig, make_model: ModelFactory, make_optimizer: OptimizerFactory,
            threads: int) -> None:
    """A spawned helper rank: build the model, join the group at rank 0's store, then follow rank 0."""
    torch.set_num_threads(threads)
    device = device_for(config, rank)
    model = make_model()
    store = dist.TCPStore("127.0.0.1", port, config.processes, is_master=False,
                          timeout=timedelta(seconds=config.timeout_s))
    store.set(_READY.format(rank), "1")
    dist.init_process_group(backend(config), store=store, rank=rank, world_size=config.processes,
                            timeout=HELPER_WAIT)
    follow_rank0(model, make_optimizer, config, rank, device)


def serve_torchrun_rank(config: TrainerConfig, launch: Launch) -> None:
    """A helper rank torchrun started (``launch.rank`` > 0): join through torchrun's rendezvous, take rank 0's
    trainer settings and factories, build the model, then follow rank 0 until the job ends."""
    device = device_for(config, launch.local_rank)
    dist.init_process_group(backend(config), init_method="env://", rank=launch.rank, world_size=launch.world,
                            timeout=HELPER_WAIT)
    try:
        message: list[Any] = [None]
        dist.broadcast_object_list(message, src=0, device=device)
        settings, make_model, make_optimizer = message[0]
        model = make_model()
    except BaseException:
        dist.destroy_process_group()
        raise
    logger.info("trainer rank %d of %d (local rank %d) joined", launch.rank, launch.world, launch.local_rank)
    follow_rank0(model, make_optimizer, settings, launch.rank, device)


class DataParallel:
    """Rank 0 of a ``config.processes``-rank update of ``model``; a context manager that owns the helper processes
    (spawned here, or, under torchrun, the ranks it started, which must number ``config.processes``).

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
        self._launch = torchrun_launch()
        if self._launch is not None and (self._launch.rank, self._launch.world) != (0, config.processes):
            raise TrainerError(f"trainer.processes: {config.processes} ranks, but this is torchrun's rank "
                               f"{self._launch.rank} of WORLD_SIZE={self._launch.world} (the job runs on rank 0)")
        total = threads or torch.get_num_threads()
        if self._launch is not None:  # torchrun set each rank's threads (OMP_NUM_THREADS)
            total = torch.get_num_threads()
        spawned_cpu = config.device == "cpu" and self._launch is None
        self._threads = max(1, total // config.processes) if spawned_cpu else total
        self._device = device_for(config, 0 if self._launch is None else self._launch.local_rank)
        self._procs: list[Any] = []
        self._saved_threads = torch.get_num_threads()
        self.optimizer: torch.optim.Optimizer | None = None
        self.trained: nn.Module = model
        self.ranks = Ranks(0, config.processes, sharded=config.sharding == "fsdp")

    def __enter__(self) -> DataParallel:
        try:
            if self._launch is None:
                self._spawn_and_join()
            else:  # torchrun started the helpers: meet them at its rendezvous, hand them what to build
                dist.init_process_group(backend(self.config), init_method="env://", rank=0,
                                        world_size=self.config.processes,
                                        timeout=timedelta(seconds=self.config.timeout_s))
                dist.broadcast_object_list([(self.config, self._make_model, self._make_optimizer)], src=0,
                                           device=self._device)
            self.trained = prepare(self.model, self.config, self._device)
            self.optimizer = self._make_optimizer(p for p in self.trained.parameters() if p.requires_grad)
        except BaseException:
            self._stop_helpers()
            if dist.is_initialized():
                dist.destroy_process_group()
            raise
        logger.info("data-parallel trainer: %d ranks (%s, %s), %d threads here", self.config.processes,
                    self.config.device, "spawned" if self._launch is None else "torchrun", self._threads)
        return self

    def _spawn_and_join(self) -> None:
        """Start the N - 1 helpers on this machine and form the group with them at a TCPStore on 127.0.0.1."""
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
        self._wait_ready(store)
        torch.set_num_threads(self._threads)
        dist.init_process_group(backend(self.config), store=store, rank=0, world_size=self.config.processes,
                                timeout=timedelta(seconds=self.config.timeout_s))
        self._store = store  # the master store lives as long as the group

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
        dist.broadcast_object_list([(fn, kwargs)], src=0, device=self._device)
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
                dist.broadcast_object_list([None], src=0, device=self._device)
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

