"""Settings of the shared trainers (LoRA, supervised fine-tuning), kept apart so configs never import torch."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator


class LoraConfig(BaseModel):
    """LoRA adapters on the attention and MLP projections (the modules vLLM's LoRA serving supports)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rank: int = Field(default=8, ge=1, description="the adapter's rank r")
    alpha: float = Field(default=16.0, gt=0, description="scaling: the update is multiplied by alpha / rank")
    target_modules: tuple[str, ...] = Field(default=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                                     "down_proj"), description="the projections adapted")

    @field_validator("target_modules")
    @classmethod
    def _some_targets(cls, targets: tuple[str, ...]) -> tuple[str, ...]:
        """peft given no target adapts nothing; ``spanlab train --check`` also checks each name against the model
        (:mod:`spanlab.training.lora_targets`), which this config alone cannot."""
        if not targets:
            raise ValueError("is empty: name the layers to adapt, e.g. [q_proj, v_proj]")
        if blank := [t for t in targets if not t.strip()]:
            raise ValueError(f"{blank[0]!r} names no layer")
        return targets


class SFTConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    lr: float = Field(default=1e-4, gt=0, description="AdamW learning rate")
    epochs: int = Field(default=1, ge=1, le=1000, description="passes over the examples")
    batch_size: int = Field(default=4, ge=1, le=65_536, description="examples per optimizer step")
    max_len: int = Field(default=1024, ge=16, description="longer conversations are skipped, with a warning")
    weight_decay: float = Field(default=0.0, ge=0, description="AdamW weight decay")
    max_grad_norm: float = Field(default=1.0, gt=0, description="gradients clipped to this norm")
    seed: int = Field(default=0, description="seeds the shuffling of the examples")
