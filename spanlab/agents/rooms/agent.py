"""The room selector: a plain OpenAI-client tool loop whose prompt is a versioned POML resource.

One rollout: render the POML template (``ctx.resources["prompt"]``, else the packaged default
``prompt.poml``) with the task's variables (``request``), then up to ``max_turns`` chat calls through
the gateway with three tools over the seeded building (``find_rooms``, ``list_rooms``,
``check_availability``). The first turn may force a tool call (SmolLM2 never calls a tool on its own,
REFERENCE.md §8), the last turn forbids one so the run ends with an answer. ``answer_max_tokens`` caps
that answer on its own: a tool call needs room for its JSON arguments (SmolLM2 pretty-prints them in
~80-100 tokens), while an answer only has to name a room, and a small model otherwise rambles to the cap.
Reward: :func:`grade` (1.0 for the policy's room, partial credit for constraints met). The rollout also records a
``tool_call`` span per executed call and a ``grade`` span (answer, expected, constraints met/missed),
which APO's critiques read. The version of the prompt used is the rollout's ``resources_version``.

Use: ``Worker(store, load_agent("rooms", {"model": served_name}), gateway_url=gw.url)``.
Left out: parallel tool calls in one turn beyond executing them in order, streaming, multiple days.
"""

from __future__ import annotations

import asyncio
import json
import logging
from importlib import resources
from typing import Any, Literal

from openai import AsyncOpenAI

from spanlab.agents.rooms.building import EQUIPMENT, make_building
from spanlab.agents.rooms.tasks import grade
from spanlab.prompts import DEFAULT_RENDERER, PromptRenderer
from spanlab.runner.agent import Agent, RolloutContext
from spanlab.types import Span

logger = logging.getLogger(__name__)

ToolChoice = Literal["auto", "required", "none"]
REQUIRED_VARIABLES: tuple[str, ...] = ("request",)  # every prompt version must place these


def default_template() -> str:
    """The packaged starting prompt (APO's round-0 parent)."""
    return resources.files("spanlab.agents.rooms").joinpath("prompt.poml").read_text()


def _function(name: str, description: str, properties: dict[str, Any], required: list[str],
              strict: bool) -> dict[str, Any]:
    params = {"type": "object", "properties": properties, "required": required, "additionalProperties": False}
    fn: dict[str, Any] = {"name": name, "description": description, "parameters": params}
    if strict:
        fn["strict"] = True
    return {"type": "function", "function": fn}


def room_tools(strict: bool = False) -> list[dict[str, Any]]:
    """The tools the model is offered (``strict``: vLLM then guides the arguments' JSON)."""
    time_ = {"type": "string", "description": "start time, HH:MM (24 h)"}
    minutes = {"type": "integer", "description": "meeting length in minutes"}
    return [
        _function("find_rooms", "Rooms with enough seats and the equipment that are free for the whole slot.", {
            "attendees": {"type": "integer"},
            "equipment": {"type": "array", "items": {"type": "string", "enum": list(EQUIPMENT)}},
            "accessible": {"type": "boolean", "description": "step-free access needed"},
            "start": time_, "duration_min": minutes,
        }, ["attendees", "equipment", "accessible", "start", "duration_min"], strict),
        _function("list_rooms", "All rooms with floor, capacity, equipment and accessibility.", {}, [], strict),
        _function("check_availability", "Whether one room is free for a slot, and its conflicting bookings.", {
            "room": {"type": "string"}, "start": time_, "duration_min": minutes,
        }, ["room", "start", "duration_min"], strict),
    ]


def run_tool(seed: int, name: str, arguments: str) -> str:
    """Execute a tool call on building ``seed``; bad calls return an error the model can read."""
    building = make_building(seed)
    tools = {"find_rooms": building.find_rooms, "list_rooms": building.list_rooms,
             "check_availability": building.check_availability}
    if name not in tools:
        return json.dumps({"error": f"unknown tool {name!r}; tools: {', '.join(tools)}"})
    try:
        args = json.loads(arguments or "{}")
        if not isinstance(args, dict):
            raise ValueError("arguments must be a JSON object")
        return json.dumps(tools[name](**args))
    except (ValueError, TypeError) as exc:  # bad JSON, wrong or missing arguments, bad time strings
        return json.dumps({"error": f"{name}: {exc}"})


class RoomsAgent(Agent):
    """Picks a room for one task dict (see ``tasks.py``); returns the graded reward."""

    roles: tuple[str, ...] | None = ()  # a single agent: its calls name no role

    def __init__(self, model: str, temperature: float = 0.0, max_tokens: int = 128, max_turns: int = 2,
                 first_tool_choice: ToolChoice = "required", strict_tools: bool = True,
                 prompt_resource: str = "prompt", seed: int | None = 0,
                 renderer: PromptRenderer | None = None, answer_max_tokens: int | None = None) -> None:
        if max_turns < 1 or max_tokens < 1 or (answer_max_tokens is not None and answer_max_tokens < 1):
            raise ValueError("max_turns, max_tokens and answer_max_tokens must be >= 1")
        self.model, self.temperature, self.max_tokens, self.max_turns = model, temperature, max_tokens, max_turns
        self.answer_max_tokens = answer_max_tokens or max_tokens
        self.first_tool_choice, self.prompt_resource, self.seed = first_tool_choice, prompt_resource, seed
        self.tools = room_tools(strict_tools)
        self.renderer = renderer or DEFAULT_RENDERER

    def template(self, ctx: RolloutContext) -> str:
        res = ctx.resources.get(self.prompt_resource)
        return str(res.payload["template"]) if res is not None else default_template()

    def _tool_choice(self, turn: int) -> ToolChoice:
        if turn == self.max_turns - 1:
            return "none"  # the last turn must answer
        return self.first_tool_choice if turn == 0 else "auto"

    async def run(self, task: Any, ctx: RolloutContext) -> float:
        if ctx.llm_base_url is None:
            raise ValueError("RoomsAgent needs a gateway: run it with a Worker that has gateway_url set")
        messages = await self.renderer.arender(self.template(ctx), {v: task[v] for v in REQUIRED_VARIABLES})
        spans: list[Span] = []
        final: str | None = None
        async with AsyncOpenAI(base_url=ctx.llm_base_url, api_key=ctx.llm_api_key, max_retries=0) as client:
            for turn in range(self.max_turns):
                choice = self._tool_choice(turn)
                response = await client.chat.completions.create(
                    model=self.model, messages=messages, tools=self.tools, tool_choice=choice,
                    temperature=self.temperature, seed=self.seed,
                    max_tokens=self.answer_max_tokens if choice == "none" else self.max_tokens,
                )
                msg = response.choices[0].message
                calls = msg.tool_calls or []
                if not calls or choice == "none":
                    final = msg.content
                    break
                messages.append(msg.model_dump(include={"role", "content", "tool_calls"}, exclude_none=True))
                for call in calls:
                    result = run_tool(task["seed"], call.function.name, call.function.arguments)
                    messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
                    spans.append(self._span(ctx, "tool:" + call.function.name, "tool_call",
                                            arguments=call.function.arguments, result=result))
        outcome = grade(final, task)
        spans.append(self._span(ctx, "grade", "custom", final_answer=final, **outcome))
        await asyncio.to_thread(ctx.store.add_spans, spans)
        return outcome["reward"]

    @staticmethod
    def _span(ctx: RolloutContext, name: str, kind: Literal["tool_call", "custom"], **attributes: Any) -> Span:
        return Span(rollout_id=ctx.rollout.rollout_id, attempt_id=ctx.attempt.attempt_id, name=name, kind=kind,
                    attributes=attributes)
