"""tutorials/calc/compare_runs.py on hand-made stores: the extra-operation share from the runs' own
``calc.extra_ops`` metric spans, and from the recorded calculator calls of a store written before that metric."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

from spanlab.store import SpanStore
from spanlab.types import LLMCall, Rollout, Span, metric_span, reward_span
from tests.scripts import load_script

SCRIPT = Path(__file__).resolve().parents[2] / "tutorials" / "calc" / "compare_runs.py"


def _script() -> ModuleType:
    return load_script(SCRIPT, "compare_runs")


def _call(rid: str, aid: str, expression: str) -> Span:
    message = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "calculator",
                                                      "arguments": json.dumps({"expression": expression})}}]}
    return Span(rollout_id=rid, attempt_id=aid, name="chat", kind="llm_call",
                llm=LLMCall(model="m", response_message=message, prompt_token_ids=[1], response_token_ids=[2]))


def _store(path: Path, answers: list[str], *, metric: bool) -> Path:
    """Held-out rollouts of phase ``final`` on split ``test``: one-operation tasks (5 * 7) answered by ``answers``."""
    with SpanStore(path) as store:
        for i, expression in enumerate(answers):
            store.enqueue([Rollout(input={"task_id": f"t{i}", "level": 2, "expression": "5 * 7", "answer": 35},
                                   mode="test", metadata={"phase": "final", "split": "test"})])
            got = store.dequeue(worker_id="w")
            assert got is not None
            rid, aid = got[0].rollout_id, got[1].attempt_id
            spans = [_call(rid, aid, expression), reward_span(rid, aid, float(expression == "5 * 7"))]
            if metric:
                spans.append(metric_span(rid, aid, "calc.extra_ops", float(expression != "5 * 7")))
            store.add_spans(spans)
            store.finish_attempt(aid, "succeeded")
    return path


def test_the_extra_operation_share_from_metric_spans_and_from_recorded_calls(tmp_path: Path) -> None:
    script = _script()
    answers = ["5 * 7", "5 * 7 + 5 * 7", "5 * 7", "-5 * -7"]  # one appended operation; a sign is no operation
    with SpanStore(_store(tmp_path / "old.duckdb", answers, metric=False)) as store:
        assert script.extra_ops_share(store, "final") == {"test": 0.25}
    with SpanStore(_store(tmp_path / "new.duckdb", ["5 * 7 + 5 * 7"] * 2 + ["5 * 7"] * 2, metric=True)) as store:
        assert script.extra_ops_share(store, "final") == {"test": 0.5}
        assert script.extra_ops_share(store, "warm_start") == {}
