"""The SQL agent's role metrics (spanlab/agents/sql/roles.py): each case of a rollout, the rate each metric is
over, and that the spans they are read from survive a real store unchanged. The live agent's recorded metrics
are checked against its real spans in test_sql_agent.py."""

from __future__ import annotations

from typing import Any

import pytest

from spanlab.agents.sql.roles import (
    CHECKER_ACCURACY,
    CHECKER_VERDICT,
    DRAFT_RIGHT,
    REWRITER_FIX,
    RIGHT_DRAFT_KEPT,
    ROLE_METRICS,
    WRONG_DRAFT_FIXED,
    Event,
    role_metrics,
)
from spanlab.jobs.rollouts import rollout_metrics
from spanlab.store import SpanStore
from spanlab.types import Rollout, Span, metric_span


def _exec(author: str, match: bool, sql: str | None = "SELECT 1") -> Event:
    return ("sql.exec", {"author": author, "round": 0 if author == "writer" else 1, "sql": sql, "ok": sql is not None,
                         "match": match})


def _check(verdict: str | None, match: bool) -> Event:
    return ("sql.check", {"round": 1, "verdict": verdict, "ok": bool(verdict and verdict.startswith("OK")),
                          "match": match})


def _final(match: bool) -> Event:
    return ("sql.final", {"sql": "SELECT 1", "author": "writer", "match": match})


CASES: list[tuple[str, list[Event], dict[str, float]]] = [
    ("right draft approved: kept", [_exec("writer", True), _check("OK", True), _final(True)],
     {DRAFT_RIGHT: 1, CHECKER_VERDICT: 1, CHECKER_ACCURACY: 1, RIGHT_DRAFT_KEPT: 1}),
    ("right draft rejected, rewritten wrong: the harmful case",
     [_exec("writer", True), _check("WRONG: no", True), _exec("rewriter", False), _final(False)],
     {DRAFT_RIGHT: 1, CHECKER_VERDICT: 1, CHECKER_ACCURACY: 0, REWRITER_FIX: 0, RIGHT_DRAFT_KEPT: 0}),
    ("wrong draft rejected, rewritten right: fixed",
     [_exec("writer", False), _check("WRONG: the filter", False), _exec("rewriter", True), _final(True)],
     {DRAFT_RIGHT: 0, CHECKER_VERDICT: 1, CHECKER_ACCURACY: 1, REWRITER_FIX: 1, WRONG_DRAFT_FIXED: 1}),
    ("wrong draft approved: no rewrite, not fixed", [_exec("writer", False), _check("**OK**", False), _final(False)],
     {DRAFT_RIGHT: 0, CHECKER_VERDICT: 1, CHECKER_ACCURACY: 0, WRONG_DRAFT_FIXED: 0}),
    ("the checker wrote SQL: no verdict; the rewriter gave no SQL",
     [_exec("writer", False), _check("```sql\nSELECT 2\n```", False), _exec("rewriter", False, sql=None),
      _final(False)],
     {DRAFT_RIGHT: 0, CHECKER_VERDICT: 0, CHECKER_ACCURACY: 0, REWRITER_FIX: 0, WRONG_DRAFT_FIXED: 0}),
    ("two rounds: rates over the replies, the outcome from the first draft to the final query",
     [_exec("writer", False), _check("WRONG: x", False), _exec("rewriter", False), _check("sure", False),
      _exec("rewriter", True), _final(True)],
     {DRAFT_RIGHT: 0, CHECKER_VERDICT: 0.5, CHECKER_ACCURACY: 0.5, REWRITER_FIX: 0.5, WRONG_DRAFT_FIXED: 1}),
    ("writer alone: no checker, no rewriter", [_exec("writer", True), _final(True)], {DRAFT_RIGHT: 1}),
    ("writer and rewriter: a draft that fails goes to the rewriter, no checker metrics",
     [_exec("writer", False, sql=None), _exec("rewriter", True), _final(True)], {DRAFT_RIGHT: 0, REWRITER_FIX: 1}),
]


@pytest.mark.parametrize(("events", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_each_case_of_a_rollout(events: list[Event], expected: dict[str, float]) -> None:
    got = role_metrics(events)
    assert got == {k: float(v) for k, v in expected.items()}
    assert set(got) <= set(ROLE_METRICS)


@pytest.mark.parametrize("events", [[], [_final(True)], [_exec("rewriter", True), _final(True)],
                                    [_exec("writer", True)], [_exec("writer", True), _final(True), _final(True)]])
def test_half_a_rollout_is_refused(events: list[Event]) -> None:
    with pytest.raises(ValueError, match="one rollout's spans"):
        role_metrics(events)


def test_metrics_read_back_from_a_store_are_the_ones_its_spans_give(store: SpanStore) -> None:
    """The spans go into a real DuckDB store and come back with their types (None, bools), and the metric
    spans recorded from them are what each rollout reads back: the numbers a held-out report averages."""
    by_case: dict[str, dict[str, float]] = {}
    for label, events, _ in CASES:
        store.enqueue([Rollout(input={"task_id": label}, mode="test")])
        got = store.dequeue(worker_id="w")
        assert got is not None
        rollout, attempt = got
        store.add_spans([Span(rollout_id=rollout.rollout_id, attempt_id=attempt.attempt_id, name=name,
                              kind="custom", attributes=dict(attrs)) for name, attrs in events])
        spans = sorted(store.iter_spans(attempt_ids=[attempt.attempt_id]), key=lambda s: s.sequence_id or 0)
        read: list[tuple[str, dict[str, Any]]] = [(s.name, s.attributes) for s in spans]
        assert read == [(name, dict(attrs)) for name, attrs in events]
        store.add_spans([metric_span(rollout.rollout_id, attempt.attempt_id, name, value)
                         for name, value in role_metrics(read).items()])
        store.finish_attempt(attempt.attempt_id, "succeeded")
        by_case[label] = rollout_metrics(store, [rollout.rollout_id])[rollout.rollout_id]
    assert by_case == {label: {k: float(v) for k, v in expected.items()} for label, _, expected in CASES}
