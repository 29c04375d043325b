"""Demonstrations for an SFT warm start of the SQL writer, in the writer's exact request shape.

The writer is the role every rollout starts with and the one whose output decides most rewards, so it
is the one warmed up: a demonstration is the conversation the live writer sends (the same system
prompt, the same user text built by ``prompts.py``) followed by an assistant turn with the gold query
in the format the writer is asked for (a ```sql block). ``tests/agents/test_sql_agent.py`` checks,
token for token against the live server, that the prompt part renders to what the agent really sends.
No tools: the writer has none (``"tools": None``).

Render for training: ``tokenizer.apply_chat_template(d["messages"])``.
"""

from __future__ import annotations

from typing import Any, TypedDict

from spanlab.agents.sql.databases import schema_text
from spanlab.agents.sql.prompts import WRITER_PROMPT, messages, sql_block, writer_user


class Demonstration(TypedDict):
    messages: list[dict[str, Any]]
    tools: None


def writer_messages(task: dict[str, Any], system_prompt: str = WRITER_PROMPT) -> list[dict[str, Any]]:
    """The writer's request for ``task``: system prompt, then schema and question."""
    return messages(system_prompt, writer_user(schema_text(task["db"]), task["question"]))


def demonstration(task: dict[str, Any], system_prompt: str = WRITER_PROMPT) -> Demonstration:
    """A correct writer turn for ``task`` (from ``make_tasks``; answers with its ``gold_sql``)."""
    answer = {"role": "assistant", "content": sql_block(task["gold_sql"])}
    return Demonstration(messages=[*writer_messages(task, system_prompt), answer], tools=None)
