"""The checker's and the rewriter's demonstrations, mined from recorded SQL rollouts.

A warm start on the writer's demonstrations teaches every role to answer like a writer: a checker trained so
replies with SQL, never with a verdict. Each role needs demonstrations of its own job, and the store already
holds them. Every rollout records each query it ran as an ``sql.exec`` span (who wrote it, the SQL, the first rows
or the error), and its task (the rollout's input) holds the gold query, so for every writer draft we know what
the checker was shown and what it should have said:

- **checker**: the draft with its real result, answered ``OK`` when it returns the gold result
  (``execution.execution_match``, the reward itself) and ``WRONG: <reason>`` when it does not. The reason is
  short and true: the error running it gave (for a reply with no query, "no SQL query found in the reply"),
  ``the result is empty``, ``wrong columns`` (another number of columns than the gold result), else
  ``wrong rows``. OK and WRONG are balanced (as many of each, the first
  ones in rollout order), so the checker does not learn to say the same word every time. A writer that is
  mostly wrong leaves few OK drafts, so the OKs are topped up with the drafted tasks' gold queries and their
  real results (label ``OK_gold``): also a query the checker must approve, shown as the agent would show it.
- **rewriter**: each failing draft with its problem (the error and the checker's right verdict, worded as the
  agent words it), answered with a recorded rewrite that matched the gold result, else the gold query.

The prompts are built by the agent's own builders (``prompts.py``) from the recorded draft and result, so a
demonstration's prompt is the request the agent sends that role for that draft. Writer demonstrations are the
task set's generated ones (``demos.py``). Drafts are found in each rollout's latest attempt, as
:func:`spanlab.adapters.recorded_rollouts.read_rollouts` reads it from the store: everything here works on that
plain data (it runs queries on the tasks' SQLite databases, never reads the span store: agents do not). Left out:
later rounds' rewrites as checker drafts.

    demos = mine_demonstrations(read_rollouts(store, rollout_ids))
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from spanlab.adapters.recorded_rollouts import RecordedRollout
from spanlab.adapters.role_demos import RoleDemonstration
from spanlab.agents.sql.databases import schema_text
from spanlab.agents.sql.execution import ExecResult, execution_match, run_sql
from spanlab.agents.sql.prompts import (
    CHECKER_PROMPT,
    NO_SQL,
    NO_SQL_REASON,
    REWRITER_PROMPT,
    checker_user,
    messages,
    problem_text,
    rewriter_user,
    sql_block,
)
from spanlab.types import Span

__all__ = ["Draft", "checker_demonstrations", "gold_draft", "mine_demonstrations", "rewriter_demonstrations",
           "verdict", "writer_drafts"]

EMPTY, COLUMNS, ROWS = "the result is empty", "wrong columns", "wrong rows"


@dataclass(frozen=True)
class Draft:
    """One writer draft as recorded: its task, reply, query and result, whether it matches the gold result, and a
    recorded rewrite of it that does (None: none did)."""

    rollout_id: str
    task: dict[str, Any]
    reply: str
    sql: str | None
    result: ExecResult
    matches: bool
    reason: str | None  # why it does not match (None when it does)
    span_ids: tuple[str, ...]  # the sql.exec span it was read from
    good_rewrite: str | None = None


def verdict(draft: Draft) -> str:
    """What a right checker answers about ``draft``."""
    return "OK" if draft.matches else f"WRONG: {draft.reason}"


def _reason(result: ExecResult, task: dict[str, Any]) -> str:
    """Why a non-matching result is wrong, in the fewest true words."""
    if result.error is not None:
        return NO_SQL_REASON if result.error == NO_SQL else result.error
    if not (result.row_count if result.row_count is not None else len(result.rows)):
        return EMPTY
    gold = run_sql(task["db"], task["gold_sql"], max_rows=1)
    width = len(gold.columns) if gold.columns else len(gold.rows[0]) if gold.rows else None
    if result.rows and width is not None and len(result.rows[0]) != width:
        return COLUMNS
    return ROWS


def _recorded_result(span: Span) -> ExecResult:
    """The result an ``sql.exec`` span recorded (its first rows and the count), as the agent previewed it."""
    a = span.attributes
    return ExecResult(a.get("sql") or "", rows=[tuple(r) for r in a.get("rows") or []], error=a.get("error"),
                      truncated=bool(a.get("truncated")), row_count=a.get("row_count"))


def _reply(spans: Sequence[Span], role: str, recorded: str | None) -> str:
    """The reply a draft came from: as its ``sql.exec`` span recorded it (it does when the reply held no SQL),
    else the text of ``role``'s first call in the attempt ('' if none was recorded)."""
    if recorded is not None:
        return recorded
    for span in spans:
        if span.kind == "llm_call" and span.attributes.get("agent") == role and span.llm is not None:
            message = span.llm.response_message or {}
            return str(message.get("content") or "")
    return ""


