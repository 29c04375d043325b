"""Training a policy per role: each adapter of the multi-adapter model updated on its own roles' samples only.

Only one peft adapter is active at a time; activating a policy's adapter (``set_adapter``) also makes it the only
trainable one, so a forward pass, its gradients and the optimizer step see that policy alone while the other
adapters and the base weights stay as they were, bit for bit. Each policy has its own optimizer (its Adam moments
are its own). The samples of a policy are the calls of the roles it answers (``iter_samples(agents=roles)``; the
default policy's include the roles the map leaves out), so the logprobs it trains on are those of the adapter that
sampled them. The update itself is the algorithm's
(``step``: e.g. ``grpo_step``), unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from spanlab.adapters.credit import call_role
from spanlab.adapters.grpo import iter_samples
from spanlab.adapters.samples import Sample
from spanlab.policies.config import PoliciesConfig
from spanlab.store.base import StoreAPI

PolicyStep = Callable[[nn.Module, torch.optim.Optimizer, list[Sample]], dict[str, float]]


def policy_parameters(model: nn.Module, policy: str) -> list[nn.Parameter]:
    """The LoRA weights of ``policy``'s adapter (peft names them ``...lora_A.<policy>.weight``)."""
    params = [p for name, p in model.named_parameters()
              if policy in (parts := name.split(".")) and any(part.startswith("lora_") for part in parts)]
    if not params:
        raise KeyError(f"the model has no LoRA weights of policy {policy!r}")
    return params


def policy_optimizers(model: nn.Module, policies: Sequence[str],
                      make_optimizer: Callable[[list[nn.Parameter]], torch.optim.Optimizer]
                      ) -> dict[str, torch.optim.Optimizer]:
    """One optimizer per policy, over that policy's adapter only."""
    return {policy: make_optimizer(policy_parameters(model, policy)) for policy in policies}


def samples_by_policy(store: StoreAPI, rollout_ids: Sequence[str], policies: PoliciesConfig, *,
                      agents: Sequence[str] | None = None, **adapter_options: Any) -> dict[str, list[Sample]]:
    """Each policy's samples of these rollouts: the calls of the roles it answers, as the gateway routed them.

    ``policies.default`` answers, besides its own roles, every role the map leaves out and the calls that name no
    role, so it gets those calls too (read from the rollouts' spans: which roles called). ``agents``: only
    these roles are trained at all (the train config's ``agents``); a policy left without roles gets no entry."""
    trained = None if agents is None else set(agents)
    unmapped = _roles_called(store, rollout_ids) - set(policies.roles) if policies.default else set()
    out: dict[str, list[Sample]] = {}
    for policy in policies.names:
        roles = set(policies.roles_of(policy)) | (unmapped if policy == policies.default else set())
        if trained is not None:
            roles &= trained
        if roles:
            out[policy] = list(iter_samples(store, list(rollout_ids), agents=sorted(roles), **adapter_options))
    return out


def _roles_called(store: StoreAPI, rollout_ids: Sequence[str]) -> set[str]:
    """The roles of these rollouts' calls; ``""`` stands for calls that name none (as ``iter_samples`` reads them)."""
    if not rollout_ids:
        return set()
    tbl = store.spans_table(rollout_ids=list(rollout_ids), kinds=["llm_call"], columns=["attributes"])
    return {call_role(attrs) for attrs in tbl["attributes"].to_pylist()}


def step_each_policy(model: Any, optimizers: Mapping[str, torch.optim.Optimizer],
                     samples: Mapping[str, list[Sample]], step: PolicyStep) -> dict[str, float]:
    """``step`` once per policy with samples, on its own adapter and optimizer; metrics as ``<policy>/<key>``.

    The adapter active before is active again afterwards (the engine-facing code may read it)."""
    before = model.active_adapter
    metrics: dict[str, float] = {}
    try:
        for policy, policy_samples in samples.items():
            if not policy_samples:
                continue
            model.set_adapter(policy)
            metrics |= {f"{policy}/{k}": v for k, v in step(model, optimizers[policy], policy_samples).items()}
    finally:
        model.set_adapter(before)
    return metrics
