"""``spanlab train --resume`` after a SIGKILL during step 2 of 3 ends where an uninterrupted run ends.

A real ``spanlab train`` subprocess (GRPO, the calc agent through the gateway, the session's vLLM) is
killed with SIGKILL, process group and all, while step 2's rollouts run (told by the marking agent's
file: base evaluation 1 rollout + 2 per step). ``spanlab train --resume`` then continues it. The store
must then hold what an uninterrupted run of the config holds (each fact below is exact, so no reference
run is needed): 3 steps, policy versions 1..3, two live training rollouts per step sampled on one policy
version (a different one each step), each step's metrics once, no (step, task, sample) twice; the
interrupted step's finished rollout is reused, the one the kill left running is cancelled; the optimizer
has taken 3 steps (its moments were restored, not restarted: a restart would count 2). TensorBoard (the
run's tracker) holds each step's reward once. Smallest honest size: 1 task x 2 samples per step, 1
held-out task, 16 new tokens per call, a rank-4 LoRA policy; the reward is the sample's parity (see
``marking_agent``), so each step is a real update.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from spanlab.engine.weights import WeightSyncClient
from spanlab.store import SpanStore

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
STEPS, GROUP = 3, 2


@pytest.fixture
def restored_engine(vllm_server: Any, default_model_dir: Path) -> Iterator[str]:
    yield vllm_server.root_url
    with WeightSyncClient(vllm_server.root_url) as client:
        client.reload_weights(default_model_dir)


def _config(tmp_path: Path, name: str, engine_url: str) -> dict[str, Any]:
    return {"algorithm": "grpo", "run_name": name, "out_dir": str(tmp_path / "runs"),
            "db": str(tmp_path / f"{name}.duckdb"), "engine_url": engine_url,
            "agent": {"name": "tests.jobs.marking_agent:MarkingCalcAgent",
                      "kwargs": {"marks": str(tmp_path / f"{name}.marks"), "reward": "sample_parity",
                                 "max_tokens": 16, "max_turns": 2}},
            "dataset": {"name": "calc", "seed": 3, "levels": [1]}, "eval": {"tasks": 1},
            "grpo": {"group_size": GROUP, "lr": 1e-4, "steps": STEPS, "tasks_per_step": 1,
                     "lora": {"rank": 4, "alpha": 8}},  # an adapter: a small state per step, a quick reload
            "rollouts": {"concurrency": 1}, "tracking": {"tensorboard": {"dir": str(tmp_path / "tb")}}}


def _train(path: Path, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen([sys.executable, "-m", "spanlab.cli", "train", str(path), *args], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def _marks(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def _kill_during_step_2(proc: subprocess.Popen[str], marks: Path, timeout: float) -> None:
    """SIGKILL the run (its whole process group) once step 2's first rollout is scored."""
    deadline = time.monotonic() + timeout
    while _marks(marks) < 1 + GROUP + 1:
        assert proc.poll() is None, f"spanlab train exited early:\n{proc.stderr.read()[-3000:] if proc.stderr else ''}"
        assert time.monotonic() < deadline, "the run did not reach step 2 in time"
        time.sleep(0.2)
    time.sleep(0.5)  # its reward commits; the next rollout of the step is in flight
    kids = psutil.Process(proc.pid).children(recursive=True)
    os.killpg(proc.pid, signal.SIGKILL)
    for kid in kids:
        with contextlib.suppress(psutil.NoSuchProcess):
            kid.kill()
    proc.wait(timeout=30)


def _optimizer_steps(run_dir: Path) -> int:
    """AdamW's step count in the run's saved state (the same for every parameter)."""
    import torch

    optimizer = torch.load(run_dir / "resume" / "tensors.pt", weights_only=True)["optimizer"]
    return int(optimizer["state"][0]["step"])


def _store_facts(db: Path, run_name: str) -> dict[str, Any]:
    with SpanStore(db) as store:
        rows = store.query("SELECT metadata->>'step' AS step, metadata->>'group_id' AS g, metadata->>'sample' AS k, "
                           "status, resources_version AS v FROM rollouts WHERE mode = 'train' "
                           "ORDER BY enqueue_time").to_pylist()
        live = [r for r in rows if r["status"] != "cancelled"]
        metrics = Counter((m.step, m.name) for m in store.metrics() if m.algorithm == "grpo")
        checkpoints = [r.payload for r in store.list_resources("checkpoint")]
        return {
            "per_step": Counter(int(r["step"]) for r in live),
            "versions_per_step": sorted({(int(r["step"]), r["v"]) for r in live}),
            "duplicates": [k for k, n in Counter((r["step"], r["g"], r["k"]) for r in live).items() if n > 1],
            "cancelled": len(rows) - len(live),
            "policy_versions": [r.version for r in store.list_resources("policy")],
            "metric_counts": set(metrics.values()),
            "metric_steps": sorted({s for s, n in metrics if n.startswith("reward_mean")}),
            "reward_mean": {m.step: m.value for m in store.metrics() if m.name == "reward_mean"},
            "test_phases": Counter(r["p"] for r in store.query(
                "SELECT metadata->>'phase' AS p FROM rollouts WHERE mode = 'test' AND status != 'cancelled'"
            ).to_pylist()),
            "final_tags": [c["tag"] for c in checkpoints if c["run_name"] == run_name],
        }


def test_resume_after_sigkill_in_step_2_matches_an_uninterrupted_run(tmp_path: Path, restored_engine: str) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    path = tmp_path / "killed.yaml"
    path.write_text(json.dumps(_config(tmp_path, "killed", restored_engine)))
    proc = _train(path)
    try:
        _kill_during_step_2(proc, tmp_path / "killed.marks", timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    state = json.loads((tmp_path / "runs" / "killed" / "resume" / "state.json").read_text())
    assert state["completed_steps"] == 1 and state["policy_version"] == 1
    assert _optimizer_steps(tmp_path / "runs" / "killed") == 1

    resumed = _train(path, "--resume")
    out, err = resumed.communicate(timeout=900)
    assert resumed.returncode == 0, err[-3000:]
    assert "reused 1 finished rollouts" in err and "trained model: " in out

    got = _store_facts(tmp_path / "killed.duckdb", "killed")
    assert got["per_step"] == dict.fromkeys(range(STEPS), GROUP)
    assert [step for step, _ in got["versions_per_step"]] == list(range(STEPS))  # one policy per step...
    assert len({v for _, v in got["versions_per_step"]}) == STEPS  # ...and a new one each step
    assert got["policy_versions"] == list(range(1, STEPS + 1))
    assert got["duplicates"] == []
    assert got["cancelled"] == 1  # the rollout in flight at the kill, never trained on
    assert got["metric_counts"] == {1}
    assert got["metric_steps"] == list(range(STEPS))
    assert got["test_phases"] == {"base": 1, "final": 1}
    assert got["final_tags"] == ["final"]
    assert got["reward_mean"] == dict.fromkeys(range(STEPS), 0.5)
    assert _optimizer_steps(tmp_path / "runs" / "killed") == STEPS
    report = json.loads((tmp_path / "runs" / "killed" / "report.json").read_text())
    assert len(report["steps"]) == STEPS and [e["phase"] for e in report["evaluations"]] == ["base", "final"]

    events = EventAccumulator(str(tmp_path / "tb" / "killed"))
    events.Reload()
    tb = {e.step: e.value for e in events.Scalars("reward_mean")}
    assert [e.step for e in events.Scalars("reward_mean")] == list(range(STEPS))
    assert tb == pytest.approx(got["reward_mean"])
