"""``warm_start.role_demos: mined``: every role of a multi-agent agent warm-started on demonstrations of its own job.

Three stages, each through the parts a run already has:

1. the task set's generated demonstrations (:meth:`~spanlab.jobs.parts.Demonstrations.warm_start`, e.g. the SQL
   writer's) train the role they answer, so the next stage's drafts are worth mining: the full model, or with
   ``policies`` only the adapter of the policy answering that role;
2. the job runs ``warm_start.mine_tasks`` train tasks once each, recorded like any rollout, and the task set
   mines the other roles' demonstrations from them (``mine_demonstrations``: the checker's verdicts, the
   rewriter's fixes), filtered per role by SFT's reward filter (:mod:`spanlab.adapters.role_demos`), stored as
   ``demonstration`` spans (``source: warm_start.<role>``, with ``role`` and ``label``) and read back, so the
   warm start trains on exactly what the store holds;
3. each policy answering a mined role is trained on its own roles' demonstrations only (a policy that also answers
   the generated role gets those again, mixed in, so it keeps that job), and pushed. Without ``policies`` the
   full model is trained on every role's demonstrations together.

Held-out tasks are never mined: the rollouts come from the train split.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from spanlab.errors import ConfigError

if TYPE_CHECKING:  # the trainer's parts (torch) are imported when a warm start runs, never by --check
    from spanlab.adapters.samples import Sample
    from spanlab.jobs.config import TrainConfig
    from spanlab.jobs.job import Job
    from spanlab.jobs.tasks import TaskSet

logger = logging.getLogger(__name__)

SOURCE = "warm_start"  # a role's mined demonstrations are stored as source warm_start.<role>


def check_role_demos(config: TrainConfig, task_set: TaskSet) -> None:
    """``role_demos: mined`` needs a task set that mines (and says which role its generated demonstrations are)."""
    ws = config.warm_start
    if ws is None or ws.role_demos != "mined":
        return
    if task_set.demonstrated_role is None or task_set.mine_demonstrations is None:
        raise ConfigError(f"warm_start.role_demos: task set {task_set.name!r} mines no role demonstrations (sql "
                          "does); use role_demos: generated")


def mined_demonstrations(job: Job) -> tuple[dict[str, list[Sample]], dict[str, float]]:
    """Run the mining tasks, mine and filter each role's demonstrations, record them; each role's as stored."""
    from spanlab.adapters.demonstrations import read_demonstrations, record_demonstrations
    from spanlab.adapters.filtered_dataset import FilterConfig
    from spanlab.adapters.recorded_rollouts import read_rollouts
    from spanlab.adapters.role_demos import role_sets

    ws, store, run_id = job.config.warm_start, job.rig.store, job.report.run_id
    assert ws is not None and job.policy is not None and job.task_set.mine_demonstrations is not None
    tasks = job.splits["train"][: ws.mined_tasks]
    batch = job.collect(tasks, purpose="mine_role_demos")
    try:
        demos = job.task_set.mine_demonstrations(read_rollouts(store, batch.rollout_ids))
    except ValueError as exc:
        raise ConfigError(f"warm_start.role_demos: {exc}") from exc
    sets = role_sets(demos, job.policy.tokenizer, FilterConfig(max_len=ws.max_len))
    by_role: dict[str, list[Sample]] = {}
    metrics: dict[str, float] = {"mine_rollouts": float(len(batch.rollout_ids)), "mine_reward": batch.mean_reward}
    for role, found in sets.items():
        source = f"{SOURCE}.{role}"
        record_demonstrations(store, found.samples, [d.task for d in found.demos], model=job.config.engine.model,
                              source=source, run_id=run_id, conversations=[d.messages for d in found.demos],
                              extras=[{"role": role, "label": d.label} for d in found.demos])
        by_role[role] = read_demonstrations(store, run_id=run_id, sources=[source])
        labels = sorted({d.label for d in found.demos})
        metrics |= found.metrics(role) | {f"{role}/demos_{label}": float(sum(d.label == label for d in found.demos))
                                          for label in labels}
        logger.info("warm start: %d %s demonstrations mined (%s)", len(by_role[role]), role,
                    ", ".join(f"{label} {sum(d.label == label for d in found.demos)}" for label in labels))
    return by_role, metrics


def role_warm_start(job: Job) -> dict[str, float]:
    """The three stages (module doc); the metrics of each, namespaced by stage and policy."""
    from spanlab.policies.warm_start import demos_by_policy, warm_start_policies
    from spanlab.training.policy import warm_start

    ws, policy, policies = job.config.warm_start, job.policy, job.config.policies
    role = job.task_set.demonstrated_role
    assert ws is not None and policy is not None and role is not None
    generated = job.demonstrations.warm_start()
    metrics: dict[str, float] = {}
    if policies is None:
        metrics |= {f"generated/{k}": v for k, v in warm_start(policy, generated, ws, progress=job.progress).items()}
    else:
        adapters = job.open_policies()
        first = demos_by_policy({role: generated}, policies)
        metrics |= {f"generated/{k}": v for k, v in warm_start_policies(policy.model, first, ws, pad_id=policy.pad_id,
                                                                         progress=job.progress).items()}
        for name in first:
            adapters.push(policy.model, name)
    by_role, mined = mined_demonstrations(job)
    metrics |= {f"mined/{k}": v for k, v in mined.items()}
    if policies is None:
        every = [*generated, *(s for role_samples in by_role.values() for s in role_samples)]
        return metrics | {f"roles/{k}": v for k, v in warm_start(policy, every, ws, progress=job.progress).items()}
    mined_policies = {policies.policy_for(r) for r in by_role}
    second = {p: s for p, s in demos_by_policy({**by_role, role: generated}, policies).items() if p in mined_policies}
    metrics |= {f"roles/{k}": v for k, v in warm_start_policies(policy.model, second, ws, pad_id=policy.pad_id,
                                                                 progress=job.progress).items()}
    for name in second:
        metrics[f"roles/{name}/sync_s"] = adapters.push(policy.model, name).timing.total_s
    return metrics
