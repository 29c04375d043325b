"""The ``trainer:`` section: how many data-parallel processes run the weight update, on which device, and
whether the model is sharded over them (FSDP2) or copied to each.

Light on import (no torch at module level) so ``spanlab train --check`` stays cheap; the device count is
looked up only when :meth:`TrainerConfig.check_devices` runs, and torch only for ``device: gpu``.
"""

from __future__ import annotations

import os
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from spanlab.errors import ConfigError

TrainerDevice = Literal["cpu", "gpu"]
Sharding = Literal["none", "fsdp"]


class TrainerConfig(BaseModel):
    """``trainer: {processes: N, device: cpu|gpu, sharding: none|fsdp}``: N ranks of one update (gloo on CPU,
    nccl with one GPU each).

    ``processes: 1`` (the default) is the single-process trainer, in the job's own process: on the CPU, or with
    ``device: gpu`` on the first GPU (beside the engine when both share it). With N > 1 the job's process is
    rank 0 (it reads the samples and pushes weights) and N - 1 helper processes on the same machine join it;
    under torchrun (any number of machines) its rank 0 runs the job and its other ranks are the helpers.
    ``sharding: none`` keeps a whole copy of the model and its optimizer state on every rank; ``fsdp``
    (torch's FSDP2, ``fully_shard``) keeps 1/N of each on each rank, for models that do not fit one device.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    processes: int = Field(default=1, ge=1, le=1024, description="data-parallel ranks of the update")
    device: TrainerDevice = Field(default="cpu", description="cpu: gloo, ranks share the cores; gpu: nccl, a GPU each")
    timeout_s: float = Field(default=600.0, gt=0, le=86_400,
                             description="how long a rank waits in a collective (a dead rank fails the step then)")
    sharding: Sharding = Field(default="none", description="none: a whole model per rank; fsdp: 1/N of it (FSDP2)")

    @model_validator(mode="after")
    def _consistent(self) -> TrainerConfig:
        if self.sharding == "fsdp" and self.processes < 2:
            raise ValueError("sharding: fsdp shards the model over the ranks; set processes >= 2")
        return self

    @property
    def policy_device(self) -> str:
        """Where the job loads the policy it trains: the GPU for the one-process GPU trainer, else the CPU (with
        N > 1 ranks, :class:`~spanlab.training.data_parallel.DataParallel` places rank 0's copy itself)."""
        return "cuda" if self.device == "gpu" and self.processes == 1 else "cpu"

    def check_devices(self) -> None:
        """Refuse more ranks on this machine than it has devices: cores on CPU, GPUs on GPU (one rank per GPU).

        On CPU a rank per core is the most that can help; more only time-slice the same cores. Under torchrun
        the ranks on this machine are its ``LOCAL_WORLD_SIZE`` (``processes`` counts every machine's).
        """
        from spanlab.training.launch import torchrun_launch

        launch = torchrun_launch()
        here = launch.local_world if launch is not None else self.processes
        where = " on this machine" if launch is not None else ""
        if self.device == "cpu":
            cores = os.cpu_count() or 1
            if here > cores:
                raise ConfigError(f"trainer.processes: {here} processes{where} but this machine has {cores} "
                                  "CPU cores (at most one rank per core)")
            return
        try:
            import torch
        except ImportError as exc:  # pragma: no cover - torch is a core dependency
            raise ConfigError("trainer.device: gpu needs torch") from exc
        gpus = torch.cuda.device_count()
        if gpus == 0:
            raise ConfigError(f"trainer.device: gpu but torch {torch.__version__} sees no GPU "
                              "(set trainer.device: cpu, or install a CUDA build of torch)")
        if here > gpus:
            raise ConfigError(f"trainer.processes: {here} processes{where} but torch sees {gpus} GPU{'s' * (gpus > 1)} "
                              "(trainer.device: gpu runs one rank per GPU)")
