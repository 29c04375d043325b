"""What a run leaves on disk besides spans: servable models (``final/``, ``step-K/``) and the state ``--resume`` reads.

The framework owns these, not the algorithms: every algorithm that trains weights gets a servable
``runs/NAME/final/`` after its final evaluation (and ``runs/NAME/step-K/`` every ``checkpoints.every``
steps), each registered in the store as a version of the ``model_checkpoint`` resource ``checkpoint``,
and, for an algorithm that can resume, the trainer state after each completed step
(:mod:`spanlab.training.resume`). Light on import: the config section is read by ``--check``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from spanlab.errors import ConfigError

if TYPE_CHECKING:  # job imports this module at run time; the Job type only points back
    from spanlab.jobs.job import Job

logger = logging.getLogger(__name__)

RESOURCE = "checkpoint"  # the model_checkpoint resource naming every servable folder a run wrote


class CheckpointsConfig(BaseModel):
    """``checkpoints:``: which servable folders a run writes, and whether it saves state for ``--resume``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    final: bool = Field(default=True, description="write runs/NAME/final/ after the final evaluation")
    every: int | None = Field(default=None, ge=1, le=100_000, description="also write runs/NAME/step-K/ every K steps")
    merge_lora: bool = Field(default=True, description="LoRA: also write the merged weights, so the folder serves")
    resume_state: bool = Field(default=True, description="save weights, optimizer, step and RNG after each step")


def write_checkpoint(job: Job, tag: str) -> Path | None:
    """Write the job's policy as the servable folder ``run_dir/tag`` and register it; None without a policy."""
    if job.policy is None:
        return None
    from spanlab.engine.model import resolve_model
    from spanlab.training.export import write_servable

    config = job.config
    info: dict[str, Any] = {"run_id": job.report.run_id, "run_name": config.run_name, "tag": tag,
                            "step": len(job.report.steps), "policy_version": job.policy.sync.version}
    if job.policy_adapters is not None:  # a policy per role: the base as trained, and each policy's adapter
        from spanlab.jobs.policies import write_policies_servable

        path = write_policies_servable(job.policy, job.policy_adapters, config, tag, info)
        job.rig.store.add_resource(RESOURCE, {**info, "path": str(path.resolve())}, kind="model_checkpoint")
        return path
    path = write_servable(job.policy.model, resolve_model(config.engine.model), config.run_dir / tag,
                          merge_lora=config.checkpoints.merge_lora, info=info, weights_dir=job.policy.sync.pushed_dir,
                          tokenizer=job.policy.tokenizer)
    job.rig.store.add_resource(RESOURCE, {**info, "path": str(path.resolve())}, kind="model_checkpoint")
    return path


def after_step(job: Job) -> None:
    """After each logged step: a warning when it changed no weight, and the step-K folder when one is due
    (``checkpoints.every``)."""
    from spanlab.jobs.outcome import warn_if_no_update

    every, step = job.config.checkpoints.every, len(job.report.steps)
    warn_if_no_update(step, job.report.steps[-1])  # numbered as the progress bar numbers it: 1 is the first
    if every is not None and step % every == 0:
        write_checkpoint(job, f"step-{step}")


def check_resumable(job_algorithm: Any, config: Any) -> None:
    """``--resume`` needs an algorithm that can resume and the state saved after each step."""
    if not getattr(job_algorithm, "resumable", False):
        raise ConfigError(f"--resume: algorithm {config.algorithm!r} cannot resume a run (grpo can)")
    if not config.checkpoints.resume_state:
        raise ConfigError("--resume: checkpoints.resume_state is off, so no run state was saved")
    if config.loop.mode == "async":  # the groups in flight at the kill live in no saved state
        raise ConfigError("--resume: a loop.mode: async run keeps groups in flight that no saved state holds; "
                          "it cannot resume")
    if config.policies is not None:  # an optimizer and an adapter version per policy: no saved state holds them
        raise ConfigError("--resume: a run with policies saves no state per policy; it cannot resume")
    if config.trainer.processes > 1:  # rank 0's optimizer lives in the data-parallel group, not in the job
        raise ConfigError("--resume: a run with trainer.processes > 1 saves no optimizer state; it cannot resume")
