"""Starting several engines, and the bad inputs around them: each a one-line error naming the setting.

A replica that never becomes ready is a real process that never answers ``/health``: the ``python`` given to
the servers runs spanlab's guard as usual but, in place of vLLM, a small HTTP server that answers like one
(``/health``, ``/v1/models``), except on the port chosen to stay silent. No vLLM starts here; the test with
real replicas is tests/engine/test_replicas_vllm.py.
"""

from __future__ import annotations

import socket
import stat
import sys
import textwrap
from contextlib import ExitStack
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

from spanlab.engine.config import EngineConfig
from spanlab.engine.replicas import EngineReplicas, ReplicaStartError
from spanlab.errors import ConfigError
from spanlab.jobs.config import TrainConfig
from spanlab.jobs.rig import engines
from spanlab.threaded_server import ThreadedServer

FAKE_ENGINE = textwrap.dedent("""
    import http.server, os, sys, time
    port = int(sys.argv[sys.argv.index("--port") + 1])
    open(os.path.join(os.environ["FAKE_PID_DIR"], str(os.getpid())), "w").close()
    if port == int(os.environ["FAKE_SILENT_PORT"]):
        time.sleep(3600)  # alive, never ready
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = b'{"object": "list", "data": [{"id": "m"}]}'
            self.send_response(200); self.send_header("content-length", str(len(body))); self.end_headers()
            self.wfile.write(body)
        def log_message(self, *a): pass
    http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
""")


def _two_free_ports() -> int:
    for _ in range(50):
        with socket.socket() as a, socket.socket() as b:
            a.bind(("127.0.0.1", 0))
            port = a.getsockname()[1]
            try:
                b.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
            return port
    raise RuntimeError("no two consecutive free ports")


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def test_a_replica_that_never_becomes_ready_is_one_line_and_every_replica_is_stopped(tmp_path: Path) -> None:
    (tmp_path / "engine.py").write_text(FAKE_ENGINE)
    python = tmp_path / "python"  # the guard runs as always; "-m vllm..." runs the stand-in instead
    python.write_text(f'#!/bin/sh\nif [ "$1" = "-I" ]; then exec {sys.executable} "$@"; fi\n'
                      f'exec {sys.executable} {tmp_path / "engine.py"} "$@"\n')
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    pids = tmp_path / "pids"
    pids.mkdir()
    port = _two_free_ports()
    config = EngineConfig(model=str(tmp_path), replicas=2, port=port, startup_timeout_s=4, stop_grace_s=1,
                          log_path=tmp_path / "vllm.log",
                          extra_env={"FAKE_PID_DIR": str(pids), "FAKE_SILENT_PORT": str(port + 1)})
    with pytest.raises(ReplicaStartError) as err:
        EngineReplicas(config, python=str(python)).start()
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"engine.replicas: replica 2 of 2 (port {port + 1}) did not become ready")
    assert str(tmp_path / "vllm-1.log") in message and "all 2 stopped" in message
    started = [int(p.name) for p in pids.iterdir()]
    assert len(started) == 2  # both stand-ins ran (one became ready), and neither is left
    assert [pid for pid in started if _alive(pid)] == []


def test_replica_configs_take_consecutive_ports_and_their_own_logs(tmp_path: Path) -> None:
    config = EngineConfig(replicas=3, port=9000, log_path=tmp_path / "v.log")
    assert [(c.port, c.log_path, c.replicas) for c in map(config.replica, range(3))] == [
        (9000, tmp_path / "v-0.log", 1), (9001, tmp_path / "v-1.log", 1), (9002, tmp_path / "v-2.log", 1)]
    assert EngineConfig(replicas=2).replica(1).port is None
    with pytest.raises(ValueError, match="replicas"):
        EngineConfig(replicas=2, port=65535)


def test_running_engines_and_replicas_to_start_are_checked_together() -> None:
    with pytest.raises(ValueError, match=r"engine\.replicas: 2 engines to start, but engine_urls"):
        TrainConfig(engine={"replicas": 2}, engine_urls=["http://127.0.0.1:8000"])
    with pytest.raises(ValueError, match="engine_url and engine_urls"):
        TrainConfig(engine_url="http://127.0.0.1:8000", engine_urls=["http://127.0.0.1:8001"])
    with pytest.raises(ValueError, match="twice"):
        TrainConfig(engine_urls=["http://127.0.0.1:8000/v1", "http://127.0.0.1:8000"])
    with pytest.raises(ValueError, match="not an http"):
        TrainConfig(engine_urls=["127.0.0.1:8000"])
    assert TrainConfig(engine_urls=["http://127.0.0.1:8000/v1"]).engine_urls == ("http://127.0.0.1:8000",)


def _models_app(name: str) -> Starlette:
    async def models(request: object) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [{"id": name, "object": "model"}]})
    return Starlette(routes=[Route("/v1/models", models)])


def test_engine_urls_with_an_unreachable_or_different_engine_is_one_line_naming_it() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    with ThreadedServer(_models_app("m"), name="engine-a") as a, ThreadedServer(_models_app("x"), name="b") as b:
        with ExitStack() as stack, pytest.raises(ConfigError) as err:
            engines(stack, TrainConfig(engine_urls=[a.url, closed]))
        assert str(err.value).startswith(f"engine_urls: no vLLM answers at {closed}/v1/models")
        assert "\n" not in str(err.value)
        with ExitStack() as stack, pytest.raises(ConfigError, match="engine_urls: the engines serve different"):
            engines(stack, TrainConfig(engine_urls=[a.url, b.url]))
        with ExitStack() as stack:
            assert engines(stack, TrainConfig(engine_urls=[a.url + "/v1"])) == ([a.url], "m")
