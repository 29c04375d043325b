"""Training a policy per role: each adapter of the multi-adapter model updated on its own roles' samples only.

Only one peft adapter is active at a time; activating a policy's adapter (``set_adapter``) also makes it the only
trainable one, so a forward pass, its gradients and the optimizer step see that policy alone while the other
adapters and the base weights stay as they were, bit for bit. Each policy has its own optimizer (its Adam moments
are its own). The samples of a policy are the calls of the roles it answers (one ``iter_samples`` read, split by
role; the default policy's include the roles the map leaves out), so the logprobs it trains on are those of the
adapter that sampled them. The update itself is the algorithm's
(``step``: e.g. ``grpo_step``), unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from spanlab.adapters.sample_reader import iter_samples
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
    """Each policy's samples of these rollouts as the adapter reads them from ``store``
    (:func:`split_by_policy`)."""
    def read(roles: Sequence[str] | None) -> Iterable[Sample]:
        return iter_samples(store, list(rollout_ids), agents=roles, **adapter_options)

    return split_by_policy(read, policies, agents=agents)


def split_by_policy(read: Callable[[Sequence[str] | None], Iterable[Sample]], policies: PoliciesConfig, *,
                    agents: Sequence[str] | None = None) -> dict[str, list[Sample]]:
    """Each policy's samples of a step: the calls of the roles it answers, as the gateway routed them. ``read(roles)``
    gives the step's samples of those roles (None: every role).

    ``policies.default`` answers, besides its own roles, every role the map leaves out and the calls that name no
    role, so it gets those calls too. ``agents``: only these roles are trained at all (the train config's
    ``agents``); a policy left without roles gets no entry (the default gets one when any call fell to it).

    One read of the store for every policy, split by each sample's role: the adapter's samples of a role do not
    depend on which other roles are read with it (rewards, groups and TITO sessions are per attempt and role), and
    the order within a policy is the read's order."""
    trained = None if agents is None else set(agents)
    mapped = {policy: set(policies.roles_of(policy)) & (trained if trained is not None else set(policies.roles))
              for policy in policies.names}
    out: dict[str, list[Sample]] = {policy: [] for policy, roles in mapped.items() if roles}
    if not out and policies.default is None:
        return out
    roles = sorted(trained) if trained is not None else None
    if policies.default is None:  # the base model answers the other calls: never read them
        roles = sorted(set().union(*mapped.values()))
    for sample in read(roles):
        if trained is not None and sample.role not in trained:
            continue
        policy = policies.policy_for(sample.role)
        if policy is not None:
            out.setdefault(policy, []).append(sample)
    return {policy: out[policy] for policy in policies.names if policy in out}


def for_each_policy(model: Any, samples: Mapping[str, Sequence[Sample]],
                    train: Callable[[str, list[Sample]], dict[str, float]]) -> dict[str, float]:
    """``train(policy, samples)`` once per policy with samples, its adapter the active (and only trainable) one;
    metrics as ``<policy>/<key>``. The adapter active before is active again afterwards (the engine-facing code
    may read it)."""
    before = model.active_adapter
    metrics: dict[str, float] = {}
    try:
        for policy, policy_samples in samples.items():
            if not policy_samples:
                continue
            model.set_adapter(policy)
            metrics |= {f"{policy}/{k}": v for k, v in train(policy, list(policy_samples)).items()}
    finally:
        model.set_adapter(before)
    return metrics


def step_each_policy(model: Any, optimizers: Mapping[str, torch.optim.Optimizer],
                     samples: Mapping[str, list[Sample]], step: PolicyStep) -> dict[str, float]:
    """``step`` once per policy with samples, on its own adapter and optimizer (:func:`for_each_policy`)."""
    return for_each_policy(model, samples, lambda policy, s: step(model, optimizers[policy], s))
