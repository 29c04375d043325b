"""``prompt: FILE.poml`` in a train config: the prompt a run starts from, for any algorithm that trains weights.

Why a config key: an agent that reads a ``prompt`` resource (calc, rooms) renders its prompt from the
latest version of that resource whenever a rollout pins none, which is every rollout of GRPO, SFT and the
framework's held-out evaluation. Storing the file as that latest version before the base evaluation makes
the whole run, evaluations included, use it: how "APO, then GRPO" starts GRPO from APO's winner. APO pins
its own versions and starts from ``apo.prompt``, so the key is refused there.
"""

from __future__ import annotations

import importlib
import logging
from typing import TYPE_CHECKING

from spanlab.errors import ConfigError
from spanlab.jobs.tasks import TASK_SETS
from spanlab.prompts import check_template, template_sha

if TYPE_CHECKING:
    from spanlab.jobs.config import TrainConfig
    from spanlab.store import StoreAPI

logger = logging.getLogger(__name__)

RESOURCE = "prompt"  # the resource name the agents and APO read a prompt template from by default


def check_prompt(config: TrainConfig) -> str | None:
    """The template of ``config.prompt`` (None without one), checked like an APO candidate; ConfigError if bad."""
    if config.prompt is None:
        return None
    if config.algorithm == "apo":
        raise ConfigError("prompt: APO starts from apo.prompt; give the file there")
    template = config.prompt.read_text()
    module = importlib.import_module(TASK_SETS.get(config.dataset.name, config.dataset.name))
    required = getattr(module, "REQUIRED_VARIABLES", None) or ()
    problems = check_template(template, required)
    if problems:
        raise ConfigError(f"prompt: {config.prompt} fails the prompt checks: " + "; ".join(problems))
    return template


def store_prompt(store: StoreAPI, template: str, name: str = RESOURCE, **provenance: str) -> int:
    """Make ``template`` the latest version of the ``name`` resource (a new version unless it is already)."""
    versions = store.list_resources(name)
    sha = template_sha(template)
    if versions and (versions[-1].payload.get("sha256") or template_sha(versions[-1].payload["template"])) == sha:
        return int(versions[-1].version or 0)
    res = store.add_resource(name, {"template": template, "sha256": sha, "origin": "config", **provenance},
                             kind="prompt_template")
    logger.info("prompt: %s@%s (%s) is the version every unpinned rollout runs with", name, res.version,
                provenance.get("file") or provenance.get("origin", "config"))
    return int(res.version or 0)
