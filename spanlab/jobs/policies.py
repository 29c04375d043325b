"""A job's policy per role (``policies:``): its adapters added to the trained model and served, and its servable folder.

The framework loads the base model as for any weight-training job, evaluates it and warm-starts it (the full
weights: the gateway routes every role to the base model until its policy is first served). Then
:func:`open_policy_adapters` adds one LoRA adapter per policy (:func:`~spanlab.policies.adapters.multi_adapter_model`)
and pushes each one's first version, before the first training rollout. A run's ``final/`` (and ``step-K/``) is
then the base model as trained (warm start included) with each policy's adapter in ``<folder>/<policy>/`` (a PEFT
folder vLLM serves with ``--enable-lora``) and ``policies.json`` naming the roles, which ``spanlab serve --model
<folder>`` reads to serve the adapters and route each role to its own (docs/multi_policy.md).
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spanlab.engine.served_folder import POLICIES_FILE
from spanlab.errors import ConfigError
from spanlab.policies.serving import PolicyAdapters

if TYPE_CHECKING:
    from collections.abc import Callable

    from torch import nn

    from spanlab.engine.weights import ReplicaWeightSync
    from spanlab.jobs.config import TrainConfig
    from spanlab.policies.config import PoliciesConfig
    from spanlab.store.base import StoreAPI
    from spanlab.training.policy import Policy

logger = logging.getLogger(__name__)


def open_policy_adapters(model: nn.Module, sync: ReplicaWeightSync, store: StoreAPI, policies: PoliciesConfig, *,
                         engine_model: str, run_dir: Path,
                         on_served: Callable[[str, str | None], None]) -> tuple[nn.Module, PolicyAdapters]:
    """``model`` with an adapter per policy, and those adapters each served as their first version (their B is
    zero, so each answers as the model trained so far does). Returns the new model (the caller keeps it in place of
    ``model``) and the adapters' pushes. Once per job: the job keeps both (``Job.open_policies``)."""
    from spanlab.policies.adapters import multi_adapter_model

    model = multi_adapter_model(model, policies)
    start_adapters(model, policies, engine_model)
    adapters = PolicyAdapters(sync, store, policies, run_dir / "policies", on_served=on_served)
    adapters.push_all(model)
    return model, adapters


def start_adapters(model: nn.Module, policies: PoliciesConfig, engine_model: str) -> list[str]:
    """A run whose ``engine.model`` is another run's folder with a policy per role (``policies.json``) goes on from
    those policies: each policy of this config with an adapter folder there starts from its weights (the base
    weights come from the folder as for any run). Without this every adapter would start at B = 0 and the earlier
    run's training would be lost. Returns the policies loaded."""
    from spanlab.engine.model import resolve_model
    from spanlab.policies.adapters import load_adapters

    folder = Path(resolve_model(engine_model))
    if not (folder / POLICIES_FILE).is_file():
        return []
    try:
        loaded = load_adapters(model, folder, list(policies.names))
    except ValueError as exc:
        raise ConfigError(f"engine.model {folder}: {exc}") from exc
    logger.info("policies %s start from their adapters in %s", ", ".join(loaded) or "(none)", folder)
    return loaded


def write_policies_servable(policy: Policy, adapters: PolicyAdapters, config: TrainConfig, tag: str,
                            info: dict[str, Any]) -> Path:
    """``run_dir/tag``: the base model's weights as trained (no adapter merged in: each policy has its own), the
    tokenizer and config, an adapter folder per policy, and ``policies.json``."""
    from spanlab.engine.model import resolve_model
    from spanlab.engine.weights import save_weights
    from spanlab.policies.adapters import base_model_state, save_adapter
    from spanlab.training.export import write_servable

    base_dir = config.run_dir / f".{tag}-base-weights"
    try:
        save_weights(base_model_state(policy.model), base_dir)
        versions = {name: served.version for name, served in adapters.served.items()}
        out = write_servable(policy.model, resolve_model(config.engine.model), config.run_dir / tag,
                             merge_lora=False, info={**info, "policy_versions": versions}, weights_dir=base_dir,
                             tokenizer=policy.tokenizer)
    finally:
        shutil.rmtree(base_dir, ignore_errors=True)
    for name in adapters.policies.names:
        folder = save_adapter(policy.model, name, out / name)
        for f in folder.iterdir():  # safetensors writes 0600; a model folder is for others to serve too
            f.chmod(0o644)
    (out / POLICIES_FILE).write_text(json.dumps(adapters.policies.model_dump(mode="json"), indent=2) + "\n")
    return out
