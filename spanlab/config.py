"""Config files: YAML validated by pydantic, with errors that point at the bad key.

One typed model per concern (store, runner, agent); entry points compose them. Unknown keys are
errors, so a typo (``wokers: 4``) fails loudly instead of being ignored.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from spanlab.errors import ConfigError


class _Config(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class StoreConfig(_Config):
    """Where spans go: a DuckDB file owned by this process, or a store server's URL."""

    path: Path | None = None
    url: str | None = None
    token: str | None = Field(default=None, description="bearer token of the store server")

    @model_validator(mode="after")
    def _one_target(self) -> StoreConfig:
        if (self.path is None) == (self.url is None):
            raise ValueError("give exactly one of `path` (a DuckDB file) or `url` (a store server)")
        return self


class AgentConfig(_Config):
    """Which agent runs each rollout: a registered name or ``package.module:ClassName``."""

    name: str
    kwargs: dict[str, Any] = Field(default_factory=dict)


class RunnerConfig(_Config):
    workers: int = Field(default=1, ge=1, description="worker processes")
    concurrency: int = Field(default=4, ge=1, description="rollouts in flight per worker")
    heartbeat_s: float = Field(default=2.0, gt=0)
    poll_s: float = Field(default=0.2, gt=0, description="wait between dequeues when the queue is empty")
    mode: str | None = Field(default=None, description="only run rollouts of this split (train/val/test)")
    exit_when_idle: bool = Field(default=True, description="stop once the queue is empty and nothing is in flight")


class GatewayConfig(_Config):
    """The recording gateway agents call; each attempt gets ``{url}/rollout/{rid}/attempt/{aid}/v1``."""

    url: str | None = None
    token: str | None = Field(default=None, description="the gateway's bearer token (a train job's gateway.token), "
                              "sent by the agents as their api_key")


class RunConfig(_Config):
    """``spanlab run``: workers that take rollouts from the store and run the agent on them."""

    store: StoreConfig
    agent: AgentConfig
    runner: RunnerConfig = Field(default_factory=RunnerConfig)
    gateway: GatewayConfig = Field(default_factory=GatewayConfig)


class _StrictLoader(yaml.SafeLoader):
    """A YAML loader that refuses a key given twice in one mapping (PyYAML keeps the last silently)."""


def _mapping_without_duplicates(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> Any:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)  # type: ignore[no-untyped-call]
        if key in seen:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_without_duplicates)


def load_yaml(path: str | Path) -> dict[str, Any]:
    """A config file's mapping: UTF-8, valid YAML, no key twice; every problem a one-line ConfigError."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file {p} does not exist")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{p} is not UTF-8 text (byte {exc.start}); save it as UTF-8") from exc
    except OSError as exc:
        raise ConfigError(f"cannot read config {p}: {exc.strerror or exc}") from exc
    try:
        data = yaml.load(text, Loader=_StrictLoader)  # a SafeLoader subclass
    except yaml.MarkedYAMLError as exc:
        where = f" (line {exc.problem_mark.line + 1})" if exc.problem_mark else ""
        raise ConfigError(f"{p} is not valid YAML: {exc.problem or exc.context}{where}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{p} is not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{p} must hold a mapping of sections, not {type(data).__name__}")
    return data


def parse(model: type[BaseModel], data: dict[str, Any], source: str = "config") -> Any:
    """Validate ``data`` as ``model``; the error lists each bad key as ``section.key: problem``."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            where = ".".join(str(part) for part in err["loc"]) or "(top level)"
            problems.append(f"  {where}: {err['msg']}")
        raise ConfigError(f"{source} is invalid:\n" + "\n".join(problems)) from exc


def load_config(model: type[BaseModel], path: str | Path) -> Any:
    return parse(model, load_yaml(path), source=str(path))
