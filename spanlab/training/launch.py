"""Whether this process was started by ``torchrun`` (or ``accelerate launch``, which runs it), and as which rank.

Why read the environment: torchrun's whole interface to the processes it starts is ``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``LOCAL_WORLD_SIZE`` and ``MASTER_ADDR``/``MASTER_PORT`` (where its rendezvous store is), and
``init_process_group(init_method="env://")`` reads the same. Light on import (no torch), so
``spanlab train --check`` can check ``trainer.processes`` against ``WORLD_SIZE`` cheaply.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from spanlab.errors import ConfigError

__all__ = ["Launch", "torchrun_launch"]

_REQUIRED = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class Launch:
    """This process is rank ``rank`` of ``world``, and rank ``local_rank`` of the ``local_world`` on its machine."""

    rank: int
    world: int
    local_rank: int
    local_world: int


def _int(env: Mapping[str, str], key: str, default: int | None = None) -> int:
    raw = env.get(key)
    if raw is None and default is not None:
        return default
    try:
        return int(raw or "")
    except ValueError:
        raise ConfigError(f"{key}: torchrun's environment variable should be an integer, got {raw!r}") from None


def torchrun_launch(env: Mapping[str, str] | None = None) -> Launch | None:
    """The launch torchrun's variables describe, or None when they are not all set (the job started alone)."""
    env = os.environ if env is None else env
    if not all(key in env for key in _REQUIRED):
        return None
    rank, world = _int(env, "RANK"), _int(env, "WORLD_SIZE")
    launch = Launch(rank, world, _int(env, "LOCAL_RANK", rank), _int(env, "LOCAL_WORLD_SIZE", world))
    if not 0 <= launch.rank < launch.world:
        raise ConfigError(f"RANK: {launch.rank} is not a rank of WORLD_SIZE {launch.world}")
    return launch


def with_world(data: dict[str, object], launch: Launch | None) -> dict[str, object]:
    """The raw train config with ``trainer.processes`` set to torchrun's ``WORLD_SIZE`` when it is unset;
    a different count is an error naming the setting (torchrun, not the config, decides how many ranks run)."""
    if launch is None:
        return data
    trainer = data.get("trainer") or {}
    if not isinstance(trainer, dict):
        return data  # the config's validation names the bad section
    given = trainer.get("processes")
    if given is None:
        return {**data, "trainer": {**trainer, "processes": launch.world}}
    if given != launch.world:
        raise ConfigError(f"trainer.processes: {given!r} but torchrun started WORLD_SIZE={launch.world} ranks; "
                          f"set it to {launch.world} or leave it out")
    return data
