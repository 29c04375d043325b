"""The SQL tutorial agent: a writer drafts a query, a checker critiques its real result, a rewriter fixes it.

One rollout, orchestrated here in Python: the **writer** (schema + question -> a query) speaks first;
the orchestrator runs the draft on the task's real SQLite database (read-only, ``execution.run_sql``)
and shows the **checker** the query with its first rows or its error; the checker answers ``OK`` or
``WRONG: <why>``; unless it said OK about a query that ran, the **rewriter** gets the draft plus the
error and critique and returns a fixed query, which replaces the draft unless it fails to run where the
draft ran (the orchestrator runs both, so a broken rewrite cannot undo a working draft). ``rounds``
repeats check -> rewrite. Reward: 1.0 when the final query's result matches the gold query's
(``execution.execution_match``), else 0.0.

Two intermediate rewards (``ctx.add_reward``: marked ``final: false``, so an attempt that times out after the
checker spoke is never trained on the verdict as its outcome), each recorded right after the call it judges, so
per-turn credit (``grpo.credit``, :mod:`spanlab.adapters.credit`) can pay each role for its own work:
``sql.verdict`` (1.0 when the checker said OK to a query that matches the gold result or WRONG to one that does
not, else 0.0; its mean over an evaluation is the checker's verdict accuracy) and ``sql.fix`` (1.0 when the
rewrite matches the gold result and the query it was asked to fix did not, else 0.0).

Each role is an OpenAI Agents SDK agent of its own (``instructions`` = its one-line system prompt,
``OpenAIChatCompletionsModel`` on ``AsyncOpenAI(base_url=ctx.agent_base_url(role))``), so every call
is recorded as a span with ``attributes.agent = role`` and, with TITO, each role keeps its own token
buffer; a training config then picks which roles' calls it trains on. Every writer or rewriter answer is also
an ``sql.exec`` span (who wrote it, the SQL or None when the reply had none, rows or error, ``match``: whether
its result is the gold result), each verdict a ``sql.check`` span (with the judged query's ``match``) and the
outcome a ``sql.final`` span, which is what "did the checker help" questions query. From those spans each
rollout records what each role did as metrics, never rewards (:mod:`spanlab.agents.sql.roles`): whether the
checker gave a verdict and judged right, whether the rewrite matched, whether a right draft stayed right and a
wrong one was fixed; held-out evaluations report their means. Mining the checker's and the rewriter's
demonstrations reads the same spans (``mining.py``).

Use: ``Worker(store, load_agent("sql", {"model": served_name}), gateway_url=gw.url)``; drop roles with
``roles: [writer]`` (single agent) or ``[writer, rewriter]`` (rewrite only queries that fail to run).
Left out: tools for the model (it never runs SQL itself), streaming, sampling several drafts.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from agents import Agent as SDKAgent
from agents import ModelSettings, OpenAIChatCompletionsModel, RunConfig, Runner
from openai import AsyncOpenAI

from spanlab.agents.sql.databases import schema_text
from spanlab.agents.sql.demos import writer_messages
from spanlab.agents.sql.execution import ExecResult, execution_match, extract_sql, run_sql
from spanlab.agents.sql.prompts import (
    CHECKER_PROMPT,
    NO_SQL,
    REWRITER_PROMPT,
    ROLES,
    WRITER_PROMPT,
    Role,
    checker_user,
    problem_text,
    rewriter_user,
    verdict_ok,
    verdict_right,
)
from spanlab.agents.sql.roles import Event, role_metrics
from spanlab.runner.agent import Agent, RolloutContext

logger = logging.getLogger(__name__)

_SPAN_ROWS = 5


class SQLAgent(Agent):
    """Answers one task dict (``db``, ``question``, ``gold_sql``) with writer/checker/rewriter; returns 0/1.

    ``model``: the served model name (None: the first model the gateway lists). ``roles`` must include
    the writer. ``temperature`` and ``max_tokens`` apply to every role.
    """

    def __init__(
        self,
        model: str | None = None,
        temperature: float = 1.0,
        max_tokens: int = 96,
        rounds: int = 1,
        roles: Sequence[Role] = ROLES,
        exec_timeout_s: float = 2.0,
        extra_body: dict[str, Any] | None = None,
    ) -> None:
        unknown = [r for r in roles if r not in ROLES]
        if unknown or "writer" not in roles:
            raise ValueError(f"roles must include 'writer' and be among {ROLES}, got {list(roles)}")
        if rounds < 0 or max_tokens < 1:
            raise ValueError("rounds must be >= 0 and max_tokens >= 1")
        self.model, self.rounds, self.roles = model, rounds, tuple(roles)
        self.exec_timeout_s = exec_timeout_s
        self.model_settings = ModelSettings(temperature=temperature, max_tokens=max_tokens, extra_body=extra_body)
        self.prompts: dict[Role, str] = {
            "writer": WRITER_PROMPT,
            "checker": CHECKER_PROMPT,
            "rewriter": REWRITER_PROMPT,
        }

    async def _model_name(self, client: AsyncOpenAI) -> str:
        if self.model is None:
            self.model = (await client.models.list()).data[0].id
        return self.model

    async def ask(self, role: Role, user: str, base_url: str, api_key: str = "spanlab") -> str:
        """One call of ``role``'s SDK agent with input ``user``; its reply text ('' if none)."""
        async with AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0) as client:
            agent: SDKAgent[Any] = SDKAgent(
                name=role,
                instructions=self.prompts[role],
                model=OpenAIChatCompletionsModel(model=await self._model_name(client), openai_client=client),
                model_settings=self.model_settings,
            )
            result = await Runner.run(agent, user, max_turns=1, run_config=RunConfig(tracing_disabled=True))
        return "" if result.final_output is None else str(result.final_output)

    async def _execute(self, db: str, sql: str | None, gold_sql: str) -> tuple[ExecResult, bool]:
        """Run a query on the real database: its result, and whether that is the gold result."""
        if sql is None:
            return ExecResult("", error=NO_SQL), False
        result = await asyncio.to_thread(run_sql, db, sql, timeout_s=self.exec_timeout_s)
        matches = result.ok and await asyncio.to_thread(
            execution_match, db, sql, gold_sql, timeout_s=self.exec_timeout_s)
        return result, matches

    async def run(self, task: Any, ctx: RolloutContext) -> float:
        if ctx.llm_base_url is None:
            raise ValueError("SQLAgent needs a gateway: run it with a Worker that has gateway_url set")
        db, question, gold = task["db"], task["question"], task["gold_sql"]
        schema = schema_text(db)
        log = _Log(ctx)
        reply = await self.ask("writer", writer_messages(task)[1]["content"], ctx.agent_base_url("writer"),
                               ctx.llm_api_key)
        sql = extract_sql(reply)
        author: Role = "writer"  # the role whose query is the current one
        result, match = await self._execute(db, sql, gold)  # match: the current query's result is the gold one
        await log.exec(db, sql, result, match, author, 0, reply)
        for round_ in range(1, self.rounds + 1):
            verdict = None
            if "checker" in self.roles:
                verdict = await self.ask(
                    "checker", checker_user(schema, question, sql, reply, result), ctx.agent_base_url("checker"),
                    ctx.llm_api_key,
                )
                await log.span("sql.check", round=round_, verdict=verdict, ok=verdict_ok(verdict), sql=sql,
                               match=match)  # fmt: skip
                await asyncio.to_thread(ctx.add_reward, float(verdict_right(verdict, match)), name="sql.verdict")
            if result.ok and (verdict is None or verdict_ok(verdict)):
                break  # approved, or no checker to object to a query that runs
            if "rewriter" not in self.roles:
                break
            problem = problem_text(result.error, verdict)
            reply = await self.ask(
                "rewriter", rewriter_user(schema, question, sql, reply, problem), ctx.agent_base_url("rewriter"),
                ctx.llm_api_key,
            )
            fixed = extract_sql(reply)
            rewritten, fixed_match = await self._execute(db, fixed, gold)
            await asyncio.to_thread(ctx.add_reward, float(fixed_match and not match), name="sql.fix")
            await log.exec(db, fixed, rewritten, fixed_match, "rewriter", round_, reply)  # recorded even without SQL
            if fixed is None:
                logger.debug("task %s: rewriter gave no SQL, keeping the draft", task.get("task_id"))
                break
            if result.ok and not rewritten.ok:
                break  # the orchestrator ran both: a rewrite that fails never replaces a draft that runs
            sql, author, result, match = fixed, "rewriter", rewritten, fixed_match
        await log.span("sql.final", sql=sql, author=author, match=match)
        await asyncio.to_thread(log.record_metrics)
        return float(match)


@dataclass
class _Log:
    """Records the rollout's ``sql.*`` spans and keeps them, so its role metrics are read off what it recorded."""

    ctx: RolloutContext
    events: list[Event] = field(default_factory=list)

    async def span(self, name: str, **attributes: Any) -> None:
        self.events.append((name, attributes))
        await asyncio.to_thread(self.ctx.add_span, name, **attributes)

    async def exec(self, db: str, sql: str | None, result: ExecResult, match: bool, author: Role, round_: int,
                   reply: str) -> None:
        """One writer or rewriter answer as an ``sql.exec`` span: the query (None: there was none, and then the reply,
        which the checker is shown in place of a query and mining its demonstrations needs) and its result."""
        await self.span("sql.exec", author=author, round=round_, db=db, sql=sql, reply=None if sql else reply,
                        ok=result.ok, error=result.error,
                        rows=[list(r) for r in result.rows[:_SPAN_ROWS]], row_count=len(result.rows),
                        truncated=result.truncated, match=match)  # fmt: skip

    def record_metrics(self) -> None:
        """The rollout's role metrics (:mod:`spanlab.agents.sql.roles`), once its ``sql.final`` is recorded."""
        for name, value in role_metrics(self.events).items():
            self.ctx.add_metric(name, value)
