"""Rollouts as the store recorded them: each one's task (its input) and its latest attempt's spans, in order.

Why an adapter: a task set mines demonstrations from what its agent recorded (the SQL agent's drafts and verdicts,
:mod:`spanlab.agents.sql.mining`), but agents never read the store. Which rows of which store are read is here, on
the store's typed reads (a store file and a store server alike); the miner gets plain data.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from spanlab.store.base import StoreAPI
from spanlab.types import Span

__all__ = ["RecordedRollout", "read_rollouts"]


@dataclass(frozen=True)
class RecordedRollout:
    """One rollout: its task, and the spans of its latest attempt by ``sequence_id`` (none when it never ran)."""

    rollout_id: str
    task: Any  # the rollout's input, as enqueued
    attempt_id: str | None
    spans: tuple[Span, ...]


def read_rollouts(store: StoreAPI, rollout_ids: Sequence[str] | None = None) -> list[RecordedRollout]:
    """The rollouts of ``rollout_ids`` (None: all) in enqueue order, each with its latest attempt's spans."""
    summaries = store.rollout_summaries(list(rollout_ids) if rollout_ids is not None else None)
    attempt_ids = [s.last_attempt_id for s in summaries if s.last_attempt_id is not None]
    by_attempt: dict[str, list[Span]] = defaultdict(list)
    if attempt_ids:
        for span in store.iter_spans(attempt_ids=attempt_ids):
            by_attempt[span.attempt_id or ""].append(span)
    return [RecordedRollout(s.rollout_id, s.input, s.last_attempt_id,
                            tuple(sorted(by_attempt.get(s.last_attempt_id or "", ()),
                                         key=lambda span: span.sequence_id or 0)))
            for s in summaries]
