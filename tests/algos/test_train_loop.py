"""End-to-end smoke test of the whole loop on CPU: runner -> gateway -> vLLM -> store -> adapter -> GRPO -> weight sync.

Tiny sizes (2 eval tasks, 4 demos, one GRPO step of 2 tasks x 2 samples) so it runs in a couple of
minutes on the session's shared vLLM server; the server's original weights are restored afterwards. The GRPO
step on a DuckDB file stays in the default run (``pytest -q``) as its smoke test of the whole loop; the other job
runs are ``slow`` (their parts are tested in tests/algos and tests/jobs; tests/README.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from spanlab.engine.weights import WeightSyncClient
from spanlab.errors import ConfigError
from spanlab.jobs.config import parse_train_config
from spanlab.jobs.job import run_job as train
from spanlab.store import SpanStore

pytestmark = pytest.mark.vllm


@pytest.fixture
def restored_engine(vllm_server, default_model_dir: Path) -> Iterator[str]:
    """The shared engine's URL; its weights are reloaded from the model folder when the test ends."""
    yield vllm_server.root_url
    with WeightSyncClient(vllm_server.root_url) as client:
        client.reload_weights(default_model_dir)


@pytest.fixture(params=["duckdb", pytest.param("http", marks=pytest.mark.slow)])
def stop_served_store(request: pytest.FixtureRequest, tmp_path: Path,
                      monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[], None]]:
    """``http``: the loop's store is a ``StoreClient`` to a ``spanlab store serve`` process on the run's file
    (what ``open_rig`` opens); the test calls the function it gets to stop the server before reading the file."""
    if request.param == "duckdb":
        yield lambda: None
        return
    from tests.stores import ServerProcess

    server = ServerProcess(tmp_path / "run.duckdb").start()
    monkeypatch.setattr("spanlab.store.SpanStore", lambda path: server.client())
    yield server.stop
    server.stop()


def test_one_grpo_step_runs_the_whole_data_path(tmp_path: Path, restored_engine: str,
                                               stop_served_store: Callable[[], None]) -> None:
    db = tmp_path / "run.duckdb"
    config = parse_train_config({
        "algorithm": "grpo", "run_name": "smoke", "out_dir": str(tmp_path / "runs"), "db": str(db),
        "engine_url": restored_engine,
        "agent": {"name": "calc", "kwargs": {"max_tokens": 32, "max_turns": 2}},
        "dataset": {"name": "calc", "seed": 1, "levels": [1]},
        "eval": {"tasks": 2},
        "warm_start": {"demos": 4, "batch_size": 2},
        "grpo": {"group_size": 2, "lr": 1e-6, "steps": 1, "tasks_per_step": 2,
                 "replay": {"coef": 1.0, "levels": [1]}},  # its level read from the store's rollouts; its rows, if any
        "rollouts": {"concurrency": 4},
    })
    report = train(config)

    assert [e.phase for e in report.evaluations] == ["base", "warm_start", "final"]
    assert all(e.n == 2 and 0.0 <= e.accuracy <= 1.0 for e in report.evaluations)
    assert report.warm_start is not None and report.warm_start["sft_steps"] == 2
    (step,) = report.steps
    assert step["n_samples"] >= 4  # 2 tasks x 2 samples, at least one session each
    assert 0 <= step["replay_groups_solved"] <= 2, step  # grpo.replay reached the update
    if not step.get("skipped"):  # one TITO session per rollout: one row per replayed group
        assert step["replay_rows"] == step["replay_groups"] == step["replay_groups_solved"], step
    assert (tmp_path / "runs" / "smoke" / "report.json").is_file()
    stop_served_store()
    with SpanStore(db) as store:
        # The weights were pushed after the warm start, and after the GRPO step only if it updated them (a step
        # whose groups each got one reward changes nothing and pushes nothing); the step's rollouts ran on version 1.
        pushes = [1] if step.get("skipped") else [1, 2]
        assert [r.version for r in store.list_resources("policy")] == pushes, step
        assert (step["sync_s"] == 0.0) == bool(step.get("skipped")), step
        versions = store.query(
            "SELECT DISTINCT resources_version AS v FROM rollouts WHERE mode = 'train'"
        ).column("v").to_pylist()
        assert versions == ["policy@1"]
        # ... and each of their calls names the engine and the weights version it served (docs/replicas.md).
        served = store.query(
            "SELECT DISTINCT s.attributes->>'replica' AS replica, s.attributes->>'policy_version' AS version "
            "FROM spans s JOIN rollouts USING (rollout_id) WHERE mode = 'train' AND kind = 'llm_call'"
        ).to_pylist()
        assert served == [{"replica": restored_engine, "version": "policy-v1"}]
        assert store.list_resources("policy")[0].payload["replicas"] == {restored_engine: "policy-v1"}
        names = set(store.query("SELECT DISTINCT name FROM train_metrics").column("name").to_pylist())
        assert {"reward_mean", "n_samples", "sync_s", "eval_accuracy_base", "eval_accuracy_final"} <= names
        # The GRPO samples were the recorded TITO sessions (exact token IDs) of the train rollouts: one each.
        (sessions,) = store.query(
            "SELECT count(*) AS n FROM tito_sessions JOIN rollouts USING (rollout_id) WHERE mode = 'train'"
        ).column("n").to_pylist()
        assert sessions == step["n_samples"]


