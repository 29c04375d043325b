"""The ``apo:`` section of a train config: beam search sizes, task counts, budget, and the optimizer LLM.

Validated when built, so a config that could never run fails before vLLM starts, naming the key.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class OptimizerConfig(_Section):
    """Any OpenAI-compatible endpoint; ``base_url: null`` uses the agent's own engine (weak on CPU)."""

    base_url: str | None = Field(default=None, description="e.g. https://api.openai.com/v1; null: the agent's vLLM")
    base_url_env: str | None = Field(default=None, description="read the base URL from this environment variable")
    api_key_env: str | None = Field(default=None, description="environment variable holding the API key")
    critique_model: str | None = Field(default=None, description="null: the model the engine serves")
    edit_model: str | None = Field(default=None, description="null: critique_model")
    temperature: float = Field(default=0.7, ge=0, description="sampling temperature of critiques and edits")
    max_tokens: int = Field(default=1024, ge=16, description="the longest critique or edited prompt")
    timeout_s: float = Field(default=120.0, gt=0, description="per optimizer call")
    max_retries: int = Field(default=2, ge=0, description="retries of a failed optimizer call")

    @model_validator(mode="after")
    def _one_url(self) -> OptimizerConfig:
        if self.base_url is not None and self.base_url_env is not None:
            raise ValueError("give base_url or base_url_env, not both")
        return self

    def resolved_base_url(self) -> str | None:
        """``base_url``, or the value of ``base_url_env`` (an error if that variable is unset)."""
        if self.base_url_env is None:
            return self.base_url
        url = os.environ.get(self.base_url_env)
        if not url:
            raise ValueError(f"apo.optimizer.base_url_env: environment variable {self.base_url_env} is not set")
        return url

    def api_key(self) -> str:
        """The key from ``api_key_env`` (a local vLLM takes any key)."""
        if self.api_key_env is None:
            return "EMPTY"
        key = os.environ.get(self.api_key_env)
        if not key:
            raise ValueError(f"apo.optimizer.api_key_env: environment variable {self.api_key_env} is not set")
        return key


class DemosConfig(_Section):
    """Worked examples from the best recorded train rollouts, added to the winning prompt (``demos.py``)."""

    k: int = Field(default=3, ge=1, le=32, description="examples per variant")
    candidates: int = Field(default=4, ge=1, le=256, description="variants scored on val")
    min_reward: float = Field(default=1.0, description="a rollout is an example only at or above this reward")
    pool_tasks: int = Field(default=8, ge=0, description="train tasks the winner runs on when too few examples")


class APOConfig(_Section):
    """Beam search over prompt versions with textual gradients (Agent Lightning's APO, REFERENCE.md §5).

    The held-out split (the starting prompt and the winner) is the framework's ``eval`` section.
    """

    prompt: Path | None = Field(default=None, description="starting POML file; null: the task set's default_template")
    resource: str = Field(default="prompt", description="resource name the agent reads the template from")
    search: Literal["beam", "gepa"] = Field(
        default="beam", description="beam: beam search with textual gradients; gepa: GEPA's reflective Pareto "
        "search (the `apo` extra), rounds * branch_factor proposals")
    required_variables: tuple[str, ...] | None = Field(
        default=None, description="variables every candidate must keep; null: the task set's REQUIRED_VARIABLES"
    )
    beam_width: int = Field(default=2, ge=1, description="prompts kept after each round")
    branch_factor: int = Field(default=2, ge=1, description="edited candidates per parent per round")
    rounds: int = Field(default=2, ge=0, le=1000, description="--steps overrides it")
    gradient_tasks: int = Field(default=6, ge=1, description="train tasks a parent runs on to be critiqued")
    critique_examples: int = Field(default=3, ge=1, description="low- and high-reward rollouts shown (each)")
    val_tasks: int = Field(default=12, ge=1, description="validation tasks every candidate is scored on")
    max_rollouts: int | None = Field(default=None, ge=1, description="budget of new rollouts; null: unlimited")
    demos: DemosConfig | None = Field(default=None, description="bootstrap few-shot after the search; null: off")
    confidence: float = Field(default=0.95, gt=0, lt=1, description="bootstrap interval level")
    seed: int = Field(default=0, description="gradient batches, bootstrap and optimizer sampling")
    optimizer: OptimizerConfig = Field(default_factory=OptimizerConfig, description="the LLM that critiques and "
                                       "edits the prompts")

    @model_validator(mode="after")
    def _consistent(self) -> APOConfig:
        if self.critique_examples > self.gradient_tasks:
            raise ValueError("critique_examples cannot exceed gradient_tasks (the rollouts critiques are built from)")
        return self
