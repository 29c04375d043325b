"""Issue 22's bad inputs through a real ``spanlab train`` run (not ``--check``): each is one line naming the setting,
and the store the run was pointed at holds exactly what it held before.

The store already holds a finished run (a rollout, its attempt, its spans), as a user's store would. Ray,
the store server, the trainer's device check and the replicas are real; the replica that never becomes ready
is a real process that never answers ``/health`` (tests/engine/test_replicas.py's stand-in), so no vLLM starts.
"""

from __future__ import annotations

import json
import stat
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from spanlab.cli import app
from spanlab.store import SpanStore
from spanlab.store.server import create_store_app
from spanlab.threaded_server import ThreadedServer
from spanlab.types import Span, reward_span
from tests.engine.test_replicas import FAKE_ENGINE, _two_free_ports
from tests.stores import free_port

BASE = {"algorithm": "grpo", "agent": {"name": "calc", "kwargs": {"max_tokens": 32}},
        "dataset": {"name": "calc", "levels": [1]}, "eval": {"tasks": 2}, "grpo": {"steps": 1}}
TABLES = ("rollouts", "attempts", "spans")


def _fill(store: SpanStore) -> dict[str, list[dict[str, Any]]]:
    """A finished rollout with two spans; every row of the tables a run could touch."""
    store.enqueue_one({"question": "1+1"})
    rollout, attempt = store.dequeue(worker_id="earlier-run")  # type: ignore[misc]
    store.add_spans([Span(rollout_id=rollout.rollout_id, attempt_id=attempt.attempt_id, name="step", kind="custom")])
    store.finish_attempt(attempt.attempt_id, "succeeded", [reward_span(rollout.rollout_id, attempt.attempt_id, 1.0)])
    return _rows(store)


def _rows(store: SpanStore) -> dict[str, list[dict[str, Any]]]:
    return {t: store.query(f"SELECT * FROM {t} ORDER BY 1").to_pylist() for t in TABLES}


def _train(tmp_path: Path, **sections: Any) -> tuple[int, str]:
    path = tmp_path / "train.yaml"
    path.write_text(json.dumps({**BASE, "db": str(tmp_path / "run.duckdb"), "out_dir": str(tmp_path / "runs"),
                                **sections}))
    result = CliRunner().invoke(app, ["train", str(path)])
    return result.exit_code, result.output


@pytest.fixture
def filled(tmp_path: Path) -> Iterator[dict[str, list[dict[str, Any]]]]:
    with SpanStore(tmp_path / "run.duckdb") as store:
        yield _fill(store)


def _one_line(output: str, starts: str) -> None:
    """The output ends in the one error (after progress lines, if any; the console wraps it at its width)."""
    text = " ".join(output.split())
    assert "Traceback" not in output and text.count("error: ") == 1, output
    assert text.split("error: ")[1].startswith(starts), output


@pytest.mark.parametrize(("sections", "starts"), [
    ({"runner": {"backend": "ray", "address": "127.0.0.1:{port}"}},
     "runner.address: no Ray cluster answers at 127.0.0.1:"),
    ({"trainer": {"processes": 1024}}, "trainer.processes: 1024 processes but this machine has"),
], ids=["unreachable-ray-address", "processes-beyond-devices"])
def test_a_bad_setting_fails_the_run_in_one_line_and_the_store_file_is_as_it_was(
        tmp_path: Path, filled: dict[str, list[dict[str, Any]]], sections: dict, starts: str) -> None:
    sections = json.loads(json.dumps(sections).replace("{port}", str(free_port())))
    code, output = _train(tmp_path, **sections)
    assert code == 2, output
    _one_line(output, starts)
    with SpanStore(tmp_path / "run.duckdb") as store:
        assert _rows(store) == filled


def test_a_store_url_without_its_token_fails_the_run_and_the_served_store_is_as_it_was(tmp_path: Path) -> None:
    with SpanStore(tmp_path / "served.duckdb") as store, \
            ThreadedServer(create_store_app(store, token="s3cret"), name="store server") as server:
        before = _fill(store)
        code, output = _train(tmp_path, runner={"backend": "ray", "store_url": server.url})
        assert code == 2, output
        _one_line(output, f"runner.store_token: the store server at {server.url} needs a bearer token")
        assert _rows(store) == before


def test_a_replica_that_never_becomes_ready_fails_the_run_and_the_store_file_is_as_it_was(
        tmp_path: Path, filled: dict[str, list[dict[str, Any]]], monkeypatch: pytest.MonkeyPatch) -> None:
    """Fails after the rig opened the store (cancelling leftovers, which this store has none of)."""
    (tmp_path / "engine.py").write_text(FAKE_ENGINE)
    python = tmp_path / "python"  # spanlab's guard runs as always; "-m vllm..." runs the stand-in instead
    python.write_text(f'#!/bin/sh\nif [ "$1" = "-I" ]; then exec {sys.executable} "$@"; fi\n'
                      f'exec {sys.executable} {tmp_path / "engine.py"} "$@"\n')
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    (tmp_path / "pids").mkdir()
    (tmp_path / "config.json").write_text("{}")  # the stand-in loads nothing, but --check wants a model folder
    (tmp_path / "model.safetensors").write_bytes(b"")
    port = _two_free_ports()
    monkeypatch.setattr(sys, "executable", str(python))  # what the engine servers start; read when they are built
    code, output = _train(tmp_path, engine={
        "model": str(tmp_path), "replicas": 2, "port": port, "startup_timeout_s": 4, "stop_grace_s": 1,
        "log_path": str(tmp_path / "vllm.log"),
        "extra_env": {"FAKE_PID_DIR": str(tmp_path / "pids"), "FAKE_SILENT_PORT": str(port + 1)}})
    monkeypatch.undo()
    assert code == 2, output
    _one_line(output, f"engine.replicas: replica 2 of 2 (port {port + 1}) did not become ready")
    with SpanStore(tmp_path / "run.duckdb") as store:
        assert _rows(store) == filled
