"""The ``sft:`` section: reward-filtered fine-tuning rounds (rejection sampling); no torch at import."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from spanlab.adapters.filtered_dataset import FilterConfig
from spanlab.training.settings import LoraConfig, SFTConfig


class SFTRoundsConfig(BaseModel):
    """collect -> filter -> train -> serve, ``rounds`` times.

    Each round samples ``samples_per_task`` rollouts of ``tasks_per_round`` train tasks with the served
    policy (at ``rollouts.temperature``), keeps what ``filter`` selects (on the exact token IDs),
    fine-tunes on it (with ``replay`` of the warm start's demonstrations mixed in) and pushes the weights.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    rounds: int = Field(default=2, ge=0, le=10_000, description="--steps overrides it")
    tasks_per_round: int = Field(default=32, ge=1, le=100_000, description="train tasks sampled each round")
    samples_per_task: int = Field(default=4, ge=1, le=1024, description="rollouts per task (best-of-n needs n >= 2)")
    filter: FilterConfig = Field(default_factory=FilterConfig, description="which samples become examples")
    # One pass at 1e-5: 5e-5 x 2 epochs drove a round's loss to ~0.003 on the SQL tutorial (it memorized a handful
    # of examples and lost held-out accuracy); docs/results.md has the measured rounds at these values.
    train: SFTConfig = Field(default_factory=lambda: SFTConfig(lr=1e-5, epochs=1), description="the fine-tuning "
                             "of each round")
    replay: int = Field(
        default=0, ge=0, le=100_000,
        description="demonstrations (the warm start's, from the task set) mixed into each round's kept examples, so "
                    "training on what the policy already solves does not wear away what the warm start taught; 0: none",
    )
    lora: LoraConfig | None = Field(default=None, description="None: full fine-tuning (the CPU default)")
    save: Literal["merged", "adapter"] = Field(
        default="merged", description="what the engine serves after a LoRA round: merged weights or the adapter"
    )
    backend: Literal["auto", "torch", "unsloth"] = Field(
        default="auto", description="auto: unsloth when it is importable, else the plain torch (+ peft) trainer"
    )
    eval_each_round: bool = Field(default=False, description="held-out accuracy after every round, not just the last")

    @property
    def serves_lora(self) -> bool:
        """The engine hot-loads this run's LoRA adapter (vLLM must start with LoRA on)."""
        return self.lora is not None and self.save == "adapter"
