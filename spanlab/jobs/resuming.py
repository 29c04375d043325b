"""``spanlab train X.yaml --resume``: continue a run from its last completed step instead of from zero.

After the warm start and after every step the job saves its state (:mod:`spanlab.training.resume`):
trainable weights, optimizer moments, RNG states, the policy version and the report so far (which holds
the step counter and the held-out results). Resuming loads that state, serves the restored weights
under the version the store already holds (so the next rollouts name the same ``policy@N`` as in an
uninterrupted run), re-adds a step's metrics if the kill came between the state and the metrics write,
and cancels the rollouts the kill left running. The interrupted step is then done again, but its
rollouts that had already finished are reused (``Job.collect``), so no task of a step is sampled twice.

A kill during the learning curve's evaluation after a step (``eval.curve``) loses that point, as the state was
saved before it: the resumed run evaluates it first.

Left out: resuming an algorithm other than GRPO, and a kill during the final evaluation (the final
evaluation runs again; the interrupted one's rollouts stay in the store under ``phase = final``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from spanlab.errors import ConfigError
from spanlab.jobs.config import TrainConfig

if TYPE_CHECKING:  # job imports this module at run time; the Job type only points back
    from spanlab.jobs.job import Job
    from spanlab.training.resume import TrainState

logger = logging.getLogger(__name__)

_UNFINISHED = ("queuing", "requeuing", "preparing", "running")
FINISHED = ("succeeded", "failed")
# Settings a resumed run may change: how many steps it goes on to, where its tracking goes, and where its
# gateway listens (an address, not a training setting; a run saved before ``gateway:`` existed has none).
_MAY_CHANGE = ("steps", "tracking", "gateway")


def comparable(config: TrainConfig) -> dict[str, Any]:
    """The resolved config without what a resume may change."""
    data = config.resolved()
    for key in _MAY_CHANGE:
        data.pop(key, None)
    section = data.get(config.algorithm)
    if isinstance(section, dict):
        data[config.algorithm] = {k: v for k, v in section.items() if k not in _MAY_CHANGE}
    return data


def state_info(job: Job) -> dict[str, Any]:
    """The JSON half of the saved state."""
    return {"run_id": job.report.run_id, "completed_steps": len(job.report.steps),
            "policy_version": job.policy.sync.version if job.policy is not None else 0,
            "report": job.report.model_dump(mode="json"), "config": comparable(job.config)}


def check_same_config(state: TrainState, config: TrainConfig) -> None:
    """A resumed run continues the run it was: a changed setting (other than the step count) is an error."""
    saved, now = state.info.get("config", {}), comparable(config)
    changed = sorted(k for k in set(saved) | set(now) if saved.get(k) != now.get(k))
    if changed:
        raise ConfigError(f"--resume: the config changed since the run started ({', '.join(changed)}); "
                          "only the step count may change")


def resume(job: Job, state: TrainState) -> None:
    """Put the saved state back into the freshly opened job (the report is restored before the job is built, and
    the job holds ``state`` as its ``resume_state``)."""
    from spanlab.training.resume import restore_rng, restore_weights

    store, run_id = job.rig.store, job.report.run_id
    if job.policy is not None:
        restore_weights(state, job.policy.model)
        job.policy.sync.version = int(state.info["policy_version"])
        if job.policy.sync.version > 0:
            job.policy.sync.serve_again(job.policy.model)
    restore_rng(state)
    recorded = {(m.step, m.name) for m in store.metrics(run_id) if m.algorithm == job.config.algorithm}
    for step, metrics in enumerate(job.report.steps):
        missing = {k: v for k, v in metrics.items() if (step, k) not in recorded}
        if missing:  # killed after the state was saved, before its metrics were
            store.add_metrics(run_id, job.config.algorithm, step, missing)
    left = store.rollout_summaries(statuses=_UNFINISHED, metadata={"run_id": run_id})
    for summary in left:
        store.cancel_rollout(summary.rollout_id)
    logger.info("resumed %s after step %d (policy v%d); cancelled %d rollouts the kill left unfinished",
                run_id, len(job.report.steps), job.policy.sync.version if job.policy else 0, len(left))
    done = len(job.report.steps)  # the state is saved before the step's curve point: a kill during it lost it
    if done and not any(ev.phase == f"step-{done}" for ev in job.report.evaluations):
        job.curve_point(done)


def finished_rollouts(job: Job, step: int) -> dict[tuple[str, int], str]:
    """``(group_id, sample) -> rollout_id`` of the train rollouts of ``step`` that finished before the kill."""
    summaries = job.rig.store.rollout_summaries(statuses=FINISHED,
                                                metadata={"run_id": job.report.run_id, "step": str(step)})
    return {(str(s.metadata["group_id"]), int(s.metadata["sample"])): s.rollout_id
            for s in summaries if s.mode == "train" and "group_id" in s.metadata and "sample" in s.metadata}
