"""The MCP math tutorial agent: an OpenAI Agents SDK agent with a calculator served over MCP stdio.

One rollout = one ``Runner.run`` of an SDK ``Agent`` whose model is ``OpenAIChatCompletionsModel`` on
``AsyncOpenAI(base_url=ctx.llm_base_url)``, so every model call goes through spanlab's gateway and is
recorded with its exact token IDs. The calculator is ``spanlab.agents.calc.mcp_server`` in a
subprocess, reached with the SDK's ``MCPServerStdio``. Reward: 1.0 when the last number in the final
output equals ``task["answer"]`` (:func:`score`), else 0.0; a run that ends without a final answer
(``max_turns`` exhausted, a call to an unknown tool) also scores 0.0. Each rollout whose task holds its
``expression`` and that called the calculator also records the metric ``calc.extra_ops`` (1.0 when its
answer's expression used more operations than the task needs, :mod:`spanlab.agents.calc.operations`), which
held-out evaluations report per split.

The system prompt is ``system_prompt`` unless the rollout's resources hold a POML template named
``prompt_resource`` (APO's prompt versions): then the template rendered with the task's ``question`` gives
the instructions (its system part) and the input (the rest). :func:`default_template` is APO's starting
version and renders to exactly ``SYSTEM_PROMPT`` + the question, so APO starts from the agent's own prompt.

The server process is shared: one per agent instance and event loop, started by the first rollout
and kept (measured on 2 busy cores: spawn + initialize 1.6-2.3 s, stop 0.5 s; reusing a warm one
2 us, a tool call ~2.6 ms). One background task owns it, because the MCP client's anyio scopes must
be closed by the task that opened them; it stops on :meth:`CalcAgent.aclose` or, at the latest,
when ``asyncio.run`` cancels leftover tasks at exit.

``api="messages"`` (``agent: {name: calc, kwargs: {api: messages}}``) runs the same task, tool and reward with the
model loop written on the Anthropic Messages API instead (the ``anthropic`` SDK against the gateway's
``/v1/messages``: :mod:`spanlab.agents.calc.messages_loop`); the calculator process is the same.

Use: ``Worker(store, load_agent("calc", {"model": served_name}), gateway_url=gw.url)``.
Left out: tracing to the SDK vendor (disabled per run), streaming, parallel tool calls.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import sys
from pathlib import Path
from typing import Any, Literal

from agents import Agent as SDKAgent
from agents import ModelSettings, OpenAIChatCompletionsModel, RunConfig, Runner
from agents.exceptions import MaxTurnsExceeded, ModelBehaviorError
from agents.items import RunItem, ToolCallItem
from agents.mcp import MCPServerStdio, MCPServerStdioParams
from openai import AsyncOpenAI

from spanlab.agents.calc.demos import SYSTEM_PROMPT
from spanlab.agents.calc.mcp_server import TOOL_NAME
from spanlab.agents.calc.messages_loop import NoFinalAnswer, solve_with_messages
from spanlab.agents.calc.operations import EXTRA_OPS_METRIC, call_expression, extra_operations
from spanlab.prompts import DEFAULT_RENDERER, PromptRenderer
from spanlab.runner.agent import Agent, RolloutContext

logger = logging.getLogger(__name__)

ToolChoice = Literal["auto", "required", "none"]
Api = Literal["chat", "messages"]  # which API the model loop speaks to the gateway
_NUMBER = re.compile(r"(?:(?<![\w)])-)?\d+(?:\.\d+)?")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}\b)")
REQUIRED_VARIABLES: tuple[str, ...] = ("question",)  # every prompt version must place these


def default_template() -> str:
    """The agent's own prompt as POML (APO's round-0 parent): renders to ``SYSTEM_PROMPT`` + the question."""
    return f"<poml>\n<p>{SYSTEM_PROMPT}</p>\n<human-msg>{{{{ question }}}}</human-msg>\n</poml>\n"


def prompt_input(messages: list[dict[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    """A rendered prompt as the SDK takes it: the system messages' text as instructions, the rest as input."""
    instructions = "\n\n".join(str(m["content"]) for m in messages if m["role"] == "system")
    return instructions, [{"role": m["role"], "content": m["content"]} for m in messages if m["role"] != "system"]


def score(text: str | None, task: dict[str, Any]) -> float:
    """1.0 when the last number in ``text`` equals the answer (``1,080`` and ``85.0`` count), else 0.0."""
    numbers = _NUMBER.findall(_THOUSANDS.sub("", text or ""))
    return float(bool(numbers) and float(numbers[-1]) == task["answer"])


