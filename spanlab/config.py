"""Config files: YAML validated by pydantic, with errors that point at the bad key.

One typed model per concern (store, runner, agent); entry points compose them. Unknown keys are
errors, so a typo (``wokers: 4``) fails loudly instead of being ignored.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from spanlab.config_errors import problem_line
from spanlab.config_yaml import MAX_ALIAS_BYTES, MAX_ALIAS_VALUES, load_yaml
from spanlab.errors import ConfigError
from spanlab.sampling_checks import sampling_problem
from spanlab.strict_scalars import scalar_problem

__all__ = ["MAX_ALIAS_BYTES", "MAX_ALIAS_VALUES", "AgentConfig", "ConfigError", "GatewayConfig", "RunConfig",
           "RunnerConfig", "StoreConfig", "load_config", "load_yaml", "number_out_of_range", "parse"]


class _Config(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class StoreConfig(_Config):
    """Where spans go: a DuckDB file owned by this process, or a store server's URL."""

    path: Path | None = Field(default=None, description="a DuckDB file this process owns")
    url: str | None = Field(default=None, description="a store server (spanlab store serve), e.g. "
                            "http://127.0.0.1:8700")
    token: str | None = Field(default=None, description="bearer token of the store server")

    @model_validator(mode="after")
    def _one_target(self) -> StoreConfig:
        if (self.path is None) == (self.url is None):
            raise ValueError("give exactly one of `path` (a DuckDB file) or `url` (a store server)")
        return self


class AgentConfig(_Config):
    """Which agent runs each rollout: a registered name or ``package.module:ClassName``."""

    name: str = Field(description="a registered agent (calc, sql, rooms, answer) or package.module:ClassName")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="keyword arguments of the agent's class; "
                                   "sampling settings among them (temperature, top_p, max_tokens, ...) must be in "
                                   "the engine's range")

    @field_validator("kwargs")
    @classmethod
    def _sampling_in_range(cls, kwargs: dict[str, Any]) -> dict[str, Any]:
        if problem := sampling_problem(kwargs):
            raise ValueError(problem)
        return kwargs


class RunnerConfig(_Config):
    workers: int = Field(default=1, ge=1, description="worker processes")
    concurrency: int = Field(default=4, ge=1, description="rollouts in flight per worker")
    heartbeat_s: float = Field(default=2.0, gt=0, description="how often a running attempt tells the store it "
                               "is alive")
    poll_s: float = Field(default=0.2, gt=0, description="wait between dequeues when the queue is empty")
    mode: str | None = Field(default=None, description="only run rollouts of this split (train/val/test)")
    exit_when_idle: bool = Field(default=True, description="stop once the queue is empty and nothing is in flight")


class GatewayConfig(_Config):
    """The recording gateway agents call; each attempt gets ``{url}/rollout/{rid}/attempt/{aid}/v1``."""

    url: str | None = Field(default=None, description="the gateway's URL; null: agents get no gateway URL "
                            "(ctx.llm_base_url is None)")
    token: str | None = Field(default=None, description="the gateway's bearer token (a train job's gateway.token), "
                              "sent by the agents as their api_key")


class RunConfig(_Config):
    """``spanlab run``: workers that take rollouts from the store and run the agent on them."""

    store: StoreConfig = Field(description="where the queue and spans are")
    agent: AgentConfig = Field(description="the agent each rollout runs")
    runner: RunnerConfig = Field(default_factory=RunnerConfig, description="worker processes and their pace")
    gateway: GatewayConfig = Field(default_factory=GatewayConfig, description="the recording gateway the agents "
                                   "call")


MAX_PROBLEMS = 10  # problems listed in one error; the rest are counted
# No number of a config is infinite or past 2**31-1 (tokens, steps, epochs, seeds alike): 1e20 micro-batch tokens
# or 1e9 epochs is a typo that would only fail, or never end, once the run is under way. Checked over the raw
# mapping (number_out_of_range), so every section, an algorithm plugin's own included, follows it.
MAX_CONFIG_NUMBER = 2**31 - 1


def number_out_of_range(data: Any) -> str | None:
    """The first number of the raw config that is not finite or past :data:`MAX_CONFIG_NUMBER`, as ``key: why``."""
    stack: list[tuple[str, Any]] = [("", data)]
    while stack:
        where, value = stack.pop()
        if isinstance(value, dict):
            stack.extend((f"{where}.{k}" if where else str(k), v) for k, v in value.items())
        elif isinstance(value, list | tuple):
            stack.extend((f"{where}[{i}]", v) for i, v in enumerate(value))
        elif isinstance(value, float) and not math.isfinite(value):
            return f"{where}: {value} is not a finite number"
        elif isinstance(value, int | float) and not isinstance(value, bool) and abs(value) > MAX_CONFIG_NUMBER:
            shown = str(value)[:40] if abs(value) < 10**100 else "a number of over 100 digits"
            return f"{where}: {shown} is out of range (at most {MAX_CONFIG_NUMBER:,} in a config)"
    return None


def parse(model: type[BaseModel], data: dict[str, Any], source: str = "config") -> Any:
    """Validate ``data`` as ``model``; the error lists each bad key as ``section.key: problem`` (the first
    :data:`MAX_PROBLEMS`, then how many more). Booleans and integers are strict (:mod:`spanlab.strict_scalars`):
    ``steps: true`` is refused, not read as 1."""
    if problem := scalar_problem(model, data):
        raise ConfigError(f"{source} is invalid: {_short(problem)}")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        problems = []
        errors = exc.errors()
        for err in errors[:MAX_PROBLEMS]:
            problems.append(f"  {problem_line(model, err)}")
        if len(errors) > MAX_PROBLEMS:
            problems.append(f"  ... and {len(errors) - MAX_PROBLEMS} more")
        if len(problems) == 1:  # the usual case: one line
            raise ConfigError(f"{source} is invalid: {problems[0].strip()}") from exc
        raise ConfigError(f"{source} is invalid:\n" + "\n".join(problems)) from exc


def _short(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def load_config(model: type[BaseModel], path: str | Path) -> Any:
    return parse(model, load_yaml(path), source=str(path))
