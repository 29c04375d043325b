"""Stored spans -> the chat conversation of each rollout, for algorithms that read text (APO's critiques).

A rollout's conversation is its last attempt's last successful LLM call: the request messages plus
the response message (each call's request already holds the history before it; a call that failed or that the
agent abandoned is never read, :mod:`spanlab.adapters.trainable`). The agent's own ``custom`` spans (a grader's
verdict, notes) come along as ``notes``; the final reward too (the one :func:`~.trainable.final_index` picks). Reads are
one query for all rollouts (the store is slow per rollout, REFERENCE.md §8), messages only, no tokens.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from spanlab.adapters.trainable import final_index, final_mark, is_late, trainable_call
from spanlab.store.base import StoreAPI

_COLUMNS = ["rollout_id", "attempt_id", "sequence_id", "name", "kind", "status", "attributes",
            "request_messages", "response_message", "reward_value", "reward_call_span_id"]


@dataclass
class Conversation:
    rollout_id: str
    messages: list[dict[str, Any]] = field(default_factory=list)
    notes: dict[str, dict[str, Any]] = field(default_factory=dict)  # custom span name -> its attributes
    reward: float | None = None


def conversations(store: StoreAPI, rollout_ids: Sequence[str]) -> dict[str, Conversation]:
    """``rollout_id -> Conversation`` for each given rollout (one with no spans gets an empty one)."""
    out = {rid: Conversation(rid) for rid in rollout_ids}
    if not rollout_ids:
        return out
    last_attempts = {a.attempt_id for _, a in store.last_attempts(list(rollout_ids))}
    rows = store.spans_reader(rollout_ids=list(rollout_ids), columns=_COLUMNS).read_all().to_pylist()
    rewards: dict[str, list[dict[str, Any]]] = {}  # rollout_id -> its last attempt's reward rows, in order
    for row in rows:  # ordered by rollout, attempt, sequence: the last ok call of the attempt wins
        if row["attempt_id"] not in last_attempts:
            continue
        conv = out[row["rollout_id"]]
        if row["kind"] == "llm_call" and trainable_call(row["status"]):
            response = _json(row["response_message"])
            conv.messages = list(_json(row["request_messages"]) or []) + ([response] if response else [])
        elif row["kind"] == "custom":
            conv.notes[row["name"]] = _json(row["attributes"]) or {}
        elif row["kind"] == "reward" and not is_late(row["attributes"]):  # a late reward is never the outcome
            rewards.setdefault(row["rollout_id"], []).append(row)
    for rollout_id, rows_R in rewards.items():
        i = final_index([final_mark(r["attributes"]) for r in rows_R], [r["reward_call_span_id"] for r in rows_R])
        out[rollout_id].reward = None if i is None else rows_R[i]["reward_value"]
    return out


def transcript(conv: Conversation, *, max_chars: int = 600, skip_system: bool = True) -> str:
    """A readable text form of a conversation (long messages cut to ``max_chars``) for an LLM to read."""
    lines = []
    for msg in conv.messages:
        role = msg.get("role", "?")
        if skip_system and role == "system":
            continue
        text = _content_text(msg.get("content"))
        for call in msg.get("tool_calls") or []:
            fn = call.get("function", {})
            text += f"\n[calls {fn.get('name')}({fn.get('arguments')})]"
        text = text.strip()
        if len(text) > max_chars:
            text = text[:max_chars] + f" ... [{len(text) - max_chars} more characters]"
        lines.append(f"{role}: {text}")
    return "\n".join(lines)


def _content_text(content: Any) -> str:
    if isinstance(content, list):  # OpenAI content parts
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


def _json(value: Any) -> Any:
    if value is None or not isinstance(value, str):
        return value
    return json.loads(value)
