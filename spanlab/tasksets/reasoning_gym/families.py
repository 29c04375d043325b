"""reasoning-gym's families as spanlab sees them: names, the settings each level maps to, datasets built safely.

Why a wrapper: reasoning-gym reports a bad name, a bad setting or a missing data file as whatever its code
raises (``ValueError``, ``TypeError``, ``AssertionError``, ``FileNotFoundError``), and ``spanlab train --check``
must refuse each in one line naming the family. Levels: level ``L`` is the family's curriculum at global level
``L - 1`` (``BaseCurriculum.set_global_level``: an attribute with fewer levels stays at its hardest), so level
1 is the family's easiest curriculum step; a family without a curriculum has its default settings at every level.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from typing import Any

from spanlab.config_errors import did_you_mean
from spanlab.errors import ConfigError, one_line

# Not families a task set can name: ``composite`` mixes other families, which ``tasks`` + ``weights`` already do.
NOT_FAMILIES = {"composite": "composite mixes families: list them in tasks (with weights) instead"}
LEVELS = tuple(range(1, 11))  # accepted dataset.levels; a family with fewer curriculum levels stays at its hardest
RESERVED_SETTINGS = ("seed", "size")  # the task set owns these: splits come from disjoint seeds


def _registry() -> tuple[dict[str, Any], dict[str, Any]]:
    try:
        from reasoning_gym.factory import CURRICULA, DATASETS
    except ImportError as exc:
        raise ConfigError("dataset.name: reasoning_gym needs the reasoning-gym package (the `agents` extra: "
                          f"pip install 'spanlab[agents]'): {exc}") from exc
    return DATASETS, CURRICULA


def family_names() -> list[str]:
    """Every family a config may name (the package's registered datasets but the composite)."""
    return sorted(set(_registry()[0]) - set(NOT_FAMILIES))


def check_family(name: str) -> None:
    """ValueError unless ``name`` is a family (with a did-you-mean from the package's names)."""
    if name in NOT_FAMILIES:
        raise ValueError(f"{name!r}: {NOT_FAMILIES[name]}")
    names = family_names()
    if name not in names:
        hint = did_you_mean(name, names) or f"{len(names)} families, e.g. {', '.join(names[:4])}"
        raise ValueError(f"unknown reasoning-gym family {name!r}; {hint}")


def setting_names(family: str) -> list[str]:
    """The fields of the family's config dataclass (what ``config: {family: {...}}`` may set)."""
    return [f.name for f in dataclasses.fields(_registry()[0][family][1]) if f.name not in RESERVED_SETTINGS]


def check_settings(family: str, settings: dict[str, Any], key: str) -> None:
    """ConfigError for a setting the family's config has no field for (did-you-mean) or one the task set owns."""
    names = setting_names(family)
    for name in settings:
        if name in RESERVED_SETTINGS:
            raise ConfigError(f"{key}.{name}: set by the task set (splits come from disjoint seeds); use dataset.seed")
        if name not in names:
            hint = did_you_mean(name, names, n=2) or f"settings: {', '.join(names)}"
            raise ConfigError(f"{key}.{name}: {family} has no such setting; {hint}")


@functools.lru_cache(maxsize=1024)
def _level_settings(family: str, level: int) -> str:
    curricula = _registry()[1]
    if family not in curricula:
        return "{}"
    from reasoning_gym.factory import create_curriculum

    curriculum = create_curriculum(family)
    curriculum.set_global_level(level - 1)
    config = curriculum.generate_configuration({"seed": 0, "size": 1})
    fields: list[str] = []
    for attr in curriculum.attributes.values():
        fields += [n for n in (getattr(attr, "lower_field_name", None), getattr(attr, "upper_field_name", None),
                               getattr(attr, "field_name", None)) if n]
    return json.dumps({name: getattr(config, name) for name in fields}, default=list)


def level_settings(family: str, level: int) -> dict[str, Any]:
    """The config fields the family's curriculum sets at ``level`` (1-based; {} for a family without one)."""
    return json.loads(_level_settings(family, level))


def build_dataset(family: str, settings: dict[str, Any], seed: int, size: int, key: str) -> Any:
    """The family's ``ProceduralDataset`` with ``settings``; ConfigError naming ``key`` when the family refuses
    them or cannot generate (a data file the package does not ship, an import it lacks): one item is generated."""
    import reasoning_gym

    try:
        dataset = reasoning_gym.create_dataset(family, seed=seed, size=max(size, 1), **settings)
        dataset[0]  # a family that reads data files or needs more packages fails here, not mid-run
    except (OSError, ImportError) as exc:
        raise ConfigError(f"{key}: {family} needs data or a package that reasoning-gym does not ship: "
                          f"{one_line(exc, 200)}") from exc
    except Exception as exc:  # reasoning-gym signals bad settings with asserts, TypeErrors and ValueErrors
        raise ConfigError(f"{key}: {family} refuses settings {json.dumps(settings, default=str)}: "
                          f"{one_line(exc, 200)}") from exc
    return dataset
