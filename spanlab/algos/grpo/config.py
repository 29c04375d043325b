"""The ``grpo:`` section: the GRPO update's options and the outer loop's sizes; no torch, so ``--check`` stays cheap."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from spanlab.adapters.credit import CreditConfig
from spanlab.adapters.trainable import FailedAttempts
from spanlab.training.settings import LoraConfig

Aggregation = Literal["token_mean", "seq_mean", "constant"]
Normalization = Literal["group", "group_role"]  # spanlab.algos.grpo.advantages (kept torch-free here)


class GRPOCredit(CreditConfig):
    """``grpo.credit``: which reward each turn trains on (:mod:`spanlab.adapters.credit`) and over which samples
    its advantage is normalized. ``normalize`` left out: ``group`` for broadcast (GRPO as it always was),
    ``group_role`` for per_turn (a role's returns are compared with the same role's in the group only)."""

    normalize: Normalization | None = Field(default=None, description=(
        "group: over a task's rollouts; group_role: over a task's turns of one role; None: by mode"))

    @property
    def normalization(self) -> Normalization:
        if self.normalize is not None:
            return self.normalize
        return "group_role" if self.per_turn else "group"


class DemonstrationTerm(BaseModel):
    """``grpo.demonstrations``: the demonstrations' NLL added to every GRPO update (InstructGPT's PPO-ptx), so that
    RL adds a skill without unlearning what the demonstrations taught. The demonstrations are the run's stored ones
    (``demonstration`` spans: the warm start's when the run had one), else ``demos`` generated for train tasks of
    ``levels``, recorded in the store first; each update draws ``per_step`` of them."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    coef: float = Field(gt=0, le=100, description="weight of the demonstrations' mean token NLL in the loss")
    per_step: int = Field(default=16, ge=1, le=100_000, description="demonstrations drawn for each update")
    demos: int = Field(default=512, ge=1, le=1_000_000, description=(
        "demonstrations generated when the run has none stored (no warm start)"))
    levels: tuple[int, ...] | None = Field(default=None, description=(
        "task levels of the generated ones; None: every level of dataset.levels"))


class ReplayTerm(BaseModel):
    """``grpo.replay``: on-policy replay of what the policy already solves. A group whose samples all reached
    ``solved_reward`` has no reward variance, so GRPO's advantage is zero there and the update drops it; this term
    keeps one rollout of each such group (at most ``per_step`` groups) and adds ``coef`` x their mean token NLL to
    the update, as ``grpo.demonstrations`` does with demonstrations. The rows are the policy's own current answers,
    from the samples the step already read, filtered by reward ("retaining by doing"); beside the demonstration
    term the two NLL terms add up."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    coef: float = Field(gt=0, le=100, description="weight of the replayed rows' mean token NLL in the loss")
    per_step: int = Field(default=16, ge=1, le=100_000, description=(
        "all-solved groups replayed per update at most (one rollout of each, drawn with a seed of the step)"))
    levels: tuple[int, ...] | None = Field(default=None, min_length=1, description=(
        "only groups of tasks of these levels (the task's 'level'; a task without one always counts); "
        "None: every level"))
    solved_reward: float = Field(default=1.0, allow_inf_nan=False, description=(
        "a group is all-solved when every one of its samples' rewards is at least this (a correct answer's "
        "reward) and GRPO dropped it for want of variance"))


class GRPOConfig(BaseModel):
    """Library config of the GRPO update; validated when built so a bad option fails before any rollout."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    lr: float = Field(default=1e-5, gt=0, description="AdamW learning rate")
    group_size: int = Field(default=4, description="samples per task the rollout loop draws; >= 2")
    clip_low: float = Field(default=0.2, ge=0, lt=1, description="ratio clipped below at 1 - clip_low")
    clip_high: float = Field(default=0.28, ge=0, description="ratio clipped above at 1 + clip_high (DAPO)")
    scale_rewards: bool = Field(default=True, description="divide by the group's std; False = Dr.GRPO")
    aggregation: Aggregation = Field(default="token_mean", description="token_mean (DAPO), seq_mean (per "
                                     "sequence, then over them) or constant (Dr.GRPO: constant_divisor)")
    constant_divisor: int | None = Field(default=None, gt=0, description="tokens per sequence for 'constant'")
    kl_beta: float = Field(default=0.0, ge=0, description="k3 KL to a reference model; 0 = no reference")
    tis_cap: float | None = Field(default=2.0, gt=0, description="truncated importance sampling cap; None = off")
    epochs_per_batch: int = Field(default=1, ge=1, description="passes over a step's samples")
    micro_batch_tokens: int = Field(default=4096, ge=1, description=(
        "packed tokens per forward/backward (a prefix rows share counts once); sized for a CPU, a GPU wants "
        "16384-65536 (docs/gpu.md)"))
    max_grad_norm: float = Field(default=1.0, gt=0, description="gradients clipped to this norm")
    lora: LoraConfig | None = Field(default=None, description="None = full fine-tuning")
    weight_decay: float = Field(default=0.0, ge=0, description="AdamW weight decay")
    temperature: float = Field(default=1.0, gt=0, description="the engine's sampling temperature")
    bf16: bool = Field(default=False, description=(
        "forward passes in bfloat16 (torch.autocast; weights, gradients, optimizer state and the log-softmax stay "
        "fp32): less GPU memory, faster only with large micro-batches (docs/gpu.md)"))
    demonstrations: DemonstrationTerm | None = Field(default=None, description=(
        "PPO-ptx: {coef, per_step, demos, levels}: the demonstrations' NLL in every update; None: RL alone"))
    replay: ReplayTerm | None = Field(default=None, description=(
        "on-policy replay: {coef, per_step, levels, solved_reward}: the NLL of one rollout of each group the "
        "policy solved in every sample (which GRPO drops), in every update; beside or instead of demonstrations; "
        "None: off"))
    credit: GRPOCredit = Field(default_factory=GRPOCredit, description=(
        "per-turn credit: {mode: broadcast|per_turn, discount, normalize: group|group_role}; "
        "default: the final reward broadcast to every turn"))
    failed_attempts: FailedAttempts = Field(default="drop", description=(
        "a failed or timed-out attempt: drop (default) or {reward: R}, trained with every sample on reward R "
        "(spanlab.adapters.trainable)"))

    @model_validator(mode="after")
    def _consistent(self) -> GRPOConfig:
        if self.group_size < 2:
            raise ValueError("group_size must be >= 2 for group-relative advantages")
        if self.aggregation == "constant" and self.constant_divisor is None:
            raise ValueError("aggregation 'constant' needs constant_divisor (e.g. the max response tokens)")
        return self


class DynamicSampling(BaseModel):
    """DAPO's dynamic sampling: a group whose rollouts all score the same carries no gradient, so when fewer than
    ``min_groups`` of a step's groups differ, the step samples that many tasks again (at most ``max_rounds`` more
    times) and trains on every group with a signal. Worth it where rewards are sparse (a skill just starting)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    min_groups: int = Field(ge=1, le=100_000, description="groups with reward variance a step wants")
    max_rounds: int = Field(default=1, ge=1, le=10, description="extra rounds of tasks_per_step tasks, at most")


class GRPOSection(GRPOConfig):
    """The ``grpo:`` section of a train config: the update's options plus how many updates, fed by how many tasks."""

    steps: int = Field(default=4, ge=0, le=100_000, description="GRPO updates (--steps overrides it)")
    tasks_per_step: int = Field(default=8, ge=1, le=100_000, description="distinct tasks per update; x group_size")
    dynamic_sampling: DynamicSampling | None = Field(default=None, description="sample more tasks while fewer "
                                                     "than min_groups groups have reward variance (sync loop)")

    @property
    def serves_lora(self) -> bool:
        """The engine serves a LoRA adapter of this policy (vLLM must start with LoRA on)."""
        return self.lora is not None
