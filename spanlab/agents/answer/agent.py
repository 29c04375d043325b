"""The answer agent: one question, one answer between tags, scored by the task's own scorer.

One rollout: render the POML prompt (``ctx.resources["prompt"]``, else the packaged ``prompt.poml``) with the task's
``question`` and the answer tags, ask the model once through the gateway (``ctx.llm_base_url``), take the text
between the last ``<answer>`` and ``</answer>`` and score it. ``tools: [calculator]`` offers the calc agent's MCP
calculator (its stdio server process, one per agent and event loop) for up to ``max_turns`` calls; the last call
forbids tools, so the run ends with text. Reward: the scorer's (``reasoning_gym``: the family's ``score_answer``,
:mod:`spanlab.tasksets.reasoning_gym.scoring`; ``exact``: 1.0 when the answer equals ``task["answer"]``), returned
as :class:`~spanlab.runner.agent.Scored` so the reward span names the family and its settings. An output without
the tags scores as no answer (None), and a ``no_answer_tag`` span says so; every rollout records a ``grade`` span
(answer, expected, reward) that APO's critiques read.

Use: ``agent: {name: answer, kwargs: {max_tokens: 256, tools: [calculator]}}``.
Left out: multi-turn conversations with the user, streaming, parallel tool calls beyond running them in order.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

from openai import AsyncOpenAI

from spanlab.agents.answer.prompt import default_template, extract_answer, render
from spanlab.agents.answer.tools import TOOLS, chat_with_tools
from spanlab.prompts import DEFAULT_RENDERER, PromptRenderer
from spanlab.runner.agent import Agent, RolloutContext, Scored

if TYPE_CHECKING:
    from spanlab.agents.calc.agent import Calculators

logger = logging.getLogger(__name__)

Scorer = Literal["reasoning_gym", "exact"]
SCORERS: dict[str, str] = {"reasoning_gym": "spanlab.tasksets.reasoning_gym.scoring:score",
                           "exact": "spanlab.agents.answer.agent:exact_score"}


def exact_score(answer: str | None, task: dict[str, Any]) -> dict[str, Any]:
    """1.0 when the answer is the task's ``answer`` (both stripped), for question/answer task sets of your own."""
    expected = str(task["answer"]).strip()
    return {"reward": float(answer is not None and answer.strip() == expected), "expected": expected}


def load_scorer(name: str) -> Callable[[str | None, dict[str, Any]], dict[str, Any]]:
    module, _, function = SCORERS[name].partition(":")
    return getattr(importlib.import_module(module), function)


class AnswerAgent(Agent):
    """Answers one task dict (``question``, plus what its scorer reads); returns the scored reward."""

    roles: tuple[str, ...] | None = ()  # a single agent: its calls name no role

    def __init__(self, model: str, temperature: float = 0.0, max_tokens: int = 256, tools: list[str] | None = None,
                 max_turns: int = 3, answer_tag: str = "answer", scorer: Scorer = "reasoning_gym",
                 prompt_resource: str = "prompt", seed: int | None = None,
                 renderer: PromptRenderer | None = None) -> None:
        if max_tokens < 1 or max_turns < 1:
            raise ValueError("max_tokens and max_turns must be >= 1")
        if unknown := sorted(set(tools or ()) - set(TOOLS)):
            raise ValueError(f"tools: unknown tool {unknown[0]!r} (tools: {', '.join(TOOLS)})")
        if scorer not in SCORERS:
            raise ValueError(f"scorer must be one of {sorted(SCORERS)}, not {scorer!r}")
        if not answer_tag.isidentifier():
            raise ValueError(f"answer_tag must be a plain name such as answer, not {answer_tag!r}")
        self.model, self.temperature, self.max_tokens, self.max_turns = model, temperature, max_tokens, max_turns
        self.tools, self.answer_tag, self.prompt_resource, self.seed = tuple(tools or ()), answer_tag, \
            prompt_resource, seed
        self.score = load_scorer(scorer)
        self.renderer = renderer or DEFAULT_RENDERER
        self._calculator_pool: Calculators | None = None  # with tools only

    def template(self, ctx: RolloutContext) -> str:
        res = ctx.resources.get(self.prompt_resource)
        return str(res.payload["template"]) if res is not None else default_template()

    def _calculators(self) -> Calculators:
        """The calc agent's per-loop calculator processes, made on first use: without tools, the calc agent's
        module (the Agents SDK) is never imported."""
        if self._calculator_pool is None:
            from spanlab.agents.calc.agent import Calculators

            self._calculator_pool = Calculators()
        return self._calculator_pool

    async def aclose(self) -> None:
        """Stop this event loop's calculator process, if one was started."""
        if self._calculator_pool is not None:
            await self._calculator_pool.close_current()

    async def _ask(self, messages: list[dict[str, Any]], ctx: RolloutContext) -> tuple[str | None, list[Any]]:
        create = {"model": self.model, "temperature": self.temperature, "max_tokens": self.max_tokens,
                  "seed": self.seed}
        async with AsyncOpenAI(base_url=ctx.llm_base_url, api_key=ctx.llm_api_key, max_retries=0) as client:
            if not self.tools:
                response = await client.chat.completions.create(messages=messages, **create)
                return response.choices[0].message.content, []
            server = await self._calculators().current().ready()
            return await chat_with_tools(client, server, messages, max_turns=self.max_turns, **create)

    async def run(self, task: Any, ctx: RolloutContext) -> Scored:
        if ctx.llm_base_url is None:
            raise ValueError("AnswerAgent needs a gateway: run it with a Worker that has gateway_url set")
        messages = await asyncio.to_thread(render, self.renderer, self.template(ctx), task["question"],
                                           self.answer_tag)
        output, calls = await self._ask(messages, ctx)
        for call in calls:
            await asyncio.to_thread(ctx.add_span, "tool:" + call["tool"], "tool_call", **call)
        answer = extract_answer(output, self.answer_tag)
        if answer is None:
            await asyncio.to_thread(ctx.add_span, "no_answer_tag", output=output, tag=self.answer_tag,
                                    why="no tool-free final text" if output is None else
                                    f"the output has no <{self.answer_tag}>...</{self.answer_tag}> pair")
        graded = dict(await asyncio.to_thread(self.score, answer, task))
        await asyncio.to_thread(ctx.add_span, "grade", answer=answer, final_output=output, **graded)
        reward = float(graded.pop("reward"))
        return Scored(reward, {k: v for k, v in graded.items() if k in ("family", "level", "settings", "error")})
