"""The three roles' prompts: short, because the default model is a 135M model with a 2048-token context.

Each prompt is a one-line system message and a user message holding the compact schema of the task's
one database, the question, and (checker, rewriter) the draft query with what running it gave. The
writer's messages are also the SFT demonstrations' prompt (``demos.py``), so both are built here and
only here: a changed word changes the live agent and its warm start together.
"""

from __future__ import annotations

import re
from typing import Literal

from spanlab.agents.sql.execution import ExecResult

Role = Literal["writer", "checker", "rewriter"]
ROLES: tuple[Role, ...] = ("writer", "checker", "rewriter")

WRITER_PROMPT = "You write SQLite queries for the tables below. Reply with one query in a ```sql code block."
CHECKER_PROMPT = "You check SQLite queries. Reply OK if the query answers the question, else WRONG: and the reason."
REWRITER_PROMPT = "You fix SQLite queries. Reply with the corrected query in a ```sql code block."

# The error a reply without a query gets (the checker and the rewriter are shown it), and its first clause: the
# reason a right checker gives, without the instruction to the writer.
NO_SQL = "no SQL query found in the reply: answer with one SELECT query in a ```sql code block"
NO_SQL_REASON = NO_SQL.partition(":")[0]

_VERDICT_OK = re.compile(r"\s*(?:\**)\s*(OK|CORRECT)\b", re.IGNORECASE)
_VERDICT_WRONG = re.compile(r"\s*(?:\**)\s*(WRONG|INCORRECT)\b", re.IGNORECASE)
_PREVIEW_ROWS = 5
_MAX_DRAFT_CHARS = 600


def sql_block(sql: str) -> str:
    """A query in the output format the writer and rewriter are asked for."""
    return f"```sql\n{sql}\n```"


def writer_user(schema: str, question: str) -> str:
    # "Write the SQL query for:" rather than "Question:": on 60 val tasks the base model then answered
    # with SQL 58 times instead of 21 (it otherwise often answers the question in prose).
    return f"{schema}\n\nWrite the SQL query for: {question}"


def _draft(sql: str | None, reply: str) -> str:
    """The query to show: the extracted SQL, else the writer's raw reply (clipped), so the flaw is visible."""
    return sql_block(sql) if sql else reply.strip()[:_MAX_DRAFT_CHARS] or "(empty reply)"


def checker_user(schema: str, question: str, sql: str | None, reply: str, result: ExecResult) -> str:
    return (
        f"{schema}\n\nQuestion: {question}\n\nQuery:\n{_draft(sql, reply)}\n\nResult:\n{result.preview(_PREVIEW_ROWS)}"
    )


def rewriter_user(schema: str, question: str, sql: str | None, reply: str, problem: str) -> str:
    return f"{schema}\n\nQuestion: {question}\n\nQuery:\n{_draft(sql, reply)}\n\nProblem: {problem}"


def problem_text(error: str | None, verdict: str | None) -> str:
    """What the rewriter is told is wrong: the error running the query gave and the checker's verdict."""
    return "; ".join(p for p in (error, verdict) if p) or "the result looks wrong"


def verdict_ok(text: str | None) -> bool:
    """Whether the checker's reply approves the query (its first word is OK or CORRECT)."""
    return bool(text and _VERDICT_OK.match(text))


def verdict_wrong(text: str | None) -> bool:
    """Whether the checker's reply rejects the query (its first word is WRONG or INCORRECT)."""
    return bool(text and _VERDICT_WRONG.match(text))


def verdict_given(text: str | None) -> bool:
    """Whether the checker's reply is a verdict at all (approves or rejects), not SQL or prose."""
    return verdict_ok(text) or verdict_wrong(text)


def verdict_right(text: str | None, draft_matches: bool) -> bool:
    """Whether the checker judged the draft as it is: OK on a draft that matches the gold result, WRONG on one
    that does not. A reply that starts with neither is never right (it is not a verdict)."""
    if verdict_ok(text):
        return draft_matches
    return verdict_wrong(text) and not draft_matches


def messages(system: str, user: str) -> list[dict[str, str]]:
    """The two messages the Agents SDK sends for ``instructions=system`` and input ``user``."""
    return [{"content": system, "role": "system"}, {"role": "user", "content": user}]
