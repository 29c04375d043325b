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
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from spanlab.cli import app
from spanlab.runner.config import RolloutRunnerConfig
from spanlab.store import SpanStore
from spanlab.store.server import create_store_app
from spanlab.threaded_server import ThreadedServer
from tests.stores import free_port

REPO = Path(__file__).resolve().parents[2]
BASE = {"algorithm": "grpo", "agent": {"name": "calc", "kwargs": {"max_tokens": 32}},
        "dataset": {"name": "calc", "levels": [1]}}
TOKEN = "s3cret"


def _config(tmp_path: Path, runner: dict, **sections: dict) -> Path:
    path = tmp_path / "train.yaml"
    path.write_text(json.dumps({**BASE, "db": str(tmp_path / "run.duckdb"), "out_dir": str(tmp_path / "runs"),
                                "runner": runner, **sections}))
    return path


def _check(tmp_path: Path, runner: dict, **sections: dict) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["train", str(_config(tmp_path, runner, **sections)), "--check"])
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
    ({"backend": "local", "address": "127.0.0.1:6379"}, "runner: address: only used with backend: ray"),
    ({"backend": "ray", "address": "head-node"}, "runner.address: 'head-node' is not a Ray address"),
    ({"backend": "ray", "store_url": "ftp://x"}, "runner.store_url: 'ftp://x' is not an http(s) URL"),
    ({"backend": "ray", "resources": {"CPU": -1}}, "runner.resources: resource amounts must be >= 0"),
    ({"backend": "ray", "workers": 0}, "runner.workers: Input should be greater than or equal to 1"),
    ({"backend": "spark"}, "runner.backend: Input should be 'local' or 'ray'"),
], ids=["address-without-ray", "address-without-port", "store-url", "resources", "workers", "backend"])
def test_malformed_runner_settings_name_the_key(tmp_path: Path, runner: dict, message: str) -> None:
    code, output = _check(tmp_path, runner)
    assert code == 2 and message in output, output


ADVERTISED = "http://10.0.0.5:8701"


@pytest.mark.parametrize(("runner", "sections", "message"), [
    ({"backend": "ray"}, {"gateway": {"host": "0.0.0.0", "port": 8701}},
     "gateway.advertise_url: gateway.host 0.0.0.0 is where the gateway listens, not an "
     "address Ray workers can call; set gateway.advertise_url"),
    ({"backend": "ray", "store_server": {"host": "0.0.0.0", "port": 8702}}, {},
     "runner: store_server.advertise_url: store_server.host 0.0.0.0 is where the job's store server "
     "listens, not an address Ray workers can call"),
    ({"backend": "ray"}, {"gateway": {"host": "0.0.0.0", "advertise_url": ADVERTISED}},
     "gateway: port: 0 picks a free port at start, which advertise_url cannot name; set port"),
    ({"backend": "ray"}, {"gateway": {"host": "0.0.0.0", "port": 8701, "advertise_url": "http://0.0.0.0:8701"}},
     "gateway.advertise_url: advertise_url 'http://0.0.0.0:8701' names 0.0.0.0, which no worker can call"),
    ({"backend": "ray"}, {"gateway": {"host": "http://10.0.0.5"}},
     "gateway.host: 'http://10.0.0.5' is not a host to bind"),
    ({"backend": "ray"}, {"gateway": {"port": 70000}}, "gateway.port: Input should be less than or equal to 65535"),
    ({"backend": "ray"}, {"gateway": {"token": " "}}, "gateway.token: token is empty"),
    ({"backend": "local", "store_server": {"host": "127.0.0.1"}}, {},
     "runner: store_server: only used with backend: ray"),
    ({"backend": "ray", "store_url": "http://10.0.0.9:8700", "store_server": {"host": "127.0.0.1"}}, {},
     "runner: store_server: only used without store_url"),
], ids=["gateway-wildcard", "store-wildcard", "advertised-random-port", "advertised-wildcard", "host-url", "port",
        "empty-token", "store-server-without-ray", "store-server-and-url"])
def test_gateway_and_store_server_listen_settings_name_the_key(tmp_path: Path, runner: dict, sections: dict,
                                                               message: str) -> None:
    code, output = _check(tmp_path, runner, **sections)
    assert code == 2 and "Traceback" not in output and message in output, output


def test_a_wildcard_bind_with_an_advertised_url_passes_the_check_and_masks_the_token(tmp_path: Path) -> None:
    listen = {"host": "0.0.0.0", "port": 8701, "advertise_url": ADVERTISED + "/"}
    code, output = _check(tmp_path, {"backend": "ray", "store_server": {**listen, "port": 8702}},
                          gateway={**listen, "token": TOKEN})
    assert code == 0, output
    assert f"advertise_url: {ADVERTISED} " in output and TOKEN not in output, output  # trailing / dropped
    code, output = _check(tmp_path, {"backend": "local"}, gateway={"host": "0.0.0.0"})
    assert code == 0, output  # in-process agents call it on loopback: nothing to advertise


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


def test_a_gateway_off_loopback_always_has_a_token_and_a_taken_port_names_the_key(tmp_path: Path) -> None:
    """127.0.0.2 is loopback to the kernel but not one of the names spanlab treats as loopback, so it stands in
    for a real address here without listening beyond this machine."""
    from contextlib import ExitStack

    from spanlab.errors import ConfigError
    from spanlab.jobs.rig_backends import open_gateway
    from spanlab.runner.config import GatewayListenConfig

    with SpanStore(tmp_path / "spans.duckdb") as store, ExitStack() as stack:
        _, url, token = open_gateway(stack, GatewayListenConfig(host="127.0.0.2"), store, ["http://127.0.0.1:9"])
        assert url.startswith("http://127.0.0.2:") and token is not None and len(token) >= 32
        assert httpx.get(f"{url}/health", timeout=30).status_code == 401
        assert httpx.get(f"{url}/health", headers={"Authorization": f"Bearer {token}"}, timeout=30).status_code == 200
        port = int(url.rsplit(":", 1)[1])
        with pytest.raises(ConfigError, match=rf"^gateway: cannot listen on 127\.0\.0\.2:{port}: "):
            open_gateway(stack, GatewayListenConfig(host="127.0.0.2", port=port), store, ["http://127.0.0.1:9"])
        _, url, token = open_gateway(stack, GatewayListenConfig(), store, ["http://127.0.0.1:9"])
        assert url.startswith("http://127.0.0.1:") and token is None  # loopback: as before, no token
        assert httpx.get(f"{url}/health", timeout=30).status_code == 200


def test_a_wildcard_bind_is_called_on_loopback_here_and_at_its_advertised_url_elsewhere() -> None:
    from types import SimpleNamespace

    from spanlab.threaded_server import ListenConfig

    server: Any = SimpleNamespace(port=8701)
    assert ListenConfig(host="0.0.0.0").url(server) == "http://127.0.0.1:8701"
    assert ListenConfig(host="10.0.0.5").url(server) == "http://10.0.0.5:8701"
    assert ListenConfig(host="0.0.0.0", port=8701, advertise_url="https://gw.example.org/").url(server) == \
        "https://gw.example.org"
