"""``dataset.kwargs`` of the reasoning_gym task set: which families, how often each, with what settings.

    dataset:
      name: reasoning_gym
      levels: [1, 2]
      kwargs:
        tasks: [chain_sum, basic_arithmetic]
        weights: {chain_sum: 2, basic_arithmetic: 1}   # or a list in the order of tasks; default equal
        config: {chain_sum: {max_terms: 3}}             # a family's own settings, over its level's
        held_out: [leg_counting, count_bits]            # the held_out split: families never trained

Checked when built (the task set builds it on every ``make_tasks`` call, so ``spanlab train --check`` refuses a
bad family or setting before an engine starts).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from spanlab.tasksets.reasoning_gym.families import check_family, check_settings


class ReasoningGymOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    tasks: tuple[str, ...] = Field(min_length=1, description="families of the train, val and test splits")
    weights: tuple[float, ...] | dict[str, float] | None = Field(
        default=None, description="each family's share of the tasks (default equal)")
    config: dict[str, dict[str, Any]] = Field(default_factory=dict, description="per family, its own settings "
                                              "(over those its level sets)")
    held_out: tuple[str, ...] = Field(default=(), description="families of the held_out split only, never trained")

    @field_validator("tasks", "held_out")
    @classmethod
    def _known_families(cls, names: tuple[str, ...]) -> tuple[str, ...]:
        for name in names:
            check_family(name)
        if twice := sorted({n for n in names if names.count(n) > 1}):
            raise ValueError(f"family {twice[0]!r} is listed twice")
        return names

    @model_validator(mode="after")
    def _consistent(self) -> ReasoningGymOptions:
        if both := sorted(set(self.tasks) & set(self.held_out)):
            raise ValueError(f"held_out: {both[0]!r} is also in tasks (a held-out family is never trained)")
        for family, settings in self.config.items():
            if family not in self.tasks and family not in self.held_out:
                raise ValueError(f"config.{family}: not in tasks or held_out")
            check_settings(family, settings, f"dataset.kwargs.config.{family}")
        weights = self.family_weights
        if set(weights) != set(self.tasks) or not all(0 < w < float("inf") for w in weights.values()):
            raise ValueError(f"weights: one positive number per family of tasks {list(self.tasks)}, got {self.weights}")
        return self

    @property
    def family_weights(self) -> dict[str, float]:
        """Each train family's weight (equal when ``weights`` is not given)."""
        if self.weights is None:
            return dict.fromkeys(self.tasks, 1.0)
        if isinstance(self.weights, dict):
            return dict(self.weights)
        return dict(zip(self.tasks, self.weights, strict=True)) if len(self.weights) == len(self.tasks) else {}