@pytest.mark.slow
def test_the_curve_splits_are_evaluated_every_few_steps(tmp_path: Path, restored_engine: str) -> None:
    """``eval.curve``: the named split is evaluated at the start, after every ``every`` steps and at the end (one
    ``curve_<split>`` series in train_metrics, what the plot and the UI draw); the other split only at the ends."""
    db = tmp_path / "run.duckdb"
    config = parse_train_config({
        "algorithm": "grpo", "run_name": "curve", "out_dir": str(tmp_path / "runs"), "db": str(db),
        "engine_url": restored_engine, "checkpoints": {"final": False},
        "agent": {"name": "calc", "kwargs": {"max_tokens": 16, "max_turns": 1}},
        "dataset": {"name": "calc", "seed": 1, "levels": [1, 2]},
        "eval": {"tasks": 1, "levels": [1], "extra_splits": [{"name": "l2", "split": "test", "levels": [2]}],
                 "curve": {"splits": ["l2"], "every": 1}},
        "grpo": {"group_size": 2, "lr": 1e-6, "steps": 2, "tasks_per_step": 1},
        "rollouts": {"concurrency": 2},
    })
    report = train(config)
    assert [(e.phase, e.split) for e in report.evaluations] == [
        ("base", "test"), ("base", "l2"), ("step-1", "l2"), ("final", "test"), ("final", "l2")]
    with SpanStore(db) as store:
        curve = [(m.step, m.value) for m in store.metrics(report.run_id) if m.name == "curve_l2"]
        by_phase = {e.phase: e.accuracy for e in report.evaluations if e.split == "l2"}
        assert curve == [(0, by_phase["base"]), (1, by_phase["step-1"]), (2, by_phase["final"])]
    assert (tmp_path / "runs" / "curve" / "reward.png").read_bytes()[:4] == b"\x89PNG"  # the run's plot
    assert [r["l2"] for r in report.curve()] == [by_phase["base"], by_phase["step-1"], by_phase["final"]]


@pytest.mark.slow
def test_an_async_grpo_run_trains_within_its_bound_and_ends_with_nothing_leased(tmp_path: Path,
                                                                                 restored_engine: str) -> None:
    """``loop: {mode: async}`` through the whole job: calc agent, gateway, full reloads paused with ``mode=wait``."""
    db = tmp_path / "run.duckdb"
    config = parse_train_config({
        "algorithm": "grpo", "run_name": "async", "out_dir": str(tmp_path / "runs"), "db": str(db),
        "engine_url": restored_engine,
        "agent": {"name": "calc", "kwargs": {"max_tokens": 16, "max_turns": 1}},
        "dataset": {"name": "calc", "seed": 1, "levels": [1]},
        "eval": {"tasks": 1},
        "grpo": {"group_size": 2, "lr": 1e-6, "steps": 2, "tasks_per_step": 1},
        "rollouts": {"concurrency": 2},
        "loop": {"mode": "async", "max_staleness": 1},
        "checkpoints": {"final": False, "resume_state": False},
    })
    report = train(config)
    assert len(report.steps) == 2
    assert all(m["staleness_max"] <= 1 and m["staleness_0"] + m["staleness_1"] == 2 for m in report.steps)
    with SpanStore(db) as store:
        updates = sum(not m.get("skipped") for m in report.steps)
        assert [r.version for r in store.list_resources("policy")] == list(range(1, updates + 1))  # a push per update
        assert store.count_rollouts(("queuing", "requeuing", "preparing", "running")) == 0
        names = {m.name: m.value for m in store.metrics()}
        assert {"end_cancelled_queued", "end_cancelled_running", "end_unused_finished"} <= set(names)
        assert names["end_cancelled_queued"] + names["end_cancelled_running"] + names["end_unused_finished"] == 2 * 2
        # Every call kept to the agent's 16 tokens: so each push's drain is short (an uncapped call on the TITO
        # engine path once ran to max_model_len, and the drain outlasted the pause's HTTP timeout).
        (longest,) = store.query("SELECT max(len(response_token_ids)) AS n FROM spans WHERE kind = 'llm_call'"
                                 ).column("n").to_pylist()
        assert longest <= 16
    # A step updates only when a group's rewards differ (the untrained model often scores all 0 or all 1):
    # those that did report how far the sampling policy was from the trainer's.
    assert all("mismatch_kl" in m for m in report.steps if not m.get("skipped"))


