"""Rollout workers: outcomes, retries, timeouts, resources; several processes on one store."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from spanlab.errors import ConfigError
from spanlab.runner import Worker, load_agent
from spanlab.store import SpanStore
from spanlab.types import Rollout, RolloutConfig
from tests.agents_for_tests import ResourceAgent, ScriptedAgent

REPO = Path(__file__).resolve().parents[1]


def test_outcomes_map_onto_the_retry_policy(store: SpanStore) -> None:
    cfg = RolloutConfig(max_attempts=2, timeout_s=0.5, retry_on=("failed", "timeout"))
    plans = {"ok": ["ok"], "retry": ["crash", "ok"], "dead": ["crash", "hang"], "slow": ["hang", "ok"]}
    ids = {name: store.enqueue_one({"plan": plan}, config=cfg).rollout_id for name, plan in plans.items()}
    stats = asyncio.run(Worker(store, ScriptedAgent(), concurrency=4, heartbeat_s=0.1, poll_s=0.05).run())
    assert (stats.succeeded, stats.failed, stats.timeout) == (3, 2, 2)
    status = {name: store.get_rollout(rid).status for name, rid in ids.items()}
    assert status == {"ok": "succeeded", "retry": "succeeded", "dead": "failed", "slow": "succeeded"}
    attempts = [a.status for a in store.list_attempts(ids["dead"])]
    assert attempts == ["failed", "timeout"]
    errors = store.query(
        "SELECT attributes->>'error' AS e, attributes->>'traceback' AS tb FROM spans WHERE name = 'agent_error'"
    ).to_pylist()
    assert len(errors) == 2 and all("scripted crash" in e["e"] and "Traceback" in e["tb"] for e in errors)
    rewards = store.query(
        f"SELECT name, value FROM rewards WHERE rollout_id = '{ids['ok']}' ORDER BY sequence_id"
    ).to_pylist()
    assert rewards == [{"name": "halfway", "value": 0.5}, {"name": "reward", "value": 1.0}]


def test_each_rollout_records_the_resources_it_used(store: SpanStore) -> None:
    store.add_resource("prompt", {"text": "v1"}, kind="prompt_template")
    first = store.enqueue_one({})
    asyncio.run(Worker(store, ResourceAgent(), poll_s=0.05).run())
    store.add_resource("prompt", {"text": "v2"}, kind="prompt_template")
    second = store.enqueue_one({})
    pinned = store.enqueue_one({}, resources_version="prompt@1")
    asyncio.run(Worker(store, ResourceAgent(), poll_s=0.05).run())
    summary = {r["rollout_id"]: r for r in store.query("SELECT * FROM rollout_summary").to_pylist()}
    got = {rid: (row["resources_version"], row["final_reward"]) for rid, row in summary.items()}
    assert got[first.rollout_id] == ("prompt@1", 1.0)
    assert got[second.rollout_id] == ("prompt@2", 2.0)
    assert got[pinned.rollout_id] == ("prompt@1", 1.0)


def test_bad_agent_specs_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="not registered"):
        load_agent("nope")
    with pytest.raises(ConfigError, match="cannot load agent"):
        load_agent("tests.agents_for_tests:Missing")
    with pytest.raises(ConfigError, match="bad kwargs"):
        load_agent("tests.agents_for_tests:FlakyAgent", {"colour": "red"})


def test_worker_processes_with_crashes_and_hangs_lose_nothing(tmp_path: Path) -> None:
    """4 worker processes, 10% crashes and 5% hangs per attempt (the long version: benchmarks/runner_reliability.py)."""
    db = tmp_path / "runs.duckdb"
    n = 4 * 30
    # timeout_s leaves room for a loaded 2-core machine: a healthy attempt takes ~10 ms, a hang is ended at 3 s
    cfg = RolloutConfig(max_attempts=3, timeout_s=3.0, retry_on=("failed", "timeout", "unresponsive"))
    with SpanStore(db) as store:
        store.enqueue([Rollout(input={"seed": i}, config=cfg) for i in range(n)])
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({
        "store": {"path": str(db)},
        "agent": {"name": "tests.agents_for_tests:FlakyAgent", "kwargs": {"p_crash": 0.1, "p_hang": 0.05}},
        "runner": {"workers": 4, "concurrency": 8, "heartbeat_s": 0.5, "poll_s": 0.1},
    }))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    spanlab = str(Path(sys.executable).with_name("spanlab"))
    out = subprocess.run([spanlab, "run", "--config", str(config)], capture_output=True, text=True, env=env,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    check_run_integrity(db, n, max_attempts=3)


def check_run_integrity(db: Path, n: int, max_attempts: int) -> None:
    """Every rollout ended; each attempt's spans are all there exactly once; no rollout ran twice at once."""
    with SpanStore(db) as store:
        rollouts = store.list_rollouts(limit=n + 1)
        assert len(rollouts) == n
        for r in rollouts:
            assert r.status in ("succeeded", "failed"), (r.rollout_id, r.status)
            if r.status == "failed":
                assert r.num_attempts == max_attempts
        span_ids = store.query("SELECT span_id FROM spans").column("span_id").to_pylist()
        assert len(span_ids) == len(set(span_ids)), "a span was stored twice"
        per_attempt = store.query(
            "SELECT a.attempt_id, a.status, count(s.span_id) FILTER (WHERE s.name LIKE 'step-%') AS steps, "
            "count(s.span_id) FILTER (WHERE s.kind = 'reward') AS rewards "
            "FROM attempts a LEFT JOIN spans s USING (attempt_id) GROUP BY ALL"
        ).to_pylist()
        for a in per_attempt:
            if a["status"] == "succeeded":
                assert (a["steps"], a["rewards"]) == (2, 1), a
            else:
                assert a["rewards"] == 0, a
        overlaps = store.query(
            "SELECT a.rollout_id FROM attempts a JOIN attempts b ON a.rollout_id = b.rollout_id "
            "AND a.sequence_id + 1 = b.sequence_id WHERE b.start_time < a.end_time OR a.end_time IS NULL"
        ).num_rows
        assert overlaps == 0, "a rollout had two attempts running at once"
        statuses = {r.status for r in rollouts}
        assert "succeeded" in statuses


def test_spanlab_run_workers_hand_the_gateway_token_to_their_agents_as_api_key(tmp_path: Path) -> None:
    from spanlab.config import RunConfig
    from spanlab.jobs.rollouts import final_rewards
    from spanlab.runner.pool import run_worker

    with SpanStore(tmp_path / "s.duckdb") as store:
        queued = store.enqueue([Rollout(input={"key": "gw-tok"}), Rollout(input={"key": "spanlab"})])
        config = RunConfig.model_validate({"store": {"path": str(tmp_path / "s.duckdb")},
                                           "agent": {"name": "tests.agents_for_tests:KeyAgent"},
                                           "gateway": {"url": "http://127.0.0.1:9", "token": "gw-tok"}})
        assert run_worker(config, store).succeeded == 2
        ids = [r.rollout_id for r in queued]
        assert final_rewards(store, ids) == {ids[0]: 1.0, ids[1]: 0.0}