def _draft(rollout_id: str, task: dict[str, Any], spans: Sequence[Span]) -> Draft | None:
    execs = [s for s in spans if s.name == "sql.exec"]
    first = next((s for s in execs if s.attributes.get("author") == "writer"), None)
    if first is None:
        return None
    sql = first.attributes.get("sql")
    result = _recorded_result(first)
    matches = execution_match(task["db"], sql, task["gold_sql"])
    rewrites = [s.attributes.get("sql") for s in execs if s.attributes.get("author") == "rewriter"]
    good = next((r for r in rewrites if r and execution_match(task["db"], r, task["gold_sql"])), None)
    return Draft(rollout_id, task, _reply(spans, "writer", first.attributes.get("reply")), sql, result, matches,
                 None if matches else _reason(result, task), (first.span_id,), None if matches else good)


def writer_drafts(rollouts: Sequence[RecordedRollout]) -> list[Draft]:
    """The writer's first draft of each rollout with an SQL task, in the rollouts' order.

    Raises ValueError, one line, when none of them recorded a draft: nothing to mine."""
    drafts = []
    for rollout in rollouts:
        task = rollout.task
        if rollout.attempt_id is None or not (isinstance(task, dict) and {"db", "gold_sql"} <= task.keys()):
            continue
        if (draft := _draft(rollout.rollout_id, task, rollout.spans)) is not None:
            drafts.append(draft)
    if not drafts:
        raise ValueError(f"no SQL rollouts to mine: none of the {len(rollouts)} rollouts read has a task with db and "
                         "gold_sql and a writer draft (sql.exec span); record rollouts of the sql agent first")
    return drafts


def _demo(role: str, system: str, user: str, answer: str, draft: Draft, label: str) -> RoleDemonstration:
    return RoleDemonstration(role=role, messages=[*messages(system, user), {"role": "assistant", "content": answer}],
                             task=draft.task, label=label, span_ids=draft.span_ids,
                             group_id=str(draft.task.get("task_id", draft.rollout_id)))


def gold_draft(draft: Draft) -> Draft:
    """The gold query of ``draft``'s task as a draft that matches, with the result running it gives."""
    task = draft.task
    result = run_sql(task["db"], task["gold_sql"])
    return Draft(draft.rollout_id, task, sql_block(task["gold_sql"]), task["gold_sql"], result, True, None, ())


def checker_demonstrations(drafts: Sequence[Draft]) -> list[RoleDemonstration]:
    """One checker demonstration per distinct draft, OK and WRONG balanced (alternating, first ones kept; the OKs
    topped up with the drafted tasks' gold queries when the recorded ones are fewer than the WRONGs).

    Raises ValueError, one line, when no draft is wrong: there is nothing to balance the OKs with."""
    seen: set[tuple[str, str]] = set()
    by_label: dict[str, list[RoleDemonstration]] = {"OK": [], "WRONG": []}

    def add(d: Draft, label: str) -> None:
        user = checker_user(schema_text(d.task["db"]), d.task["question"], d.sql, d.reply, d.result)
        if (d.task["db"], user) not in seen:
            seen.add((d.task["db"], user))
            by_label["OK" if d.matches else "WRONG"].append(_demo("checker", CHECKER_PROMPT, user, verdict(d), d,
                                                                  label))

    for d in drafts:
        add(d, "OK" if d.matches else "WRONG")
    ok, wrong = by_label["OK"], by_label["WRONG"]
    if not wrong:
        raise ValueError(f"cannot balance the checker's demonstrations: all {len(ok)} distinct drafts match the gold "
                         "result, none is wrong; record more rollouts (e.g. at a higher rollouts.temperature)")
    for d in drafts:
        if len(ok) >= len(wrong):
            break
        add(gold_draft(d), "OK_gold")
    n = min(len(ok), len(wrong))
    return [demo for pair in zip(ok[:n], wrong[:n], strict=True) for demo in pair]


def rewriter_demonstrations(drafts: Sequence[Draft]) -> list[RoleDemonstration]:
    """One rewriter demonstration per failing draft: the draft and its problem, answered with a recorded rewrite
    that matched the gold result, else with the gold query."""
    demos = []
    for d in drafts:
        if d.matches:
            continue
        problem = problem_text(d.result.error, verdict(d))
        user = rewriter_user(schema_text(d.task["db"]), d.task["question"], d.sql, d.reply, problem)
        answer, label = (d.good_rewrite, "recorded") if d.good_rewrite else (d.task["gold_sql"], "gold")
        demos.append(_demo("rewriter", REWRITER_PROMPT, user, sql_block(answer), d, label))
    return demos


def mine_demonstrations(rollouts: Sequence[RecordedRollout]) -> list[RoleDemonstration]:
    """The checker's and the rewriter's demonstrations from the rollouts' recorded drafts (see the module doc)."""
    drafts = writer_drafts(rollouts)
    return [*checker_demonstrations(drafts), *rewriter_demonstrations(drafts)]
