"""What an agent is to the runner: an async function of a task that returns a reward.

Agents talk to the model through ``ctx.llm_base_url`` (the gateway's URL for this attempt, so every
call is recorded as a span of the attempt) with ``ctx.llm_api_key`` as the OpenAI client's ``api_key`` (the
gateway's token when it has one, docs/scale.md) and may report intermediate rewards with
``ctx.add_reward`` and measurements that are not rewards (reported per held-out split) with ``ctx.add_metric``.
The runner records the returned reward as the attempt's final reward (a reward span marked ``final: true``);
``ctx.add_reward`` records intermediate ones (``final: false``), which are never read as the outcome, even when
the attempt stops before it returns (:mod:`spanlab.adapters.trainable`).
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from spanlab.errors import ConfigError, one_line
from spanlab.store.base import StoreAPI
from spanlab.types import Attempt, Resource, Rollout, Span, metric_span, reward_span

# Tutorial agents by short name; anything else is given as "package.module:ClassName".
REGISTERED_AGENTS: dict[str, str] = {
    "answer": "spanlab.agents.answer:AnswerAgent",
    "calc": "spanlab.agents.calc:CalcAgent",
    "rooms": "spanlab.agents.rooms:RoomsAgent",
    "sql": "spanlab.agents.sql:SQLAgent",
}


@dataclass
class RolloutContext:
    """Everything an agent may use during one attempt."""

    rollout: Rollout
    attempt: Attempt
    store: StoreAPI
    llm_base_url: str | None = None
    resources: dict[str, Resource] = field(default_factory=dict)
    llm_api_key: str = "spanlab"  # the gateway's bearer token when it has one; any non-empty key otherwise

    @property
    def headers(self) -> dict[str, str]:
        """Headers that tie a call to this attempt, for clients that cannot change the base URL."""
        return {"x-spanlab-rollout-id": self.rollout.rollout_id, "x-spanlab-attempt-id": self.attempt.attempt_id}

    def agent_base_url(self, name: str) -> str:
        """The base URL for one role of a multi-agent attempt: its calls become spans with ``attributes.agent``.

        Roles are separate conversations, so in TITO mode each keeps its own token buffer, and a training
        config can select which roles' calls it trains on (``agents: [writer]``).
        """
        if self.llm_base_url is None:
            raise RuntimeError("this attempt has no gateway URL (the worker was started without one)")
        return f"{self.llm_base_url.removesuffix('/').removesuffix('/v1')}/agent/{name}/v1"

    def add_reward(self, value: float, *, name: str = "reward", call_span_id: str | None = None) -> None:
        """An intermediate reward (``call_span_id`` ties it to one LLM call), marked so: never the final reward,
        which is what :meth:`Agent.run` returns."""
        self.store.add_spans([reward_span(self.rollout.rollout_id, self.attempt.attempt_id, value, name=name,
                                          call_span_id=call_span_id, final=False)])

    def add_metric(self, name: str, value: float) -> None:
        """A measurement of this attempt that no algorithm trains on (``calc.extra_ops``): held-out evaluations
        report its mean per split and phase (see :func:`~spanlab.types.metric_span`)."""
        self.store.add_spans([metric_span(self.rollout.rollout_id, self.attempt.attempt_id, name, value)])

    def add_span(self, name: str, kind: str = "custom", **attributes: Any) -> None:
        """A custom span (a tool call the agent ran itself, a note) in this attempt."""
        self.store.add_spans([Span(rollout_id=self.rollout.rollout_id, attempt_id=self.attempt.attempt_id,
                                   name=name, kind=kind, attributes=attributes)])


@dataclass(frozen=True)
class Scored:
    """A final reward with what it was scored on, for an agent to return instead of a bare float: the runner
    records it as the attempt's reward span with ``attributes`` (e.g. the task family and its settings), so the
    reward itself says where it came from."""

    value: float
    attributes: dict[str, Any] = field(default_factory=dict)

    def __float__(self) -> float:
        return float(self.value)


class Agent(ABC):
    """Subclass and implement :meth:`run`. Keep it async: a blocking agent stalls its worker's heartbeats.

    ``roles``: the role names its calls carry (:meth:`RolloutContext.agent_base_url`); ``()`` for an agent whose
    calls name no role; None (the default) when it does not say. ``spanlab train --check`` checks a config's
    ``agents`` and ``policies.roles`` against it, since a role the agent never uses is a policy never trained."""

    roles: tuple[str, ...] | None = None

    @abstractmethod
    async def run(self, task: Any, ctx: RolloutContext) -> float | Scored | None:
        """Solve ``task`` (the rollout's input); return the final reward (:class:`Scored`: with what it was scored
        on), or None to record none."""


def load_agent(name: str, kwargs: dict[str, Any] | None = None) -> Agent:
    """An agent instance from a registered name or a ``module:Class`` path."""
    target = REGISTERED_AGENTS.get(name, name)
    if ":" not in target:
        known = ", ".join(sorted(REGISTERED_AGENTS)) or "none yet"
        raise ConfigError(f"agent {name!r} is not registered (known: {known}) and is not a 'module:Class' path")
    module_name, _, class_name = target.partition(":")
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except (Exception, SystemExit) as exc:  # importing runs the module's code: anything may come out of it
        raise ConfigError(f"agent: cannot load agent {target!r}: {one_line(exc)}") from exc
    if not (isinstance(cls, type) and issubclass(cls, Agent)):
        raise ConfigError(f"agent: {target} is not a spanlab.runner.Agent subclass")
    try:
        return cls(**(kwargs or {}))
    except (Exception, SystemExit) as exc:  # the agent's own checks of its kwargs (ValueError, TypeError, ...)
        raise ConfigError(f"agent.kwargs: bad kwargs for {target}: {one_line(exc)}") from exc
