"""Config files: YAML validated by pydantic, with errors that point at the bad key.

One typed model per concern (store, runner, agent); entry points compose them. Unknown keys are
errors, so a typo (``wokers: 4``) fails loudly instead of being ignored.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from spanlab.errors import ConfigError
from spanlab.strict_scalars import scalar_problem


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

    name: str = Field(description="a registered agent (calc, sql, rooms) or package.module:ClassName")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="keyword arguments of the agent's class")


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


MAX_ALIAS_VALUES = 100_000  # values a config's aliases may add once expanded: far above any real one's
_COUNT_CAP = 10**18  # expanded sizes are counted up to here (a bomb's true size has hundreds of digits)
MAX_PROBLEMS = 10  # problems listed in one error; the rest are counted
# No number of a config is infinite or past 2**31-1 (tokens, steps, epochs, seeds alike): 1e20 micro-batch tokens
# or 1e9 epochs is a typo that would only fail, or never end, once the run is under way. Checked over the raw
# mapping (number_out_of_range), so every section, an algorithm plugin's own included, follows it.
MAX_CONFIG_NUMBER = 2**31 - 1


class _StrictLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """A YAML loader that refuses a key given twice in one mapping (PyYAML keeps the last silently). It parses with
    libyaml where PyYAML was built with it: the pure-Python parser takes seconds per MB of config."""


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
    if p.is_dir():
        raise ConfigError(f"config file {p} is a folder, not a file")
    if not p.is_file():
        raise ConfigError(f"config file {p} does not exist")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{p} is not UTF-8 text (byte {exc.start}); save it as UTF-8") from exc
    except OSError as exc:
        raise ConfigError(f"cannot read config {p}: {exc.strerror or exc}") from exc
    try:
        data = _load(text)
    except RecursionError:
        raise ConfigError(f"{p} is nested too deep to be a config") from None
    except ConfigError as exc:
        raise ConfigError(f"{p} {exc}") from None
    except yaml.MarkedYAMLError as exc:
        where = f" (line {exc.problem_mark.line + 1})" if exc.problem_mark else ""
        raise ConfigError(f"{p} is not valid YAML: {exc.problem or exc.context}{where}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{p} is not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{p} must hold a mapping of sections, not {type(data).__name__}")
    return data


def _load(text: str) -> Any:
    """Compose the document, refuse it if its aliases add more than :data:`MAX_ALIAS_VALUES` values once
    expanded, then build it. Only what aliases add counts: a long config of plain keys is no bomb."""
    loader = _StrictLoader(text)
    try:
        node = loader.get_single_node()
        if node is not None and "*" in text and (added := _alias_growth(node)) > MAX_ALIAS_VALUES:
            raise ConfigError(f"holds {'far ' if added >= _COUNT_CAP // 2 else ''}more than {MAX_ALIAS_VALUES} "
                              "values beyond its own text once its aliases are expanded (a config's aliases add "
                              "far fewer: an alias bomb?)")
        return None if node is None else loader.construct_document(node)
    finally:
        loader.dispose()  # type: ignore[no-untyped-call]


def _alias_growth(root: yaml.Node) -> int:
    """How many nodes aliases add to ``root`` once each is copied out (a "billion laughs" document: 10^9 from a
    few lines): its expanded size less its nodes as written, counted over the composed graph (shared nodes once
    each), so counting costs what the text does."""
    sizes: dict[int, int] = {}
    open_: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        if id(node) in sizes:
            continue
        children = ([n for pair in node.value for n in pair] if isinstance(node, yaml.MappingNode)
                    else list(node.value) if isinstance(node, yaml.SequenceNode) else [])
        if children_done:
            sizes[id(node)] = min(_COUNT_CAP, 1 + sum(sizes[id(c)] for c in children))
            open_.discard(id(node))
            continue
        if id(node) in open_:
            raise ConfigError("holds an alias that contains itself (a recursive structure)")
        open_.add(id(node))
        stack.append((node, True))
        stack.extend((c, False) for c in children if id(c) not in sizes)
    return sizes[id(root)] - len(sizes)


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
            return f"{where}: {str(value)[:40]} is out of range (at most {MAX_CONFIG_NUMBER:,} in a config)"
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
            where = ".".join(str(part) for part in err["loc"]) or "(top level)"
            problems.append(f"  {_short(where)}: {_short(err['msg'])}")
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
