"""``benchmarks/seeded_runs.py`` tells a repeated run from a different one, rollout by rollout.

Two real DuckDB stores written as a run writes them (rollouts with a step, task and sample in their metadata,
their calls' spans, final rewards, train metrics); the run IDs and rollout IDs differ, as in two real runs.
"""

from __future__ import annotations

import uuid
from pathlib import Path

from spanlab.store import SpanStore
from spanlab.types import reward_span
from tests.conftest import llm_span
from tests.scripts import load_script

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "seeded_runs.py"


def _run(db: Path, samples: list[int], rewards: list[float], loss: float) -> None:
    """One step of two rollouts (task "a", samples 0 and 1); rollout k's one call samples IDs from ``samples[k]``."""
    with SpanStore(db) as store:
        run_id = uuid.uuid4().hex
        for k in range(2):
            store.enqueue_one({"q": "a"}, metadata={"run_id": run_id, "step": 0, "group_id": "a", "sample": k})
            rollout, attempt = store.dequeue(worker_id="w")
            spans = [llm_span(rollout, attempt, seed=samples[k]),
                     reward_span(rollout.rollout_id, attempt.attempt_id, rewards[k], final=True)]
            store.finish_attempt(attempt.attempt_id, "succeeded", spans)
        store.add_metrics(run_id, "grpo", 0, {"loss": loss, "reward_mean": sum(rewards) / 2, "step_seconds": 3.0})


def test_a_repeated_run_is_the_same_and_another_is_not(tmp_path: Path) -> None:
    script = load_script(SCRIPT, "seeded_runs")
    _run(tmp_path / "a.duckdb", [1, 2], [1.0, 0.0], 0.5)
    _run(tmp_path / "b.duckdb", [1, 2], [1.0, 0.0], 0.5)
    _run(tmp_path / "c.duckdb", [1, 3], [1.0, 1.0], 0.25)
    first = script.read_run(tmp_path / "a.duckdb")
    same = script.compare(first, script.read_run(tmp_path / "b.duckdb"))
    other = script.compare(first, script.read_run(tmp_path / "c.duckdb"))
    assert same["same_tokens_by_mode"] == {"train": {"same": 2, "of": 2}} and same["same_final_reward"] == 2
    assert (same["train_metrics"], same["train_metrics_equal"], same["largest_relative_gap"]) == (2, 2, 0.0)
    assert other["same_tokens_by_mode"] == {"train": {"same": 1, "of": 2}} and other["same_final_reward"] == 1
    assert other["train_metrics_equal"] == 0 and other["largest_relative_gap"] == 0.5  # the loss, step_seconds aside
    assert other["reward_mean_per_step"] == [[0.5, 1.0]]
