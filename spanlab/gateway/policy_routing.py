"""Which served model answers a call: the LoRA adapter of the policy its role maps to (``policies``).

Every policy is served by the same vLLM as an adapter named after the policy, so routing is rewriting the
request's ``model`` before the call is sent on (in TITO mode too: its sessions read the same body).
The version each policy serves is told to the gateway after each hot-load (:meth:`PolicyRouter.set_version`), so
each span records which policy answered it and which version of it (``attributes.policy``, ``policy_version``).
A role the map does not name, and a call that names no role, goes to ``policies.default`` or else to the base
model (recorded as policy ``base``). So does a role whose policy no engine serves yet (no version told): before its
first push a policy is the base model anyway (peft starts each adapter at B = 0), and a job evaluates the base and
warm-starts it before its adapters are pushed, when the engine knows no adapter of that name.

The ``model`` an agent names never picks the adapter: vLLM serves every adapter under its own name next to the
base, so a role without a policy that asked for ``lora-a`` would otherwise be answered by another role's policy
while its span said ``base``. A call routed to the base model is sent with the base model's served name (learned
once from the engine's ``/v1/models``: the model there with no ``parent``), so the engine serves, and the span
records (``llm.model``), exactly what the route says; ``attributes.requested_model`` keeps what the agent asked
for when it was something else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from spanlab.gateway.protocol import loads
from spanlab.gateway.upstream import UpstreamClient
from spanlab.policies.config import BASE, PoliciesConfig


@dataclass(frozen=True, slots=True)
class PolicyRoute:
    """Where one call goes: the policy (``base``: the base model) and the adapter version it serves."""

    policy: str
    version: str | None

    def model(self, base_model: str) -> str:
        """The served model name the engine gets as ``model``: the policy's adapter, or ``base_model``."""
        return base_model if self.policy == BASE else self.policy


class PolicyRouter:
    """Roles -> policies, the adapter version each policy serves now, and the base model's served name."""

    def __init__(self, policies: PoliciesConfig) -> None:
        self.policies = policies
        self.versions: dict[str, str | None] = dict.fromkeys(policies.names)
        self.base_model: str | None = None  # learned from the engine on the first call routed to the base

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

    async def served_model(self, route: PolicyRoute, client: UpstreamClient) -> str:
        """The ``model`` to send for ``route``; the base model's name is asked of ``client`` once, then kept.
        Raises :class:`~spanlab.gateway.upstream.UpstreamError` when the engine does not answer, ValueError when
        its answer names no base model."""
        if route.policy != BASE:
            return route.policy
        if self.base_model is None:
            resp = await client.send("GET", "/v1/models")
            status, raw = resp.status, await client.read(resp)
            self.base_model = base_model_of(status, raw, client.base_url)
        return self.base_model


def base_model_of(status: int, raw: bytes, url: str) -> str:
    """The base model's served name in an engine's ``/v1/models`` answer: the first model with no ``parent``
    (vLLM lists each LoRA adapter with its base as ``parent``)."""
    try:
        data: Any = loads(raw) if status == 200 else None
    except ValueError:
        data = None
    models = data.get("data") if isinstance(data, dict) else None
    for model in models if isinstance(models, list) else ():
        if isinstance(model, dict) and isinstance(model.get("id"), str) and model.get("parent") is None:
            return model["id"]
    raise ValueError(f"the engine at {url} names no base model in /v1/models (HTTP {status}): {raw[:200]!r}")
