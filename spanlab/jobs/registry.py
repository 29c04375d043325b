"""Algorithms by the name a config gives them: the built-ins, then the entry point group ``spanlab.algorithms``.

Entries are import paths, resolved only for the algorithm a config chooses, so choosing one never
imports another's dependencies (APO never imports torch). A third-party package registers with::

    [project.entry-points."spanlab.algorithms"]
    best_of_n = "my_package.algorithm:BestOfN"
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points

from spanlab.errors import ConfigError
from spanlab.jobs.algorithm import Algorithm

GROUP = "spanlab.algorithms"

BUILTIN: dict[str, str] = {
    "apo": "spanlab.algos.apo.algorithm:APO",
    "grpo": "spanlab.algos.grpo.algorithm:GRPO",
    "sft": "spanlab.algos.sft.algorithm:SFTRounds",
}


def available() -> dict[str, str]:
    """``name -> "module:Class"`` of every algorithm a config can choose (a built-in name cannot be taken)."""
    plugins = {ep.name: ep.value for ep in entry_points(group=GROUP)}
    return {**plugins, **BUILTIN}


def load_algorithm(name: str) -> type[Algorithm]:
    """The class registered as ``name``; an unknown name or a broken plugin is a ConfigError naming it."""
    known = available()
    if name not in known:
        raise ConfigError(f"algorithm: unknown algorithm {name!r}; known: {', '.join(sorted(known))}")
    module, _, attr = known[name].partition(":")
    try:
        cls = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"algorithm: cannot load {name!r} from {known[name]}: {exc}") from exc
    if not (isinstance(cls, type) and issubclass(cls, Algorithm)):
        raise ConfigError(f"algorithm: {known[name]} is not a spanlab.jobs.algorithm.Algorithm subclass")
    return cls