def calculator_expressions(items: list[RunItem]) -> list[str]:
    """The expressions of a run's calculator calls, in order (from the SDK's run items)."""
    calls = (item for item in items if isinstance(item, ToolCallItem) and item.tool_name == TOOL_NAME)
    raw = (c.raw_item.get("arguments") if isinstance(c.raw_item, dict) else getattr(c.raw_item, "arguments", None)
           for c in calls)
    return [e for e in map(call_expression, raw) if e is not None]


def server_params() -> MCPServerStdioParams:
    """How to spawn the calculator: this interpreter, with spanlab importable whatever the cwd."""
    root = str(Path(__file__).resolve().parents[3])
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
    return {"command": sys.executable, "args": ["-m", "spanlab.agents.calc.mcp_server"], "env": {"PYTHONPATH": path}}


def tool_error(ctx: Any, error: Exception) -> str:
    """What the model reads when a call fails: the server's own message (the SDK default hides it)."""
    return str(error)


def history_items(question: str, expression: str, result: str, call_id: str = "call_0") -> list[dict[str, Any]]:
    """SDK input items for a conversation in which the calculator was already called (demo-shaped).

    Passing them to :meth:`CalcAgent.solve` continues from there: the SDK replays them as the same
    user / assistant ``tool_calls`` / tool messages that :func:`~spanlab.agents.calc.demos.conversation` builds.
    """
    return [
        {"role": "user", "content": question},
        {
            "type": "function_call",
            "call_id": call_id,
            "name": TOOL_NAME,
            "arguments": json.dumps({"expression": expression}),
        },
        {"type": "function_call_output", "call_id": call_id, "output": [{"type": "input_text", "text": result}]},
    ]


class CalculatorProcess:
    """One calculator MCP server subprocess, connected and owned by a single background task."""

    def __init__(self, timeout_s: float = 30.0) -> None:
        self.server = MCPServerStdio(
            params=server_params(),
            name="calculator",
            cache_tools_list=True,
            client_session_timeout_seconds=timeout_s,
            failure_error_function=tool_error,
        )
        self._ready = asyncio.Event()
        self._stop = asyncio.Event()
        self._error: BaseException | None = None
        self._task = asyncio.get_running_loop().create_task(self._own(), name="calc-mcp-server")

    async def _own(self) -> None:
        try:
            await self.server.connect()
            await self.server.list_tools()  # fills the cache: later runs list tools without a round trip
        except BaseException as exc:  # reported to every rollout waiting in ready(); the next one respawns
            self._error = exc
            self._ready.set()
            if not isinstance(exc, Exception):
                raise
            return
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            # Also runs when asyncio.run cancels leftover tasks at exit: the SDK may then log "Cleanup
            # cancelled", but mcp's stdio transport stops the server process under a shielded scope.
            await self.server.cleanup()
            logger.debug("calculator MCP server stopped")

    async def ready(self) -> MCPServerStdio:
        """The connected server (waits for the first connect; raises if it failed)."""
        await self._ready.wait()
        if self._error is not None:
            raise RuntimeError(f"calculator MCP server failed to start: {self._error!r}") from self._error
        return self.server

    @property
    def alive(self) -> bool:
        return not self._task.done()

    async def close(self) -> None:
        self._stop.set()
        await self._task


class Calculators:
    """One :class:`CalculatorProcess` per event loop, for an agent whose rollouts share a calculator: an agent
    object may outlive its loop (a worker per ``asyncio.run``), and a process belongs to the loop that started it."""

    def __init__(self) -> None:
        self._processes: dict[asyncio.AbstractEventLoop, CalculatorProcess] = {}

    def current(self) -> CalculatorProcess:
        """The running loop's process, started on first use or after it died (no await: concurrent rollouts of
        the loop share it); processes of closed loops are forgotten."""
        loop = asyncio.get_running_loop()
        self._processes = {lp: p for lp, p in self._processes.items() if not lp.is_closed()}
        proc = self._processes.get(loop)
        if proc is None or not proc.alive:
            proc = self._processes[loop] = CalculatorProcess()
        return proc

    async def close_current(self) -> None:
        """Stop the running loop's process, if one was started."""
        proc = self._processes.pop(asyncio.get_running_loop(), None)
        if proc is not None:
            await proc.close()


