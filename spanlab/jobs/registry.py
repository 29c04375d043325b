"""Algorithms by the name a config gives them: the built-ins, then the entry point group ``spanlab.algorithms``.

Entries are import paths, resolved only for the algorithm a config chooses, so choosing one never
imports another's dependencies (APO never imports torch). A third-party package registers with::

    [project.entry-points."spanlab.algorithms"]
    best_of_n = "my_package.algorithm:BestOfN"
"""

from __future__ import annotations

from importlib.metadata import EntryPoint, entry_points

from spanlab.errors import ConfigError, one_line
from spanlab.jobs.algorithm import Algorithm

GROUP = "spanlab.algorithms"

BUILTIN: dict[str, str] = {
    "apo": "spanlab.algos.apo.algorithm:APO",
    "grpo": "spanlab.algos.grpo.algorithm:GRPO",
    "sft": "spanlab.algos.sft.algorithm:SFTRounds",
}


def available() -> dict[str, EntryPoint]:
    """Every algorithm a config can choose, by name (a plugin cannot take a built-in's name)."""
    builtin = {name: EntryPoint(name, value, GROUP) for name, value in BUILTIN.items()}
    return {**{ep.name: ep for ep in entry_points(group=GROUP)}, **builtin}


def load_algorithm(name: str) -> type[Algorithm]:
    """The class registered as ``name``; an unknown name or a plugin that fails in any way (an exception, a
    SyntaxError, ``sys.exit`` at import) is a one-line ConfigError naming it."""
    known = available()
    if name not in known:
        raise ConfigError(f"algorithm: unknown algorithm {name!r}; known: {', '.join(sorted(known))}")
    try:
        cls = known[name].load()
    except (Exception, SystemExit) as exc:  # a plugin's import runs its code: anything may come out of it
        raise ConfigError(f"algorithm: plugin {name!r} ({known[name].value}) failed to load: "
                          f"{one_line(exc)}") from exc
    if not (isinstance(cls, type) and issubclass(cls, Algorithm)):
        raise ConfigError(f"algorithm: {known[name].value} is not a spanlab.jobs.algorithm.Algorithm subclass")
    return cls
