"""tutorials/calc/compare_runs.py on hand-made stores: the extra-operation share from the runs' own
``calc.extra_ops`` metric spans, and from the recorded calculator calls of a store written before that metric."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

from spanlab.store import SpanStore
from spanlab.types import LLMCall, Rollout, Span, metric_span, reward_span
from tests.jobs.run_stores import record
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


def test_the_script_prints_spanlab_compare_s_tables_then_the_levels(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    start, run = tmp_path / "ws.duckdb", tmp_path / "rl.duckdb"
    record(start, {"t0": 0.0, "t1": 1.0, "t2": 0.0, "t3": 1.0}, phase="warm_start", split="test")
    record(run, {"t0": 1.0, "t1": 1.0, "t2": 1.0, "t3": 1.0}, phase="final", split="test", seed=0)
    monkeypatch.setattr(sys, "argv", ["compare_runs.py", "--start", str(start), str(run), "--splits", "test"])
    _script().main()
    out = capsys.readouterr().out.splitlines()
    assert "## test: 4 questions" in out and "- arm **rl**: 1 seed (0); interval over questions only (rl)" in out
    assert any(line.startswith("| rl | rl | 0 | 50.0% | 100.0% | +50.0 [") for line in out)
    assert any(line.startswith("Verdict on test: rl vs start: ") for line in out)
    assert any(line.startswith("  levels 1-3 pooled (test + family, n=4): 50.0% -> 100.0%, paired +50.0 [")
               for line in out)
