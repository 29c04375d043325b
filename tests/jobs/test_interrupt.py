"""Ctrl-C during the held-out evaluation stops ``spanlab train`` within seconds: exit 130, no process left.

A real ``spanlab train --steps 0`` in a subprocess (the calc agent, its MCP calculator servers, the
gateway, the store; with ``own engine`` also its own vLLM, the case where a ``VLLM::EngineCore`` was
once orphaned) gets SIGINT once its evaluation rollouts run; every process it had started must be gone
soon after it exits, and the store must open and hold no rollout still waiting in the queue.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from spanlab.store import SpanStore

pytestmark = pytest.mark.vllm  # not slow: the only check of Ctrl-C in a run

REPO = Path(__file__).resolve().parents[2]


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _wait_for_evaluation(proc: subprocess.Popen[str], timeout: float) -> list[psutil.Process]:
    """The run's processes once an evaluation rollout's MCP calculator server runs (rollouts are in flight)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, "spanlab train exited before its evaluation"
        kids = _descendants(proc.pid)
        if any("spanlab.agents.calc.mcp_server" in " ".join(k.cmdline()) for k in kids if _alive(k)):
            return kids
        time.sleep(0.5)
    pytest.fail("no evaluation rollout started in time")


@pytest.mark.parametrize("own_engine", [False, True], ids=["engine_url", "own engine"])
def test_ctrl_c_during_evaluation_exits_130_and_leaves_nothing(tmp_path: Path, vllm_server: Any,
                                                                own_engine: bool) -> None:
    db = tmp_path / "run.duckdb"
    config = {"algorithm": "grpo", "run_name": "interrupted", "out_dir": str(tmp_path / "runs"), "db": str(db),
              "agent": {"name": "calc", "kwargs": {"max_tokens": 64, "max_turns": 3}},
              "dataset": {"name": "calc", "levels": [1, 2, 3]}, "eval": {"tasks": 60},
              "rollouts": {"concurrency": 4}}
    if own_engine:
        config["engine"] = {"max_model_len": 2048}
    else:
        config["engine_url"] = vllm_server.root_url
    path = tmp_path / "train.yaml"
    path.write_text(json.dumps(config))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-m", "spanlab.cli", "train", str(path), "--steps", "0"], cwd=REPO,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        started = _wait_for_evaluation(proc, timeout=300 if own_engine else 120)
        time.sleep(3)  # well inside the evaluation: 60 tasks take minutes
        started += [k for k in _descendants(proc.pid) if k not in started]
        names = " ".join(" ".join(k.cmdline()) for k in started if _alive(k))
        assert not own_engine or "VLLM::EngineCore" in names
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err[-3000:]
    assert took < 20, f"took {took:.1f}s to stop:\n{err[-3000:]}"
    assert "Traceback" not in err and "interrupted" in err
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and any(_alive(p) for p in started):
        time.sleep(0.5)
    left = [(p.pid, " ".join(p.cmdline())[:80]) for p in started if _alive(p)]
    assert left == []
    with SpanStore(db) as store:
        assert store.list_rollouts(status="queuing", limit=10) == []
        assert store.list_rollouts(mode="test", limit=1000)  # the evaluation had started
