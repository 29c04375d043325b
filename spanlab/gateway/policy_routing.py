"""Which served model answers a call: the LoRA adapter of the policy its role maps to (``policies``).

Every policy is served by the same vLLM as an adapter named after the policy, so routing is rewriting the
request's ``model`` to that name before the call is sent on (in TITO mode too: its sessions read the same body).
The version each policy serves is told to the gateway after each hot-load (:meth:`PolicyRouter.set_version`), so
each span records which policy answered it and which version of it (``attributes.policy``, ``policy_version``).
A role the map does not name, and a call that names no role, goes to ``policies.default`` or else to the base
model (recorded as policy ``base``). So does a role whose policy no engine serves yet (no version told): before its
first push a policy is the base model anyway (peft starts each adapter at B = 0), and a job evaluates the base and
warm-starts it before its adapters are pushed, when the engine knows no adapter of that name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from spanlab.policies.config import BASE, PoliciesConfig


@dataclass(frozen=True, slots=True)
class PolicyRoute:
    """Where one call goes: the policy (``base``: the model the agent asked for) and the version it serves."""

    policy: str
    version: str | None

    def body_for(self, body: dict[str, Any]) -> dict[str, Any]:
        """The request as the engine gets it: ``model`` names the policy's adapter (the base: as the agent sent)."""
        return body if self.policy == BASE else {**body, "model": self.policy}


class PolicyRouter:
    """Roles -> policies, and the adapter version each policy serves now."""

    def __init__(self, policies: PoliciesConfig) -> None:
        self.policies = policies
        self.versions: dict[str, str | None] = dict.fromkeys(policies.names)

    def route(self, agent: str | None) -> PolicyRoute:
        policy = self.policies.policy_for(agent)
        if policy is None or self.versions[policy] is None:  # no policy, or not served yet: the base model
            return PolicyRoute(BASE, None)
        return PolicyRoute(policy, self.versions[policy])

    def set_version(self, policy: str, version: str | None) -> None:
        """Record that ``policy``'s adapter is served at ``version`` now (after each hot-load)."""
        if policy not in self.versions:
            raise KeyError(f"{policy!r} is not one of the gateway's policies: {sorted(self.versions)}")
        self.versions[policy] = version
