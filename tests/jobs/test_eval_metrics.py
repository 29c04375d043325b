"""Agent metrics (``ctx.add_metric``): recorded as spans that are not rewards, read back per rollout, and reported
per held-out split and phase (report.json, the printed table, ``train_metrics``).

The evaluation runs the job's own ``_evaluate`` with a real ``RolloutCollector``, ``Worker`` and DuckDB store; the
agent (``tests.agents_for_tests:MetricAgent``) calls no model, so no engine is needed.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from rich.console import Console

from spanlab.jobs.config import parse_train_config
from spanlab.jobs.job import Job
from spanlab.jobs.report import Evaluation, TrainReport, metric_means
from spanlab.jobs.rollouts import RolloutCollector, rollout_metrics
from spanlab.jobs.tracking import Trackers
from spanlab.progress import PhaseProgress
from spanlab.runner.agent import RolloutContext
from spanlab.store import SpanStore, StoreAPI
from spanlab.types import RolloutConfig, metric_span


def _context(store: StoreAPI, max_attempts: int = 1) -> RolloutContext:
    store.enqueue_one({"q": 1}, config=RolloutConfig(max_attempts=max_attempts))
    got = store.dequeue(worker_id="w")
    assert got is not None
    return RolloutContext(rollout=got[0], attempt=got[1], store=store)


def test_a_metric_is_read_back_from_the_last_attempt_and_is_never_a_reward(any_store: StoreAPI) -> None:
    ctx = _context(any_store, max_attempts=2)
    ctx.add_metric("calc.extra_ops", 1.0)  # the first attempt's: it fails, so its metric is not the rollout's
    any_store.finish_attempt(ctx.attempt.attempt_id, "failed")
    rollout, attempt = any_store.dequeue(worker_id="w") or (None, None)
    assert rollout is not None and attempt is not None and attempt.sequence_id == 2
    again = RolloutContext(rollout=rollout, attempt=attempt, store=any_store)
    again.add_metric("calc.extra_ops", 1.0)
    again.add_metric("calc.extra_ops", 0.0)  # recorded twice: the later value counts
    again.add_metric("steps", 3)
    again.add_span("note", metric="not a number")  # a custom span whose `metric` is no number: not a metric
    any_store.finish_attempt(attempt.attempt_id, "succeeded", [])

    assert rollout_metrics(any_store, [rollout.rollout_id, "ro-unknown"]) == {
        rollout.rollout_id: {"calc.extra_ops": 0.0, "steps": 3.0}}
    assert rollout_metrics(any_store, []) == {}
    (summary,) = any_store.rollout_summaries([rollout.rollout_id])
    assert summary.final_reward is None and summary.total_reward is None  # no reward span was written


@pytest.mark.parametrize(("name", "value", "error"), [
    ("accuracy", 1.0, "not 'accuracy'"),
    ("a/b", 1.0, "use a letter"),
    ("", 1.0, "use a letter"),
    ("ok", float("nan"), "finite number"),
    ("ok", "1", "finite number"),
])
def test_bad_metrics_are_refused_before_anything_is_stored(store: SpanStore, name: str, value: object,
                                                           error: str) -> None:
    ctx = _context(store)
    with pytest.raises(ValueError, match=error):
        ctx.add_metric(name, value)  # type: ignore[arg-type]
    assert rollout_metrics(store, [ctx.rollout.rollout_id]) == {}
    assert metric_span("r", "a", "calc.extra_ops", True).attributes == {"metric": 1.0}


def test_means_count_only_the_rollouts_that_recorded_the_metric() -> None:
    means = metric_means([{"x": 1.0, "y": 2.0}, {"x": 0.0}, {}, {"x": 0.0}])
    assert {k: (m.mean, m.n) for k, m in means.items()} == {"x": (1 / 3, 3), "y": (2.0, 1)}
    assert metric_means([]) == {}


def _job(store: SpanStore, tmp_path: Path) -> Job:
    config = parse_train_config({"algorithm": "grpo", "dataset": {"name": "calc"},
                                 "db": str(tmp_path / "r.duckdb"), "out_dir": str(tmp_path / "runs")})
    collector = RolloutCollector(store, "http://127.0.0.1:9/v1", "tests.agents_for_tests:MetricAgent", {},
                                 concurrency=4)
    job = Job.__new__(Job)  # _evaluate reads the config, the rig's store and collector, the report and trackers
    job.config, job.evaluator, job.tracker = config, None, Trackers([])
    job.rig = SimpleNamespace(store=store, collector=collector, served="m")  # type: ignore[assignment]
    job.policy, job.report = None, TrainReport(run_name="r", algorithm="grpo", model="m", db="d")
    job.progress = PhaseProgress(Console(file=io.StringIO()), live=False)
    return job


def _tasks(extra: list[float | None], reward: float = 1.0) -> list[dict]:
    return [{"task_id": f"t{i}", "level": 1, "reward": reward,
             "metrics": {} if e is None else {"calc.extra_ops": e}} for i, e in enumerate(extra)]


def test_each_split_reports_its_metrics_at_the_start_and_the_end(file_store: SpanStore, tmp_path: Path) -> None:
    job = _job(file_store, tmp_path)
    job._evaluate("warm_start", "test", _tasks([0.0, 0.0, 0.0, None]))
    job._evaluate("warm_start", "family", _tasks([0.0, 1.0]))
    job._evaluate("step-2", "family", _tasks([1.0, 1.0]))  # a curve point: in the report, not in the table
    job._evaluate("final", "test", _tasks([1.0, 0.0, None, None], reward=0.0))
    job._evaluate("final", "family", _tasks([None, None]))  # no rollout recorded it: no value, not a zero

    by = {(ev.phase, ev.split): ev for ev in job.report.evaluations}
    assert by["warm_start", "test"].metrics["calc.extra_ops"].model_dump() == {"mean": 0.0, "n": 3}
    assert by["final", "test"].metrics["calc.extra_ops"].model_dump() == {"mean": 0.5, "n": 2}
    assert by["final", "test"].accuracy == 0.0 and by["final", "family"].metrics == {}

    # train_metrics: the accuracy's naming (the headline split has no suffix), no key for curve points
    recorded = {m.name: m.value for m in file_store.metrics(job.report.run_id)}
    assert {k: v for k, v in recorded.items() if "extra_ops" in k} == {
        "eval_calc.extra_ops_warm_start": 0.0, "eval_calc.extra_ops_warm_start_family": 0.5,
        "eval_calc.extra_ops_final": 0.5}

    table = job.report.metrics_table()
    assert table is not None and [c.header for c in table.columns] == ["split", "metric", "warm_start", "final"]
    assert [list(c.cells) for c in table.columns] == [["test", "family"], ["calc.extra_ops"] * 2,
                                                      ["0.000 (3)", "0.500 (2)"], ["0.500 (2)", ""]]
    assert job.report.summary()["metrics_by_split"] == {"calc.extra_ops": {
        "test": {"warm_start": 0.0, "final": 0.5}, "family": {"warm_start": 0.5, "step-2": 1.0}}}

    job.report.write(tmp_path / "report.json")
    again = TrainReport.model_validate(json.loads((tmp_path / "report.json").read_text()))
    assert again.evaluations == job.report.evaluations


def test_a_report_without_metrics_prints_no_metrics_table() -> None:
    old = {"phase": "base", "split": "test", "n": 2, "accuracy": 0.5}  # a report.json from before metrics
    report = TrainReport(run_name="r", algorithm="sft", model="m", db="d",
                         evaluations=[Evaluation.model_validate(old)])
    assert report.metrics_table() is None and report.summary()["metrics_by_split"] == {}
