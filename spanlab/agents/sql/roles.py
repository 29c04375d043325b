"""What each role of one SQL rollout did, as metrics (``ctx.add_metric``): measurements, never rewards.

The final reward says whether the team got the answer; it does not say whether the checker judged, whether
its verdict was right, or whether the rewriter fixed anything. These metrics do, so an evaluation can tell a
checker that never gives a verdict (issue 45's tie) from one that judges well but cannot change the outcome.
They are metric spans, not rewards, so no algorithm ever trains on them (:func:`spanlab.types.metric_span`).

:func:`role_metrics` reads them off the custom spans the agent recorded in one attempt, in order: the
``sql.exec`` spans (each writer or rewriter answer, with ``author`` and ``match``: whether its result is the
gold result), the ``sql.check`` spans (``verdict``: the checker's reply, ``match``: the judged query's) and the
``sql.final`` span (``match``: the outcome). The agent calls it on what it recorded; the tests call it on
spans read back from a store, so the metrics are what the spans say.

A metric is recorded only by the rollouts it is about (the held-out report averages each over the rollouts that
recorded it, :func:`spanlab.jobs.report.metric_means`), so each mean is a rate over its own denominator:

- ``sql.draft_right`` (every rollout): the writer's draft matched the gold result.
- ``sql.checker_verdict`` (the checker spoke): share of its replies that are a verdict (begin with OK or WRONG).
- ``sql.checker_accuracy`` (the checker spoke): share of its replies that judged the query as it is: OK to a
  query that matches the gold result, WRONG to one that does not (the ``sql.verdict`` reward's rule).
- ``sql.rewriter_fix`` (a rewrite was asked for): share of the rewrites whose result matched the gold result.
- ``sql.right_draft_kept`` (the checker spoke, the draft was right): the outcome stayed right; ``1 -`` it is the
  harmful case, a right draft rewritten into a wrong one.
- ``sql.wrong_draft_fixed`` (the checker spoke, the draft was wrong): the outcome became right.

The last two are how often checking changed the outcome. A draft that fails to run is sent to the rewriter
whatever the verdict says, so a fixed draft is not always the verdict's doing; a draft that runs is rewritten
only when the verdict is not OK.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from spanlab.agents.sql.prompts import verdict_given, verdict_right

DRAFT_RIGHT = "sql.draft_right"
CHECKER_VERDICT = "sql.checker_verdict"
CHECKER_ACCURACY = "sql.checker_accuracy"
REWRITER_FIX = "sql.rewriter_fix"
RIGHT_DRAFT_KEPT = "sql.right_draft_kept"
WRONG_DRAFT_FIXED = "sql.wrong_draft_fixed"
ROLE_METRICS = (DRAFT_RIGHT, CHECKER_VERDICT, CHECKER_ACCURACY, REWRITER_FIX, RIGHT_DRAFT_KEPT, WRONG_DRAFT_FIXED)

Event = tuple[str, Mapping[str, Any]]  # (span name, attributes) of one custom span the agent recorded


def _mean(flags: Sequence[bool]) -> float:
    return sum(flags) / len(flags)


def role_metrics(events: Sequence[Event]) -> dict[str, float]:
    """The metrics of one attempt (module docstring) from its ``sql.*`` spans in recorded order.

    Raises ValueError when the spans are not one finished rollout (no writer draft or no ``sql.final``): a
    metric made up from half a rollout would be a wrong figure, not a missing one."""
    execs = [attrs for name, attrs in events if name == "sql.exec"]
    checks = [attrs for name, attrs in events if name == "sql.check"]
    finals = [attrs for name, attrs in events if name == "sql.final"]
    if not execs or execs[0].get("author") != "writer" or len(finals) != 1:
        raise ValueError("role metrics need one rollout's spans: a writer's sql.exec first and one sql.final")
    draft, final = bool(execs[0]["match"]), bool(finals[0]["match"])
    metrics = {DRAFT_RIGHT: float(draft)}
    if checks:
        metrics[CHECKER_VERDICT] = _mean([verdict_given(c["verdict"]) for c in checks])
        metrics[CHECKER_ACCURACY] = _mean([verdict_right(c["verdict"], bool(c["match"])) for c in checks])
        metrics[RIGHT_DRAFT_KEPT if draft else WRONG_DRAFT_FIXED] = float(final)
    rewrites = [bool(e["match"]) for e in execs if e.get("author") == "rewriter"]
    if rewrites:
        metrics[REWRITER_FIX] = _mean(rewrites)
    return metrics
