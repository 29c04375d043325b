"""Serving each policy's adapter: write a new version, hot-load it into every engine, record it, tell the gateway.

vLLM replaces a served adapter under the same name (``/v1/load_lora_adapter`` with ``load_inplace``), so a
policy keeps one served name (its own) across versions, and the gateway keeps routing its roles there. Each
version is a ``lora_adapter`` resource ``policy/<name>`` in the store (the store numbers the versions), whose
payload names the folder, the roles it answers and the version tag spans record (``attributes.policy_version``).
Rollouts queued after a push carry the version they were sampled from.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spanlab.engine.weights import ReplicaWeightSync, SyncTiming
from spanlab.policies.adapters import save_adapter
from spanlab.policies.config import PoliciesConfig
from spanlab.store.base import StoreAPI
from spanlab.types import version_tag

logger = logging.getLogger(__name__)

RESOURCE_PREFIX = "policy/"


def resource_name(policy: str) -> str:
    """The store resource whose versions are ``policy``'s adapters."""
    return RESOURCE_PREFIX + policy


@dataclass(frozen=True)
class ServedAdapter:
    """One pushed version of one policy's adapter."""

    policy: str
    version: int
    path: Path
    timing: SyncTiming

    @property
    def tag(self) -> str:
        return version_tag(self.policy, self.version)


class PolicyAdapters:
    """Pushes the adapters of a multi-adapter peft model (:func:`~spanlab.policies.adapters.multi_adapter_model`)
    to the engines, one policy at a time, and records each version.

    ``on_served(policy, tag)`` is called after each push (the gateway's ``set_policy_version``); ``pause``: let
    running requests end on the old adapter first (needs the engines' dev routes, as the async loop's pushes do).
    """

    def __init__(self, sync: ReplicaWeightSync, store: StoreAPI, policies: PoliciesConfig, out_dir: str | Path, *,
                 on_served: Callable[[str, str], None] | None = None, pause: bool = False) -> None:
        self.sync = sync
        self.store = store
        self.policies = policies
        self.out_dir = Path(out_dir)
        self.on_served = on_served
        self.pause = pause
        self.served: dict[str, ServedAdapter] = {}

    def push(self, model: Any, policy: str) -> ServedAdapter:
        """Serve the current weights of ``policy``'s adapter as its next version."""
        version = self._latest_version(policy) + 1
        path = save_adapter(model, policy, self.out_dir / policy / f"v{version}")
        tag = version_tag(policy, version)
        timing = self.sync.load_lora(policy, path, inplace=True, version=tag, pause=self.pause)
        payload = {"policy": policy, "version": version, "tag": tag, "path": str(path.resolve()),
                   "roles": list(self.policies.roles_of(policy)), "method": timing.method,
                   "replicas": dict(self.sync.versions)}
        stored = self.store.add_resource(resource_name(policy), payload, kind="lora_adapter")
        if stored.version != version:  # another writer pushed this policy meanwhile: the tags would not match
            raise RuntimeError(f"policy {policy!r}: stored as version {stored.version}, pushed as {version}; "
                               "one trainer must push each policy")
        served = self.served[policy] = ServedAdapter(policy, version, path, timing)
        if self.on_served is not None:
            self.on_served(policy, tag)
        logger.info("engine serves %s from %s (%.2fs)", tag, path, timing.total_s)
        return served

    def push_all(self, model: Any) -> dict[str, ServedAdapter]:
        """Serve every policy's adapter (the start: each policy's first version)."""
        return {policy: self.push(model, policy) for policy in self.policies.names}

    def _latest_version(self, policy: str) -> int:
        versions = [r.version for r in self.store.list_resources(resource_name(policy))]
        return max(versions, default=0)
