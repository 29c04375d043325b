"""A run's demonstrations: generated from the task set, recorded in the store, read back for training.

The warm start and GRPO's demonstration term train on what :func:`stored_demonstrations` returns, which is what
the store holds (``demonstration`` spans, :mod:`spanlab.adapters.demonstrations`), not on the generated
conversations directly: every token a run trained on is then in its store, and a resumed run finds the same
demonstrations there instead of generating them again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from spanlab.adapters.conversation import encode_conversation
from spanlab.adapters.demonstrations import read_demonstrations, record_demonstrations
from spanlab.adapters.samples import Sample
from spanlab.errors import ConfigError

if TYPE_CHECKING:
    from spanlab.jobs.job import Job


def stored_demonstrations(job: Job, tasks: list[dict[str, Any]], source: str, *, key: str) -> list[Sample]:
    """The run's demonstrations of ``source``: read from the store when a run (this one, before --resume) recorded
    them, else generated for ``tasks``, recorded and read back. ``key``: the config key named in errors."""
    store, run_id = job.rig.store, job.report.run_id
    if found := read_demonstrations(store, run_id=run_id, sources=[source]):
        return found
    demonstration = job.task_set.demonstration
    if demonstration is None:
        raise ConfigError(f"{key}: task set {job.config.dataset.name!r} has no demonstrations; remove {key}")
    if not tasks:
        raise ConfigError(f"{key}: no train task to demonstrate (check its levels against dataset.levels)")
    assert job.policy is not None, "demonstrations train weights: the framework loads the policy"
    conversations = [demonstration(t) for t in tasks]
    samples = [encode_conversation(job.policy.tokenizer, d["messages"], d.get("tools")) for d in conversations]
    record_demonstrations(store, samples, tasks, model=job.config.engine.model, source=source, run_id=run_id,
                          conversations=[d["messages"] for d in conversations])
    return read_demonstrations(store, run_id=run_id, sources=[source])


def warm_start_demonstrations(job: Job) -> list[Sample]:
    """The warm start's demonstrations (its first ``warm_start.demos`` demo tasks): what it trains on, and what
    GRPO's demonstration term replays in a run that has one."""
    ws = job.config.warm_start
    assert ws is not None, "only a run with a warm start has its demonstrations"
    return stored_demonstrations(job, job.splits["demos"][: ws.demos], "warm_start", key="warm_start")
