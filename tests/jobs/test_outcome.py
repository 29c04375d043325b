"""A run that learns nothing says so: a WARNING per step without an update, a loud end line, exit status 3,
and ``--check`` warns when the warm start's demos miss the levels RL trains on. A step without an update pushes
nothing: the engine keeps serving the version it had.

The steps' metrics are GRPO's own (``skipped``, written by ``grpo_step``); the CLI paths run the real
``spanlab train --check`` in-process.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from spanlab.algos.grpo.step_parts import StepParts
from spanlab.cli import app
from spanlab.engine.served_folder import serve_command
from spanlab.engine.weights import WeightSyncClient
from spanlab.jobs.groups import POLICY_RESOURCE
from spanlab.jobs.outcome import (
    LEARNED_NOTHING_EXIT,
    NO_UPDATE_KEY,
    end_lines,
    learned_nothing,
    updated_steps,
    warn_if_no_update,
)
from spanlab.jobs.report import TrainReport

SKIPPED = {"reward_mean": 1.0, "n_samples": 64.0, NO_UPDATE_KEY: 1.0}
UPDATED = {"reward_mean": 0.75, "n_samples": 64.0, NO_UPDATE_KEY: 0.0, "loss": 0.1}


def _report(*steps: dict[str, float]) -> TrainReport:
    return TrainReport(run_name="r", algorithm="grpo", model="m", db="runs/x.duckdb", steps=list(steps))


def test_updated_steps_counts_what_the_metrics_say() -> None:
    assert updated_steps([SKIPPED, UPDATED, SKIPPED]) == 1
    assert updated_steps([SKIPPED, SKIPPED]) == 0
    assert updated_steps([{"loss": 0.3}]) is None  # SFT and APO steps do not say: not judged
    assert learned_nothing(_report(SKIPPED, SKIPPED))
    assert not learned_nothing(_report(SKIPPED, UPDATED))
    assert not learned_nothing(_report())  # --steps 0: an evaluation, not a failed training
    assert not learned_nothing(_report({"loss": 0.3}))


def test_a_step_without_update_is_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="spanlab.jobs.outcome"):
        warn_if_no_update(1, UPDATED)
        warn_if_no_update(2, SKIPPED)  # the second step, as the bar says "step 2/2"
    (record,) = caplog.records
    assert record.levelno == logging.WARNING and "step 2 made NO update" in record.getMessage()


def test_a_step_without_update_pushes_nothing() -> None:
    pushed: list[str] = []

    def push() -> float:
        pushed.append(f"policy-v{len(pushed) + 1}")
        return 0.5

    parts = StepParts(update=lambda ids: {}, push=push, log_step=lambda metrics: None)
    assert parts.push_if_updated(SKIPPED) == 0.0 and pushed == []
    assert parts.push_if_updated(UPDATED) == 0.5 and pushed == ["policy-v1"]
    assert parts.push_if_updated({"loss": 0.3}) == 0.5  # metrics that do not say whether it updated: pushed
    assert pushed == ["policy-v1", "policy-v2"]


def test_the_end_lines_say_learned_nothing_and_how_to_serve(tmp_path: Path) -> None:
    final = tmp_path / "final"
    final.mkdir()
    (final / "config.json").write_text("{}")
    trained = [text for _, text in end_lines(_report(SKIPPED, UPDATED), tmp_path)]
    assert f"trained model: {final} (serve it: {serve_command(final)})" in trained
    assert not any("LEARNED NOTHING" in t for t in trained)
    lines = end_lines(_report(SKIPPED, SKIPPED), tmp_path)
    assert ("bold red", next(t for _, t in lines if t.startswith("LEARNED NOTHING"))) in lines
    assert any(t.startswith("model (not changed by any step)") for _, t in lines)
    assert not any(t.startswith("trained model") for _, t in lines)
    assert LEARNED_NOTHING_EXIT not in (0, 1, 2, 130)  # not a success, a config error or an interrupt


def _check(tmp_path: Path, extra: str) -> str:
    path = tmp_path / "train.yaml"
    path.write_text("algorithm: grpo\nagent: {name: calc, kwargs: {max_tokens: 32}}\n"
                    f"db: {tmp_path}/run.duckdb\nout_dir: {tmp_path}/runs\n" + extra)
    result = CliRunner().invoke(app, ["train", str(path), "--check"])
    assert result.exit_code == 0, result.output
    return result.output


def test_check_warns_when_the_warm_start_misses_the_train_levels(tmp_path: Path,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    covered = "dataset: {name: calc, levels: [1, 2], train_levels: [2]}\nwarm_start: {demos: 64}\n"
    with caplog.at_level(logging.WARNING):
        _check(tmp_path, covered)
    assert not [r for r in caplog.records if "warm_start" in r.getMessage()]
    caplog.clear()
    with caplog.at_level(logging.INFO):  # RL on a level beyond the demos, beside demonstrated ones: a note
        _check(tmp_path, "dataset: {name: calc, levels: [1, 2, 3], train_levels: [2, 3]}\n"
                         "warm_start: {demos: 8, levels: [1, 2]}\n")
    (note,) = [r for r in caplog.records if "have no demos" in r.getMessage()]
    assert note.levelno == logging.INFO and "[3]" in note.getMessage()
    caplog.clear()
    with caplog.at_level(logging.WARNING):  # demos of none of the levels RL trains on
        _check(tmp_path, "dataset: {name: calc, levels: [1, 2], train_levels: [2]}\n"
                         "warm_start: {demos: 8, levels: [1]}\n")
    assert any("none of the train levels [2]" in r.getMessage() for r in caplog.records), caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        _check(tmp_path, "dataset: {name: calc, levels: [1]}\n")
    assert any("no warm_start" in r.getMessage() for r in caplog.records), caplog.text


@pytest.fixture
def restored_engine(vllm_server, default_model_dir: Path) -> Iterator[str]:
    """The shared engine's URL; its weights are reloaded from the model folder when the test ends (in case a
    step did push)."""
    yield vllm_server.root_url
    with WeightSyncClient(vllm_server.root_url) as client:
        client.reload_weights(default_model_dir)


@pytest.mark.vllm
@pytest.mark.slow
def test_a_run_whose_steps_all_skip_says_learned_nothing_and_exits_3(tmp_path: Path, restored_engine: str) -> None:
    """A real ``spanlab train`` whose agent scores every sample 0 (no group has reward variance)."""
    config = tmp_path / "nothing.yaml"
    config.write_text(yaml.safe_dump({
        "algorithm": "grpo", "run_name": "nothing", "out_dir": str(tmp_path / "runs"),
        "db": str(tmp_path / "nothing.duckdb"), "engine_url": restored_engine,
        "agent": {"name": "tests.jobs.marking_agent:MarkingCalcAgent",
                  "kwargs": {"marks": str(tmp_path / "marks"), "reward": "zero", "max_tokens": 16, "max_turns": 2}},
        "dataset": {"name": "calc", "seed": 3, "levels": [1]}, "eval": {"tasks": 1},
        "grpo": {"group_size": 2, "steps": 2, "tasks_per_step": 1}, "rollouts": {"concurrency": 2}}))
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(repo), os.environ.get("PYTHONPATH", "")]),
           "COLUMNS": "400"}
    out = subprocess.run([sys.executable, "-m", "spanlab.cli", "train", str(config)], cwd=repo, env=env,
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == LEARNED_NOTHING_EXIT, out.stderr[-3000:]
    assert out.stderr.count("made NO update") == 2, out.stderr[-3000:]
    # numbered as the bar numbers them (step 1/2, step 2/2), and neither pushed a new policy version
    assert "step 1 made NO update" in out.stderr and "step 2 made NO update" in out.stderr, out.stderr[-3000:]
    assert "engine serves policy-v" not in out.stderr, out.stderr[-3000:]
    assert "LEARNED NOTHING: none of the 2 grpo steps updated the weights" in out.stdout, out.stdout
    assert "trained model" not in out.stdout
    from spanlab.store import SpanStore

    with SpanStore(tmp_path / "nothing.duckdb") as store:
        assert not store.list_resources(POLICY_RESOURCE)  # no version recorded: nothing was pushed
        sync_s = [m.value for m in store.metrics() if m.name == "sync_s"]
        assert sync_s == [0.0, 0.0]
