"""What ``spanlab train --check`` checks against the model and the agent, not the config alone.

A config can be valid in every key and still never train what it says: LoRA ``target_modules`` the model has
no layer of (peft fails only after the engine start, the base evaluation and the warm start; one bad name beside a
good one trains the good one alone), or ``agents``/``policies.roles`` naming a role the agent never calls with
(that role's samples, and its policy's, are always empty). Each is one line naming the key, before anything starts.
"""

from __future__ import annotations

import logging
from pathlib import Path

from spanlab.errors import ConfigError, one_line
from spanlab.jobs.algorithm import Algorithm
from spanlab.jobs.config import TrainConfig
from spanlab.runner.agent import Agent
from spanlab.training.settings import LoraConfig

logger = logging.getLogger(__name__)


def check_lora_targets(config: TrainConfig, algorithm: Algorithm) -> None:
    """Every LoRA of the run (``policies.lora``, each ``lora_per_policy``, the algorithm's own) names layers of
    ``engine.model``. Loads torch only when the run has a LoRA; skipped, with a warning, when the model's
    config cannot be read here (a hub name not in the local cache, the default model not converted yet)."""
    loras: dict[str, LoraConfig] = {}
    if config.policies is not None:
        loras["policies.lora"] = config.policies.lora
        loras.update({f"policies.lora_per_policy.{p}": lora for p, lora in config.policies.lora_per_policy.items()})
    if (own := algorithm.policy_lora()) is not None:
        loras[f"{config.algorithm}.lora"] = own
    if not loras:
        return
    from spanlab.training.lora_targets import model_modules, target_problem

    folder = _model_folder(config.engine.model)
    try:
        modules = model_modules(folder)
    except (OSError, ValueError, KeyError) as exc:
        logger.warning("cannot read the config of %s to check LoRA target_modules (%s); peft checks them when the "
                       "run loads the model", config.engine.model, one_line(exc))
        return
    for key, lora in loras.items():
        if problem := target_problem(lora.target_modules, modules):
            raise ConfigError(f"{key}.target_modules: {problem}")


def check_model_folder(config: TrainConfig) -> None:
    """``engine.model``, when it is a folder, holds a model (:func:`~spanlab.jobs.file_checks.model_folder_problem`):
    an empty or wrong folder fails here, not a minute into the engine's start or the trainer's load."""
    from spanlab.jobs.file_checks import model_folder_problem

    if problem := model_folder_problem(config.engine.model):
        raise ConfigError(f"engine.model: {problem}")


def _model_folder(model: str) -> str | Path:
    """Where ``engine.model``'s config is: spanlab's default name -> its converted folder (not converted here:
    that is the run's first minute); a folder or hub name as given."""
    from spanlab.engine.model import DEFAULT_MODEL_ALIASES, default_model_dir

    return default_model_dir() if model in DEFAULT_MODEL_ALIASES else model


def check_roles(config: TrainConfig, agent: Agent) -> None:
    """``agents`` and ``policies.roles`` name roles the agent calls with (when it declares them, ``Agent.roles``)."""
    roles = agent.roles
    if roles is None:
        return
    have = f"its roles: {', '.join(roles)}" if roles else "its calls name no role"
    for key, named, why in (("agents", config.agents or (), "no call would ever be trained"),
                            ("policies.roles", tuple(config.policies.roles) if config.policies else (),
                             "its policy would never answer a call")):
        if unknown := [role for role in named if role not in roles]:
            raise ConfigError(f"{key}: {unknown[0]!r} is not a role of agent {config.agent.name!r} ({have}), so "
                              f"{why}")
