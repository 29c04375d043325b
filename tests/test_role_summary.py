"""The ``role_summary`` view on hand-made spans: calls and rewards per role, policy and step of a run, last attempts
only; through both stores' ``query`` and through ``spanlab sql`` on the DuckDB file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from spanlab.store import SpanStore, StoreAPI
from spanlab.types import RolloutConfig, reward_span
from tests.conftest import llm_span, scripted_spans

SPANLAB = str(Path(sys.executable).with_name("spanlab"))
COLUMNS = ("run_id", "step", "mode", "role", "policy", "rollouts", "llm_calls", "response_tokens",
           "final_reward_mean", "final_rewards", "intermediate_rewards", "intermediate_reward_sum",
           "intermediate_reward_mean", "policy_versions")


def _rollout(store: StoreAPI, step: int, steps: list[tuple[str, Any]], *, mode: str = "train",
             fail_first: bool = False) -> None:
    """One rollout of run R at ``step``: ``("call", role)`` / ``("call", (role, policy))``, ``("reward", v)``,
    ``("tied", v)`` (to the last call), ``("final", v)``. ``fail_first``: a first attempt with a writer call and a
    final reward 9.0 fails before the recorded one (the view must read the last attempt only)."""
    store.enqueue_one({"task_id": "t"}, mode=mode, metadata={"run_id": "R", "step": step},  # type: ignore[arg-type]
                      config=RolloutConfig(max_attempts=2))
    got = store.dequeue(worker_id="w")
    assert got is not None
    if fail_first:
        store.add_spans([llm_span(*got, seed=99, attributes={"agent": "writer"}),
                         reward_span(got[0].rollout_id, got[1].attempt_id, 9.0)])
        store.finish_attempt(got[1].attempt_id, "failed")
        got = store.dequeue(worker_id="w")
        assert got is not None
    spans, _ = scripted_spans(*got, steps, n_resp=3)
    store.add_spans(spans)
    store.finish_attempt(got[1].attempt_id, "succeeded")


def _fill(store: StoreAPI) -> None:
    _rollout(store, 0, [("call", "writer"), ("reward", 0.2), ("call", ("checker", "lora-b", "lora-b-v2")),
                        ("reward", 0.5), ("call", "rewriter"), ("tied", 1.0), ("call", "rewriter"),
                        ("final", 1.0)], fail_first=True)
    _rollout(store, 0, [("call", "writer"), ("reward", 0.0), ("call", ("checker", "lora-b", "lora-b-v1")),
                        ("call", ("checker", "lora-b", "lora-b-v2")), ("final", 0.0)])
    _rollout(store, 1, [("call", "writer"), ("final", 1.0)])
    _rollout(store, 1, [("call", None), ("call", None), ("final", 0.5)])  # a single-agent rollout
    _rollout(store, 1, [("call", "writer"), ("final", 0.0)], mode="val")


def _rows(table: Any) -> dict[tuple, dict[str, Any]]:
    rows = table.to_pylist()
    assert tuple(rows[0]) == COLUMNS
    return {(r["step"], r["mode"], r["role"]): r for r in rows}


def _check(rows: dict[tuple, dict[str, Any]]) -> None:
    assert set(rows) == {(0, "train", "writer"), (0, "train", "checker"), (0, "train", "rewriter"),
                         (1, "train", "writer"), (1, "train", None), (1, "val", "writer")}
    writer = rows[(0, "train", "writer")]
    assert (writer["run_id"], writer["policy"], writer["rollouts"], writer["llm_calls"]) == ("R", None, 2, 2)
    assert writer["response_tokens"] == 6 and writer["final_reward_mean"] == pytest.approx(0.5)  # not the 9.0
    assert (writer["intermediate_rewards"], writer["intermediate_reward_sum"]) == (2, pytest.approx(0.2))
    assert writer["intermediate_reward_mean"] == pytest.approx(0.1)
    checker = rows[(0, "train", "checker")]
    assert (checker["policy"], checker["rollouts"], checker["intermediate_rewards"]) == ("lora-b", 2, 1)
    assert checker["policy_versions"] == ["lora-b-v1", "lora-b-v2"] and writer["policy_versions"] == []
    assert checker["intermediate_reward_sum"] == pytest.approx(0.5)  # the second checker's turn earned none
    rewriter = rows[(0, "train", "rewriter")]
    assert (rewriter["rollouts"], rewriter["llm_calls"], rewriter["final_rewards"]) == (1, 2, 1)
    assert (rewriter["intermediate_rewards"], rewriter["intermediate_reward_sum"]) == (1, pytest.approx(1.0))
    single = rows[(1, "train", None)]
    assert (single["llm_calls"], single["final_reward_mean"], single["intermediate_rewards"]) == (2, 0.5, 0)
    assert single["intermediate_reward_mean"] is None
    assert rows[(1, "val", "writer")]["final_reward_mean"] == 0.0


def test_role_summary_gives_calls_and_rewards_per_role_and_step(any_store: StoreAPI) -> None:
    _fill(any_store)
    _check(_rows(any_store.query("SELECT * FROM role_summary")))


def test_spanlab_sql_reads_role_summary_from_a_store_file(tmp_path: Path) -> None:
    db = tmp_path / "runs.duckdb"
    with SpanStore(db) as store:
        _fill(store)
    out = subprocess.run([SPANLAB, "sql", "SELECT * FROM role_summary", "--db", str(db), "--format", "json"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert len(rows) == 6 and tuple(rows[0]) == COLUMNS
    _check({(r["step"], r["mode"], r["role"]): r for r in rows})