@pytest.mark.slow
def test_one_sft_round_trains_on_the_filtered_exact_ids(tmp_path: Path, restored_engine: str) -> None:
    """collect -> filter -> train -> serve once, on the plain torch trainer (the CI path)."""
    from spanlab.adapters.filtered_dataset import read_dataset

    db = tmp_path / "run.duckdb"
    config = parse_train_config({
        "algorithm": "sft", "run_name": "sft-smoke", "out_dir": str(tmp_path / "runs"), "db": str(db),
        "engine_url": restored_engine,
        "agent": {"name": "calc", "kwargs": {"max_tokens": 32, "max_turns": 2}},
        "dataset": {"name": "calc", "seed": 2, "levels": [1]},
        "eval": {"tasks": 2},
        "warm_start": {"demos": 3, "batch_size": 2, "lr": 1e-6},
        "sft": {"rounds": 1, "tasks_per_round": 2, "samples_per_task": 2, "backend": "torch", "replay": 2,
                "filter": {"rule": "best_of_n", "n": 1, "min_reward": 0.0, "dedupe": False},
                "train": {"lr": 1e-6, "epochs": 1, "batch_size": 2}},
        "rollouts": {"concurrency": 4},
    })
    report = train(config)

    assert [e.phase for e in report.evaluations] == ["base", "warm_start", "final"]
    (round0,) = report.steps
    table = read_dataset(tmp_path / "runs" / "sft-smoke" / "round-0.parquet")
    assert table.num_rows == round0["filter_kept"] == 2  # best of 2 per task, floor 0: one session per task
    # Trained on the kept sessions plus 2 of the warm start's 3 demonstrations, replayed (not in the Parquet).
    assert round0["replay_examples"] == 2 and round0["sft_examples"] == 4
    # The final policy is compared with the warm start on the same 2 held-out tasks, task by task.
    assert all(len(e.rewards) == e.n == 2 for e in report.evaluations)
    (gain,) = report.paired_gains()
    assert gain.start == "warm_start" and gain.n == 2
    with SpanStore(db) as store:
        assert [r.version for r in store.list_resources("policy")] == [1, 2]  # the warm start, then round 0
        # Each kept example is a recorded TITO session of a train rollout, token for token.
        sessions = {tuple(r["span_ids"]): r for r in store.query(
            "SELECT span_ids, token_ids, loss_mask FROM tito_sessions JOIN rollouts USING (rollout_id) "
            "WHERE mode = 'train'").to_pylist()}
        for row in table.to_pylist():
            session = sessions[tuple(row["span_ids"])]
            assert row["input_ids"] == session["token_ids"]
            assert row["labels"] == [t if m else -100 for t, m in zip(session["token_ids"], session["loss_mask"],
                                                                       strict=True)]
        names = set(store.query("SELECT DISTINCT name FROM train_metrics WHERE algorithm = 'sft'")
                    .column("name").to_pylist())
        assert {"reward_mean", "filter_kept", "sft_loss_first", "sync_s", "eval_accuracy_final"} <= names


@pytest.mark.slow
def test_an_unsloth_round_serves_its_merged_weights(tmp_path: Path, restored_engine: str) -> None:
    """The Unsloth trainer (LoRA, in a child process) inside the loop: its merged folder is what vLLM reloads."""
    from spanlab.algos.sft.unsloth import unsloth_available

    if not unsloth_available():
        pytest.skip("unsloth is not installed or does not import here (scripts/setup.sh installs it on CPU)")
    db = tmp_path / "run.duckdb"
    config = parse_train_config({
        "algorithm": "sft", "run_name": "unsloth", "out_dir": str(tmp_path / "runs"), "db": str(db),
        "engine_url": restored_engine,
        "agent": {"name": "calc", "kwargs": {"max_tokens": 32, "max_turns": 2}},
        "dataset": {"name": "calc", "seed": 3, "levels": [1]},
        "eval": {"tasks": 1},
        "sft": {"rounds": 1, "tasks_per_round": 2, "samples_per_task": 1, "backend": "unsloth",
                "lora": {"rank": 4, "alpha": 8},
                "filter": {"rule": "threshold", "min_reward": 0.0, "dedupe": False},
                "train": {"lr": 1e-5, "epochs": 1, "batch_size": 2}},
        "rollouts": {"concurrency": 2},
    })
    report = train(config)
    (round0,) = report.steps
    assert round0["filter_kept"] == 2 and round0["steps"] == 1 and round0["loss_first"] > 0
    merged = tmp_path / "runs" / "unsloth" / "round-0"
    assert any(merged.glob("*.safetensors"))
    with SpanStore(db) as store:
        (policy,) = store.list_resources("policy")
        assert policy.payload["path"] == str(merged) and policy.payload["method"] == "full_reload"


def test_bad_train_config_names_the_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"grpo\.steps"):
        parse_train_config({"grpo": {"steps": -1}})
    with pytest.raises(ConfigError, match=r"algorithm.*unknown algorithm 'ppo'"):
        parse_train_config({"algorithm": "ppo"})
    with pytest.raises(ConfigError, match=r"grpo\.cliplow"):
        parse_train_config({"grpo": {"cliplow": 0.1}})
