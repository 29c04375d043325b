"""Algorithms by the name a config gives them (``algorithm: grpo``); each is ``train(config) -> report``.

Entries are import paths so choosing one algorithm never imports the others' dependencies.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from spanlab.jobs.config import TrainConfig
    from spanlab.jobs.report import TrainReport

ALGORITHMS: dict[str, str] = {
    "apo": "spanlab.algos.apo.algorithm:train_apo",
    "grpo": "spanlab.algos.grpo.loop:train_grpo",
    "sft": "spanlab.algos.sft.rounds:train_sft",
}


def get_algorithm(name: str) -> Callable[..., TrainReport]:
    module, _, attr = ALGORITHMS[name].partition(":")
    return getattr(importlib.import_module(module), attr)


def train(config: TrainConfig, **kwargs: Any) -> TrainReport:
    """Run the algorithm ``config.algorithm`` names."""
    return get_algorithm(config.algorithm)(config, **kwargs)
