"""``runner:`` bad input is one line naming the setting, found by ``spanlab train --check`` before anything starts.

The store server here is real (uvicorn on 127.0.0.1, a real DuckDB file); a Ray address nobody listens at
is a free loopback port. "ray is not installed" is simulated the way Python itself reports it: with
``sys.modules['ray'] = None`` ``import ray`` raises ImportError, in a subprocess so this one keeps its Ray.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from spanlab.cli import app
from spanlab.runner.config import RolloutRunnerConfig
from spanlab.serving import ThreadedServer
from spanlab.store import SpanStore
from spanlab.store.server import create_store_app
from tests.stores import free_port

REPO = Path(__file__).resolve().parents[2]
BASE = {"algorithm": "grpo", "agent": {"name": "calc", "kwargs": {"max_tokens": 32}},
        "dataset": {"name": "calc", "levels": [1]}}
TOKEN = "s3cret"


def _config(tmp_path: Path, runner: dict) -> Path:
    path = tmp_path / "train.yaml"
    path.write_text(json.dumps({**BASE, "db": str(tmp_path / "run.duckdb"), "out_dir": str(tmp_path / "runs"),
                                "runner": runner}))
    return path


def _check(tmp_path: Path, runner: dict) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["train", str(_config(tmp_path, runner)), "--check"])
    return result.exit_code, " ".join(result.output.split())


@pytest.fixture
def store_server(tmp_path: Path) -> Iterator[str]:
    with SpanStore(tmp_path / "served.duckdb") as store, \
            ThreadedServer(create_store_app(store, token=TOKEN), name="store server") as server:
        yield server.url


def test_a_ray_address_nobody_answers_at_names_runner_address(tmp_path: Path) -> None:
    address = f"127.0.0.1:{free_port()}"
    code, output = _check(tmp_path, {"backend": "ray", "address": address})
    assert code == 2 and output.startswith("error:") and "Traceback" not in output, output
    assert f"runner.address: no Ray cluster answers at {address}" in output, output


def test_a_store_url_without_the_token_its_server_needs_names_runner_store_token(tmp_path: Path,
                                                                                 store_server: str) -> None:
    code, output = _check(tmp_path, {"backend": "ray", "store_url": store_server})
    assert code == 2 and "Traceback" not in output, output
    assert f"runner.store_token: the store server at {store_server} needs a bearer token" in output, output
    code, output = _check(tmp_path, {"backend": "ray", "store_url": store_server, "store_token": "wrong"})
    assert code == 2 and "refused runner.store_token" in output, output
    code, output = _check(tmp_path, {"backend": "ray", "store_url": store_server, "store_token": TOKEN})
    assert code == 0 and f"store_url: {store_server}" in output, output
    assert TOKEN not in output and "store_token: '**********'" in output, output  # --check prints no secret


@pytest.mark.parametrize(("runner", "message"), [
    ({"backend": "local", "address": "127.0.0.1:6379"}, "runner: Value error, address: only used with backend: ray"),
    ({"backend": "ray", "address": "head-node"}, "runner.address: Value error, 'head-node' is not a Ray address"),
    ({"backend": "ray", "store_url": "ftp://x"}, "runner.store_url: Value error, 'ftp://x' is not an http(s) URL"),
    ({"backend": "ray", "resources": {"CPU": -1}}, "runner.resources: Value error, resource amounts must be >= 0"),
    ({"backend": "ray", "workers": 0}, "runner.workers: Input should be greater than or equal to 1"),
    ({"backend": "spark"}, "runner.backend: Input should be 'local' or 'ray'"),
], ids=["address-without-ray", "address-without-port", "store-url", "resources", "workers", "backend"])
def test_malformed_runner_settings_name_the_key(tmp_path: Path, runner: dict, message: str) -> None:
    code, output = _check(tmp_path, runner)
    assert code == 2 and message in output, output


def test_without_the_ray_extra_backend_ray_fails_at_check_time_naming_the_extra(tmp_path: Path) -> None:
    probe = ("import sys; sys.modules['ray'] = None; from spanlab.cli import app; "
             "sys.argv = ['spanlab', 'train', sys.argv[1], '--check']; app()")
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    config = _config(tmp_path, {"backend": "ray"})
    out = subprocess.run([sys.executable, "-c", probe, str(config)], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=120)
    text = " ".join((out.stdout + out.stderr).split())
    assert out.returncode == 2 and "Traceback" not in text, text
    assert "backend: ray needs the `ray` package" in text and "spanlab[ray]" in text, text


def test_checking_a_ray_config_never_imports_ray(tmp_path: Path) -> None:
    """Ray costs seconds to import; only a job that starts workers imports it."""
    probe = ("import sys; from spanlab.jobs.config import load_train_config; from spanlab.jobs.job import check_job; "
             "import spanlab.jobs.rig; check_job(load_train_config(sys.argv[1])); print('ray' in sys.modules)")
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    config = _config(tmp_path, {"backend": "ray", "workers": 3})
    out = subprocess.run([sys.executable, "-c", probe, str(config)], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=120, check=True)
    assert out.stdout.split()[-1] == "False", out.stderr


def test_resources_become_ray_actor_options_and_concurrency_is_split_across_workers() -> None:
    config = RolloutRunnerConfig(backend="ray", workers=3, resources={"CPU": 0.5, "GPU": 1, "rollout_node": 1})
    assert config.actor_options() == {"num_cpus": 0.5, "num_gpus": 1, "resources": {"rollout_node": 1}}
    assert config.worker_concurrency(16) == 6  # 16 in flight over 3 workers: none gets fewer than its share
    assert RolloutRunnerConfig(backend="ray", concurrency=2).worker_concurrency(16) == 2
