"""The extra-operation share of a held-out evaluation: how often an answer's calculator expression used more
operations than the problem needs (``8 * 39 + 39`` for 8 * 39).

A recipe can keep a split's accuracy and still teach this habit, which shows first on wordings it never saw, so
every comparison prints the share beside the gains. It is read from the runs' own ``calc.extra_ops`` metric
spans, or, in a store recorded before that metric, from the same rule applied to the recorded calls'
calculator arguments. Stores of other agents record neither and get no share.
"""

from __future__ import annotations

from collections.abc import Sequence

from spanlab.store import StoreAPI


def extra_ops_share(store: StoreAPI, phase: str, splits: Sequence[str]) -> dict[str, float]:
    """split -> share of the held-out rollouts of ``phase`` whose answer has an extra operation (splits where
    nothing recorded it are absent)."""
    from spanlab.agents.calc.operations import EXTRA_OPS_METRIC  # the calc agent's and the gateway's imports: only
    from spanlab.jobs.rollouts import rollout_metrics  # when a comparison runs, not when the package is imported

    shares: dict[str, float] = {}
    for split in splits:
        rows = [r for r in store.rollout_summaries(metadata={"phase": phase, "split": split}) if r.mode == "test"]
        if not rows:
            continue
        recorded = rollout_metrics(store, [r.rollout_id for r in rows])
        values = [recorded[r.rollout_id][EXTRA_OPS_METRIC] for r in rows
                  if EXTRA_OPS_METRIC in recorded.get(r.rollout_id, {})]
        if not recorded:  # only calc's tasks name the expression an answer is measured against
            values = [v for r in rows if isinstance(r.input, dict) and r.input.get("expression") is not None
                      and (v := _from_calls(store, r.rollout_id, r.input)) is not None]
        if values:
            shares[split] = sum(values) / len(values)
    return shares


def _from_calls(store: StoreAPI, rollout_id: str, task: dict) -> float | None:
    from spanlab.agents.calc.operations import call_expression, extra_operations

    expressions = []
    for span in store.iter_spans(rollout_ids=[rollout_id], kinds=["llm_call"]):
        message = (span.llm.response_message if span.llm else None) or {}
        for call in message.get("tool_calls") or []:
            expression = call_expression((call.get("function") or {}).get("arguments"))
            if expression is not None:
                expressions.append(expression)
    return extra_operations(expressions, task)
