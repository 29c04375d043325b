"""Which policy answers each agent role, and the LoRA shape of each policy.

A multi-agent attempt names its role in every call (``attributes.agent``). ``policies.roles`` maps roles to
policies; several roles may share one. Each policy is a LoRA adapter of the one base model, served by the same
vLLM under the policy's own name (vLLM's multi-LoRA), so a role's calls go to its adapter by that name. Without
``policies`` every role shares one policy, as before. Nothing here imports torch or talks to an engine.

    policies:
      roles: {writer: lora-a, checker: lora-b, rewriter: lora-a}
      default: null            # roles not listed and calls naming no role: the base model
      lora: {rank: 8, alpha: 16}
      lora_per_policy: {lora-b: {rank: 4, alpha: 8}}
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from spanlab.training.settings import LoraConfig

# The same names the gateway takes for a role in the URL (spanlab.gateway.attribution.AGENT_NAME).
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
# A policy also names a peft adapter, a key of torch module dicts, where '.' separates submodules.
POLICY_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
BASE = "base"  # what spans record as their policy when a call goes to the base model
# The ranks vLLM accepts for --max-lora-rank (vllm.config.lora.MaxLoRARanks); an adapter's rank may be lower.
VLLM_MAX_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


class PoliciesConfig(BaseModel):
    """Roles -> policies, and each policy's LoRA settings (shared ``lora``, overridden per policy)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    roles: dict[str, str] = Field(min_length=1, description="agent role -> policy name; several roles may share one")
    default: str | None = Field(default=None, description="the policy of roles not listed and of calls naming no "
                                "role; None: the base model answers them")
    lora: LoraConfig = Field(default_factory=LoraConfig, description="LoRA settings every policy shares")
    lora_per_policy: dict[str, LoraConfig] = Field(default_factory=dict,
                                                   description="a policy's own LoRA settings, in place of `lora`")
    init_seed: int = Field(default=0, description="seed of the adapters' random A matrices (B starts at zero)")

    @model_validator(mode="before")
    @classmethod
    def _roles_under_roles(cls, data: Any) -> Any:
        """``policies: {writer: lora-a}`` (the map at the top) is the likely slip; say where it goes."""
        if isinstance(data, dict) and "roles" not in data and data and all(isinstance(v, str) for v in data.values()):
            first = next(iter(data))
            raise ValueError(f"put the role -> policy map under roles, e.g. policies: {{roles: {{{first}: "
                             f"{data[first]}}}}}")
        return data

    @field_validator("roles")
    @classmethod
    def _names(cls, roles: dict[str, str]) -> dict[str, str]:
        for role, policy in roles.items():
            if not NAME.fullmatch(role):
                raise ValueError(f"role {role!r}: use 1-64 letters, digits, '_', '.', '-' (as in the gateway URL)")
            _check_policy_name(policy, f"role {role!r}")
        return roles

    @model_validator(mode="after")
    def _policies_known(self) -> PoliciesConfig:
        if self.default is not None:
            _check_policy_name(self.default, "default")
        if unknown := sorted(set(self.lora_per_policy) - set(self.names)):
            raise ValueError(f"lora_per_policy: {unknown[0]!r} is not a policy of roles or default "
                             f"(policies: {list(self.names)})")
        self.engine_lora()  # a rank vLLM cannot serve fails here
        return self

    @property
    def names(self) -> tuple[str, ...]:
        """Every policy, sorted (the default too, even if no role names it)."""
        return tuple(sorted(set(self.roles.values()) | ({self.default} if self.default else set())))

    def policy_for(self, role: str | None) -> str | None:
        """The policy that answers ``role`` (None: no role named); None means the base model."""
        return self.roles.get(role, self.default) if role is not None else self.default

    def roles_of(self, policy: str) -> tuple[str, ...]:
        """The roles ``policy`` answers (sorted), not counting roles it gets as the default."""
        return tuple(sorted(role for role, p in self.roles.items() if p == policy))

    def lora_for(self, policy: str) -> LoraConfig:
        if policy not in self.names:
            raise KeyError(f"{policy!r} is not a policy (policies: {list(self.names)})")
        return self.lora_per_policy.get(policy, self.lora)

    def engine_lora(self) -> tuple[int, int]:
        """(max_loras, max_lora_rank) a vLLM needs to serve every policy at once: one slot per policy, and the
        smallest rank vLLM accepts that holds the largest adapter."""
        rank = max(self.lora_for(p).rank for p in self.names)
        fitting = [r for r in VLLM_MAX_LORA_RANKS if r >= rank]
        if not fitting:
            raise ValueError(f"LoRA rank {rank} is above the largest vLLM serves ({VLLM_MAX_LORA_RANKS[-1]})")
        return len(self.names), fitting[0]


def engine_lora_settings(policies: PoliciesConfig, max_loras: int = 0, max_lora_rank: int = 0) -> dict[str, Any]:
    """The engine settings that serve every policy's adapter at once, given the engine's own ``max_loras`` and
    ``max_lora_rank`` (0: not set): LoRA on, at least a slot per policy, at least a rank holding the largest
    adapter. The one merge both ``spanlab train`` (its engine) and ``spanlab serve`` (a run's folder) use, so the
    engine a run trained with and the one serving its folder take the same settings."""
    slots, rank = policies.engine_lora()
    return {"enable_lora": True, "max_loras": max(max_loras, slots), "max_lora_rank": max(max_lora_rank, rank)}


def _check_policy_name(policy: str, where: str) -> None:
    if not POLICY_NAME.fullmatch(policy):
        raise ValueError(f"{where}: policy {policy!r}: use 1-64 letters, digits, '_', '-' (it names the adapter in "
                         "peft and in vLLM)")
    if policy == BASE:
        raise ValueError(f"{where}: {BASE!r} names the base model in spans; give the policy another name")
