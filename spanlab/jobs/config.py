"""``spanlab train CONFIG.yaml``: shared sections every algorithm reads, plus the section of the chosen one.

``algorithm: grpo`` selects the ``grpo:`` section, validated by that algorithm's own model; a section
named after another algorithm is an error naming the key (it would be silently ignored otherwise).
Shared settings live in shared sections: ``rollouts`` (concurrency, timeout, sampling temperature),
``eval`` (the held-out split), ``warm_start``. Every section has defaults that run on a 2-core CPU
machine, unknown keys are errors naming the key, and everything here is checked before an engine starts.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlparse

from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator, model_validator

from spanlab.config import AgentConfig, load_yaml, number_out_of_range, parse
from spanlab.engine.config import EngineConfig
from spanlab.errors import ConfigError
from spanlab.jobs.algorithm import Algorithm, AlgorithmConfig
from spanlab.jobs.checkpoints import CheckpointsConfig
from spanlab.jobs.file_checks import chat_template_problem
from spanlab.jobs.registry import available, load_algorithm
from spanlab.jobs.tracking import TrackingConfig
from spanlab.policies.config import PoliciesConfig, engine_lora_settings
from spanlab.runner.config import GatewayListenConfig, RolloutRunnerConfig, unreachable
from spanlab.training.launch import Launch, with_world
from spanlab.training.settings import SFTConfig
from spanlab.training.trainer_config import TrainerConfig

# Keys of earlier versions, each with the one line that says where it went.
_LOOP_SPLIT = ("loop: was split up: loop.steps/tasks_per_step -> grpo.steps/tasks_per_step; loop.concurrency/"
               "rollout_timeout_s -> rollouts.concurrency/timeout_s; loop.torch_threads -> torch_threads")
MIGRATIONS: dict[str, str] = {
    **{f"loop.{old}": _LOOP_SPLIT for old in ("steps", "tasks_per_step", "concurrency", "rollout_timeout_s",
                                              "torch_threads")},
    "sft.temperature": "sft.temperature: moved to rollouts.temperature (shared by every algorithm)",
    "apo.test_tasks": "apo.test_tasks: moved to eval.tasks (the framework's held-out evaluation)",
}
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
MASKED = "**********"  # how pydantic prints a SecretStr; --check prints every secret so
COLOCATED_ENGINE_SHARE = 0.3  # of the GPU, for the engines a job starts beside a GPU trainer (as TRL colocates)


def _http_url(url: str) -> str:
    parts = urlparse(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{url!r} is not an http(s) URL such as http://127.0.0.1:8000")
    return url


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class DatasetConfig(_Section):
    """Tasks from a registered task set (``calc``) or a module exposing ``make_tasks`` (and ``demonstration``)."""

    name: str = Field(default="calc", description="a registered task set (calc, sql, rooms, reasoning_gym) or a "
                      "module with make_tasks")
    seed: int = Field(default=0, description="seeds task generation, the splits and each step's draw of tasks")
    levels: tuple[int, ...] = Field(default=(1, 2, 3), min_length=1, description="difficulty levels generated "
                                    "(calc: 1 = one operation ... 4 = three)")
    train_levels: tuple[int, ...] | dict[int, float] | None = Field(
        default=None, min_length=1, description="levels RL trains on (default `levels`); a mapping such as "
        "{2: 1, 3: 1, 4: 2} also says what share of each step's tasks each level gets")
    kwargs: dict[str, Any] = Field(default_factory=dict,
                                   description="the task set's own options, e.g. calc's phrasings: all")
    train_tasks: int | None = Field(default=None, ge=1, le=1_000_000, description="train tasks to generate; "
                                    "default: twice what the algorithm and warm start ask for. RL draws from those "
                                    "of train_levels, so a run without a warm start may otherwise get a small pool")

    @model_validator(mode="after")
    def _train_levels_in_levels(self) -> DatasetConfig:
        if self.train_levels and not set(self.train_levels) <= set(self.levels):
            raise ValueError(f"train_levels {list(self.train_levels)} must be a subset of levels {list(self.levels)}")
        if isinstance(self.train_levels, dict) and not all(w > 0 and w < float("inf")
                                                           for w in self.train_levels.values()):
            raise ValueError(f"train_levels: every weight must be a positive number, got {self.train_levels}")
        return self

    @property
    def rl_weights(self) -> dict[int, float]:
        """Each RL level's share of a step's tasks (equal shares when ``train_levels`` is a list)."""
        levels = self.train_levels or self.levels
        weights = levels if isinstance(levels, dict) else dict.fromkeys(levels, 1.0)
        total = sum(weights.values())
        return {level: w / total for level, w in sorted(weights.items())}


class SplitSpec(_Section):
    """A held-out split asked at levels of its own, under a name of its own: e.g. the level that RL alone trains,
    held out by question (``{name: test_l4, split: test, levels: [4]}``) and by wording (``split: family``)."""

    name: str = Field(pattern=r"^[a-z][a-z0-9_]{0,39}$", description="how reports and metrics call it")
    split: str = Field(description="the task set's split, e.g. calc's test, family or depth")
    levels: tuple[int, ...] | None = Field(default=None, min_length=1, description="default: eval.levels")


class CurveConfig(_Section):
    """Held-out evaluations during training, for the learning curve of the skill being trained."""

    splits: tuple[str, ...] = Field(min_length=1, description="names of eval splits (the headline or extra ones)")
    every: int = Field(default=3, ge=1, le=100_000, description="evaluate after every this many steps")


class EvalConfig(_Section):
    """Held-out accuracy, measured by the framework through the same agent/gateway path for every algorithm."""

    split: str = Field(default="test", pattern="^(val|test)$", description="the headline split, held out by question")
    levels: tuple[int, ...] | None = Field(default=None, min_length=1, description="levels the headline split "
                                           "and the extra splits given by name ask; default dataset.levels")
    extra_splits: tuple[str | SplitSpec, ...] = Field(
        default=(), description="more held-out splits the task set offers, evaluated beside it "
        "(calc: family = unseen phrasings, depth = one more operation than any asked level); "
        "{name, split, levels} asks one at levels of its own")
    tasks: int = Field(default=60, ge=1, le=100_000, description="held-out tasks per evaluation and split")
    temperature: float = Field(default=0.0, ge=0, le=10, description="sampling temperature of held-out rollouts "
                               "(0: greedy, so phases compare on the same tasks without sampling noise)")
    base: bool = Field(default=True, description="evaluate before training (phase base); false where the start "
                       "was evaluated already, e.g. by the run that wrote the engine.model folder")
    curve: CurveConfig | None = Field(default=None, description="evaluate some splits every few training steps "
                                      "(the learning curve in the report, the plot and the UI)")

    @property
    def split_specs(self) -> tuple[SplitSpec, ...]:
        """The headline split, then every extra split, each as a spec (levels None: dataset.levels)."""
        specs = [SplitSpec(name=self.split, split=self.split, levels=self.levels)]
        for entry in self.extra_splits:
            specs.append(SplitSpec(name=entry, split=entry, levels=self.levels) if isinstance(entry, str) else
                         entry if entry.levels is not None else entry.model_copy(update={"levels": self.levels}))
        return tuple(specs)

    @model_validator(mode="after")
    def _names_unique(self) -> EvalConfig:
        names = [spec.name for spec in self.split_specs]
        if twice := sorted({n for n in names if names.count(n) > 1} | ({"train"} & set(names))):
            raise ValueError(f"extra_splits: {twice[0]!r} is the train split, the headline split or listed twice")
        if self.curve is not None and (unknown := sorted(set(self.curve.splits) - set(names))):
            raise ValueError(f"curve.splits: {unknown[0]!r} is not an eval split (splits: {names})")
        return self


class RolloutsConfig(_Section):
    """How training rollouts run, for every algorithm: how many in flight, how long one may take, how hot."""

    concurrency: int = Field(default=16, ge=1, le=4096, description="rollouts in flight")
    timeout_s: float = Field(default=600.0, gt=0, le=86_400, description="a rollout running longer is ended "
                             "as failed")
    temperature: float | None = Field(default=None, ge=0, le=10, description="sampling temperature; default: "
                                      "the agent's (APO scores at eval.temperature unless this is set)")
    seed: int | None = Field(default=None, ge=0, le=2**63 - 1, description="seed every rollout's sampling: the "
                             "same config samples the same tokens (vLLM's per-request seed); default: unseeded")


class LoopConfig(_Section):
    """How an RL algorithm's steps meet their rollouts (docs/async.md).

    ``sync``: each step queues its groups, waits for all of them, updates, pushes. ``async``: a producer keeps
    ``in_flight_groups`` groups queued or running in the store at all times while the trainer updates; each
    step trains on the next full groups sampled at most ``max_staleness`` policy versions ago (older ones are
    dropped and counted), with truncated importance sampling against the engine's logprobs.
    """

    mode: Literal["sync", "async"] = Field(default="sync", description="sync: each step waits for its rollouts; "
                                           "async: rollouts keep running while the trainer updates")
    max_staleness: int | None = Field(default=None, ge=0, le=1000, description="async: train on groups sampled "
                                      "at most this many policy versions before the current one; default 1")
    in_flight_groups: int | None = Field(default=None, ge=1, le=100_000, description="async: groups kept queued "
                                         "or running; default twice a step's groups")

    @model_validator(mode="after")
    def _async_settings_need_async(self) -> LoopConfig:
        given = sorted(k for k in ("max_staleness", "in_flight_groups") if getattr(self, k) is not None)
        if self.mode == "sync" and given:
            raise ValueError(f"{', '.join(given)}: only used with mode: async")
        return self

    @property
    def staleness(self) -> int:
        return 1 if self.max_staleness is None else self.max_staleness

    def groups_in_flight(self, groups_per_step: int) -> int:
        return self.in_flight_groups or 2 * groups_per_step


class WarmStartConfig(SFTConfig):
    """SFT on demonstrations before training, for a model that would otherwise never earn a reward.

    ``role_demos: mined`` gives every role of a multi-agent agent demonstrations of its own job: after the
    generated ones (the SQL writer's), the job runs ``mine_tasks`` train tasks, and the task set mines the other
    roles' demonstrations from what was recorded (the SQL checker's verdicts, the rewriter's fixes), stores them
    as ``demonstration`` spans and trains on them. With ``policies`` each policy's adapter is warm-started on its
    own roles' demonstrations only, the base weights untouched."""

    demos: int = Field(default=88, ge=1, le=100_000, description="demonstrations from the train split")
    levels: tuple[int, ...] | None = Field(default=None, min_length=1, description="levels demonstrated; default "
                                           "dataset.levels (a level left out is one only RL can teach)")
    role_demos: Literal["generated", "mined"] = Field(
        default="generated", description="generated: only the task set's generated demonstrations (one role's, e.g. "
        "the SQL writer's), which train the full model; mined: also each other role's, mined from rollouts of "
        "mine_tasks train tasks the job runs after the generated warm start (with policies: each policy's adapter "
        "on its own roles' demonstrations only)")
    mine_tasks: int | None = Field(default=None, ge=1, le=100_000, description="role_demos mined: train tasks run "
                                   "once each (at rollouts.temperature) and mined; default 64")

    @model_validator(mode="after")
    def _mine_tasks_need_mined(self) -> WarmStartConfig:
        if self.mine_tasks is not None and self.role_demos != "mined":
            raise ValueError("mine_tasks: only used with role_demos: mined")
        return self

    @property
    def mined_tasks(self) -> int:
        """How many train tasks a mined warm start runs (0 without one)."""
        return 0 if self.role_demos != "mined" else self.mine_tasks or 64


class TrainConfig(_Section):
    """The shared part of a train config; :func:`train_config_model` adds the chosen algorithm's section."""

    algorithm: str = Field(default="grpo", description="grpo, sft or apo (or a plugin's registered name); its "
                           "settings go in the section of that name")
    run_name: str = Field(default="run", description="names the run's folder (out_dir/run_name), its reports "
                          "and the name `spanlab serve` serves its model under")
    out_dir: Path = Field(default=Path("runs"), description="checkpoints and plots go to out_dir/run_name")
    db: Path = Field(default=Path("runs/spanlab.duckdb"), description="the span store file")
    engine: EngineConfig = Field(default_factory=lambda: EngineConfig(dev_routes=True), description="the vLLM "
                                 "server the job starts (unless engine_url names a running one)")
    engine_url: str | None = Field(
        default=None, description="use this running vLLM (serving engine.model, dev routes on) instead of starting one"
    )
    engine_urls: tuple[str, ...] | None = Field(
        default=None, min_length=1, description="several running vLLMs (replicas of engine.model, dev routes on) "
        "behind the gateway, instead of starting engine.replicas of them (docs/replicas.md)"
    )
    gateway: GatewayListenConfig = Field(default_factory=GatewayListenConfig, description="where the recording "
                                         "gateway listens, the URL workers are given, its token (docs/scale.md)")
    tito: bool = Field(default=True, description="record TITO session buffers (one sequence per agent session)")
    token_source: str = Field(default="exact", pattern="^(exact|retokenized)$",
                              description="train on the engine's IDs, or 'retokenized' stored text (drift)")
    retokenize_template: Path | None = Field(
        default=None, description="a chat template file to retokenize with (models a train/serve template mismatch)"
    )
    agent: AgentConfig = Field(default_factory=lambda: AgentConfig(name="calc"), description="the agent each "
                               "rollout runs")
    prompt: Path | None = Field(
        default=None, description="a POML file to start from: stored as the latest version of the `prompt` "
        "resource before the base evaluation, so every rollout that pins no prompt (training and held-out) runs "
        "with it, e.g. an APO run's winner for GRPO (APO itself starts from apo.prompt)")
    agents: tuple[str, ...] | None = Field(
        default=None, description="roles of a multi-agent agent whose calls are trained on (None: every call)"
    )
    policies: PoliciesConfig | None = Field(
        default=None, description="a LoRA policy per agent role, served side by side (docs/multi_policy.md); "
        "None: one policy for every role")
    dataset: DatasetConfig = Field(default_factory=DatasetConfig, description="the tasks and their levels")
    eval: EvalConfig = Field(default_factory=EvalConfig, description="the held-out evaluations")
    rollouts: RolloutsConfig = Field(default_factory=RolloutsConfig, description="how train rollouts run")
    runner: RolloutRunnerConfig = Field(default_factory=RolloutRunnerConfig,
                                        description="where rollouts run: in this process, or on Ray actors")
    loop: LoopConfig = Field(default_factory=LoopConfig, description="sync steps, or async with a staleness bound")
    warm_start: WarmStartConfig | None = Field(default=None, description="SFT on generated demonstrations "
                                               "before the algorithm; null: none")
    torch_threads: int | None = Field(default=None, ge=1, le=1024, description="default: all cores")
    trainer: TrainerConfig = Field(default_factory=TrainerConfig, description="data-parallel ranks of the update")

    checkpoints: CheckpointsConfig = Field(default_factory=CheckpointsConfig, description="the servable "
                                           "folders and resume state a run writes")
    tracking: TrackingConfig = Field(default_factory=TrackingConfig, description="experiment trackers fed "
                                     "the step metrics")
    section: AlgorithmConfig = Field(default_factory=AlgorithmConfig, description="the chosen algorithm's section")

    @field_validator("run_name")
    @classmethod
    def _run_name_stays_in_out_dir(cls, name: str) -> str:
        if not _SAFE_NAME.match(name) or ".." in name:
            raise ValueError(f"{name!r} must be a plain folder name (letters, digits, . _ -), not a path")
        return name

    @field_validator("db", mode="before")
    @classmethod
    def _db_is_a_file_path(cls, db: Any) -> Any:
        if isinstance(db, str | Path) and not str(db).strip():
            raise ValueError("is empty: give the span store's file, e.g. runs/spanlab.duckdb")
        if isinstance(db, str | Path) and Path(db).is_dir():
            raise ValueError(f"{str(db)!r} is a folder: give the span store's file in it, e.g. "
                             f"{Path(db) / 'spans.duckdb'}")
        return db

    @field_validator("engine_url")
    @classmethod
    def _engine_url_is_http(cls, url: str | None) -> str | None:
        return None if url is None else _http_url(url)

    @field_validator("engine_urls")
    @classmethod
    def _engine_urls_are_http(cls, urls: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if urls is None:
            return None
        roots = [_http_url(u).rstrip("/").removesuffix("/v1") for u in urls]
        if len(set(roots)) != len(roots):
            raise ValueError(f"lists an engine twice: {list(urls)}")
        return tuple(roots)

    @field_validator("engine")
    @classmethod
    def _engine_can_reload(cls, engine: EngineConfig) -> EngineConfig:
        """Training pushes weights through vLLM's dev routes (reload, pause), so they are always on."""
        return engine if engine.dev_routes else engine.model_copy(update={"dev_routes": True})

    @model_validator(mode="after")
    def _cross_section(self) -> TrainConfig:
        running = "engine_url" if self.engine_url else "engine_urls" if self.engine_urls else None
        if self.engine_url and self.engine_urls:
            raise ValueError("engine_url and engine_urls: give one (engine_urls: [url] is one engine too)")
        if running and self.engine.replicas > 1:
            raise ValueError(f"engine.replicas: {self.engine.replicas} engines to start, but {running} names "
                             "running ones; drop one of them")
        if self.warm_start and self.warm_start.levels and not set(self.warm_start.levels) <= set(self.dataset.levels):
            raise ValueError(f"warm_start.levels {list(self.warm_start.levels)} must be a subset of dataset.levels "
                             f"{list(self.dataset.levels)}")
        if self.runner.backend == "ray" and (problem := unreachable(self.gateway, "gateway", "gateway")):
            raise ValueError(problem)
        if self.prompt is not None and not self.prompt.is_file():
            raise ValueError(f"prompt {str(self.prompt)!r} is not a file")
        if self.retokenize_template is not None:
            if self.token_source != "retokenized":
                raise ValueError("retokenize_template is only used with token_source: retokenized")
            if not self.retokenize_template.is_file():
                raise ValueError(f"retokenize_template {str(self.retokenize_template)!r} is not a file")
            if problem := chat_template_problem(self.retokenize_template):
                raise ValueError(f"retokenize_template: {problem}")
        # The engines the job starts on the GPU share it with a GPU trainer (rank 0 is on the first GPU, as they
        # are), and vLLM would take 90% of it: unless the config says, they get 30% of it in all.
        if (self.trainer.device == "gpu" and self.engine.device == "gpu" and running is None
                and self.engine.gpu_memory_utilization is None):
            share = round(COLOCATED_ENGINE_SHARE / self.engine.replicas, 4)
            object.__setattr__(self, "engine", self.engine.model_copy(update={"gpu_memory_utilization": share}))
        # A LoRA policy served as an adapter needs vLLM started with LoRA on and a rank that holds it (vLLM refuses
        # a larger adapter at the first weight push, minutes in); set both rather than fail later.
        if getattr(self.section, "serves_lora", False) and running is None:
            lora = getattr(self.section, "lora", None)
            rank = max(self.engine.max_lora_rank, lora.rank if lora is not None else 0)
            update = {"enable_lora": True, "max_lora_rank": rank}
            object.__setattr__(self, "engine", self.engine.model_copy(update=update))
        if self.policies is not None:
            self._serve_policies(self.policies, running)
        return self

    def _serve_policies(self, policies: PoliciesConfig, running: str | None) -> None:
        """The engine the job starts serves every policy's adapter at once: LoRA on, a slot per policy, a rank
        that holds the largest. A running engine (``engine_url``) must have been started that way."""
        if self.agents is not None and (untrained := sorted(set(policies.roles) - set(self.agents))):
            raise ValueError(f"policies.roles: role {untrained[0]!r} is not one of agents {list(self.agents)}, so "
                             "its calls are never trained on")
        if running is not None:
            return
        update = engine_lora_settings(policies, self.engine.max_loras, self.engine.max_lora_rank)
        object.__setattr__(self, "engine", self.engine.model_copy(update=update))

    @property
    def run_dir(self) -> Path:
        return self.out_dir / self.run_name

    def resolved(self) -> dict[str, Any]:
        """Every setting as the run will use it, the algorithm's section under its own name (a resume compares
        these). The tokens (``SecretStr``) are masked; :meth:`shown` masks ``engine.extra_env`` too."""
        data = self.model_dump(mode="json", exclude={"section"})
        data[self.algorithm] = self.section.model_dump(mode="json")
        return data

    def shown(self) -> dict[str, Any]:
        """:meth:`resolved` as ``--check`` prints it and trackers log it: every value of ``engine.extra_env``
        masked as the tokens are, since that is where an engine's keys (HF_TOKEN, ...) are given."""
        data = self.resolved()
        data["engine"]["extra_env"] = dict.fromkeys(data["engine"]["extra_env"], MASKED)
        return data


@functools.cache
def train_config_model(name: str, algorithm: type[Algorithm]) -> type[TrainConfig]:
    """TrainConfig with ``section`` read from the key named after the algorithm, validated by its model."""
    return create_model(f"TrainConfig[{name}]", __base__=TrainConfig,
                        section=(algorithm.config_model, Field(default_factory=algorithm.config_model, alias=name)))


def parse_train_config(data: dict[str, Any], source: str = "config", *, steps: int | None = None,
                       launch: Launch | None = None) -> TrainConfig:
    """Validate a train config (``steps``: the ``--steps`` override, validated like the YAML key it sets;
    ``launch``: torchrun's ranks, which set ``trainer.processes`` when the config leaves it out)."""
    data = with_world(data, launch)
    if problem := number_out_of_range(data):
        raise ConfigError(f"{source}: {problem}")
    name = data.get("algorithm", "grpo")
    if not isinstance(name, str):
        raise ConfigError(f"{source}: algorithm must be a name, got {name!r}")
    for key, message in MIGRATIONS.items():
        section, _, sub = key.partition(".")
        ours = section == name or section not in available()  # another algorithm's section fails below
        if section in data and (not sub or (ours and isinstance(data[section], dict) and sub in data[section])):
            raise ConfigError(f"{source}: {message}")
    for other in sorted(set(available()) - {name}):
        if other in data:
            raise ConfigError(f"{source}: {other}: a section for algorithm {other!r}, but this config runs {name!r}")
    algorithm = load_algorithm(name)
    if steps is not None:
        if algorithm.steps_key is None:
            raise ConfigError(f"--steps: algorithm {name!r} has no step count to override")
        section = data.get(name) or {}
        if not isinstance(section, dict):
            raise ConfigError(f"{source}: {name} must be a mapping")
        data = {**data, name: {**section, algorithm.steps_key: steps}}
    return parse(train_config_model(name, algorithm), data, source=source)


def load_train_config(path: str | Path, *, steps: int | None = None, launch: Launch | None = None) -> TrainConfig:
    """Read and validate a train config file; every problem is a ConfigError of one line or a short list."""
    return parse_train_config(load_yaml(path), str(path), steps=steps, launch=launch)
