"""A warm start per policy: each adapter trained by SFT on the demonstrations of the roles it answers, and no other.

A shared warm start (the full model on the writer's demonstrations) teaches every role the writer's job: the
checker then answers with SQL instead of a verdict. Here each policy's adapter is made the active one
(``set_adapter``, which also makes it the only trainable one, as in :mod:`spanlab.policies.training`) and trained
on its own roles' demonstrations, so the other adapters and the base weights stay as they were, bit for bit. A
policy that answers several roles (one adapter shared by every role) is trained on all of their demonstrations
at once, shuffled together, so learning one role's job does not make it forget another's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from spanlab.adapters.samples import Sample
from spanlab.policies.config import PoliciesConfig
from spanlab.policies.training import for_each_policy
from spanlab.progress import PhaseProgress
from spanlab.training.settings import SFTConfig
from spanlab.training.supervised import sft_train

__all__ = ["demos_by_policy", "warm_start_policies"]


def demos_by_policy(by_role: Mapping[str, Sequence[Sample]], policies: PoliciesConfig) -> dict[str, list[Sample]]:
    """Each policy's demonstrations: those of the roles it answers (``policies.policy_for``), in role order. Roles
    answered by the base model (no policy) are left out: the base model is not trained here."""
    out: dict[str, list[Sample]] = {}
    for role, samples in by_role.items():
        policy = policies.policy_for(role)
        if policy is not None and samples:
            out.setdefault(policy, []).extend(samples)
    return {policy: out[policy] for policy in policies.names if policy in out}


def warm_start_policies(model: Any, samples: Mapping[str, Sequence[Sample]], config: SFTConfig, *, pad_id: int,
                        progress: PhaseProgress | None = None) -> dict[str, float]:
    """SFT of each policy's adapter on its own samples (``demos_by_policy``); metrics as ``<policy>/<key>``.

    The adapter active before is active again afterwards."""
    def train(policy: str, policy_samples: list[Sample]) -> dict[str, float]:
        return sft_train(model, policy_samples, config, pad_id=pad_id, progress=progress,
                         label=f"warm start ({policy})")

    return for_each_policy(model, samples, train)