class CalcAgent(Agent):
    """Solves one task dict (``question``, ``answer``) with the calculator; returns the 0/1 reward.

    ``tool_choice="required"`` forces a tool call on the first turn only (the SDK resets it after a
    tool call), which exercises the tool path with a model that would not call it on its own.
    ``strict_tools`` sends the schema as strict (vLLM then guides the arguments' JSON; the tools list
    changes, see ``calculator_tools(strict=True)``). ``extra_body`` reaches the request body as is (chat only).
    ``api``: ``chat`` (the OpenAI Agents SDK on chat completions) or ``messages`` (the ``anthropic`` SDK on
    ``/v1/messages``, :mod:`~spanlab.agents.calc.messages_loop`).
    """

    roles: tuple[str, ...] | None = ()  # a single agent: its calls name no role

    def __init__(
        self,
        model: str,
        temperature: float = 1.0,
        max_tokens: int = 96,
        max_turns: int = 3,
        tool_choice: ToolChoice | None = None,
        system_prompt: str = SYSTEM_PROMPT,
        strict_tools: bool = False,
        extra_body: dict[str, Any] | None = None,
        prompt_resource: str = "prompt",
        renderer: PromptRenderer | None = None,
        api: Api = "chat",
    ) -> None:
        if max_turns < 1 or max_tokens < 1:
            raise ValueError("max_turns and max_tokens must be >= 1")
        if api not in ("chat", "messages"):
            raise ValueError(f"api must be 'chat' or 'messages', not {api!r}")
        if api == "messages" and extra_body:
            raise ValueError("extra_body is for the chat API; the messages loop sends none")
        self.api = api
        self.model, self.max_turns, self.system_prompt = model, max_turns, system_prompt
        self.strict_tools, self.prompt_resource = strict_tools, prompt_resource
        self.renderer = renderer or DEFAULT_RENDERER
        self.model_settings = ModelSettings(
            temperature=temperature, max_tokens=max_tokens, tool_choice=tool_choice, extra_body=extra_body
        )
        self._calculators = Calculators()

    def _process(self) -> CalculatorProcess:
        """This loop's server process, started on first use (no await here: concurrent rollouts share it)."""
        return self._calculators.current()

    async def aclose(self) -> None:
        """Stop this event loop's calculator process (call before the loop ends for a clean exit)."""
        await self._calculators.close_current()

    def sdk_agent(self, client: AsyncOpenAI, server: MCPServerStdio, instructions: str | None = None) -> SDKAgent[Any]:
        return SDKAgent(
            name="calculator",
            instructions=self.system_prompt if instructions is None else instructions,
            mcp_servers=[server],
            mcp_config={"convert_schemas_to_strict": self.strict_tools},
            model=OpenAIChatCompletionsModel(model=self.model, openai_client=client),
            model_settings=self.model_settings,
        )

    async def solve(self, question: str | list[Any], base_url: str, instructions: str | None = None,
                    api_key: str = "spanlab") -> str | None:
        """The final output for ``question`` (a string, or SDK input items to continue a conversation)."""
        output, _ = await self._solve(question, base_url, instructions, api_key)
        return output

    async def _solve(self, question: str | list[Any], base_url: str, instructions: str | None,
                     api_key: str) -> tuple[str | None, list[RunItem]]:
        """The final output and the run's new items (its tool calls among them)."""
        server = await self._process().ready()
        if self.api == "messages":
            settings = self.model_settings
            output = await solve_with_messages(
                server, question, base_url, model=self.model, api_key=api_key, max_turns=self.max_turns,
                system=self.system_prompt if instructions is None else instructions, strict_tools=self.strict_tools,
                settings={"max_tokens": settings.max_tokens, "temperature": settings.temperature,
                          "tool_choice": settings.tool_choice})
            return output, []  # the Messages loop keeps no SDK run items: no calc.extra_ops for it
        async with AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0) as client:
            result = await Runner.run(
                self.sdk_agent(client, server, instructions),
                question,
                max_turns=self.max_turns,
                run_config=RunConfig(tracing_disabled=True),
            )
        return None if result.final_output is None else str(result.final_output), list(result.new_items)

    async def run(self, task: Any, ctx: RolloutContext) -> float:
        if ctx.llm_base_url is None:
            raise ValueError("CalcAgent needs a gateway: run it with a Worker that has gateway_url set")
        question: str | list[Any] = task["question"]
        instructions = None
        res = ctx.resources.get(self.prompt_resource)
        if res is not None:  # a prompt version (APO): its system part instructs, the rest is the input
            messages = await self.renderer.arender(str(res.payload["template"]), {"question": task["question"]})
            instructions, question = prompt_input(messages)
        try:
            output, items = await self._solve(question, ctx.llm_base_url, instructions, ctx.llm_api_key)
        except (MaxTurnsExceeded, ModelBehaviorError, NoFinalAnswer) as exc:
            logger.debug("task %s ended without an answer: %r", task.get("task_id"), exc)
            await asyncio.to_thread(ctx.add_span, "no_final_answer", error=repr(exc))
            run_data = getattr(exc, "run_data", None)  # the Agents SDK's; the Messages loop has none
            output, items = None, list(run_data.new_items) if run_data is not None else []
        extra = extra_operations(calculator_expressions(items), task)
        if extra is not None:
            await asyncio.to_thread(ctx.add_metric, EXTRA_OPS_METRIC, extra)
        return score(output, task)
