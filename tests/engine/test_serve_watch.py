"""``spanlab serve`` notices its engine's death (issue 65, item 7): it stops, non-zero, with one line that gives the
engine's exit status and the end of its log, or with ``--restart-engine`` starts it again on the same port.

``spanlab serve`` runs as a process, as a user runs it. Its engine is a stand-in: a small HTTP server started by
the same command, guard and readiness check as vLLM (``engine.extra_env`` puts a ``vllm.entrypoints.openai.
api_server`` module of its own first on the engine's path), which answers ``/health`` and ``/v1/models`` and exits
when asked to, so that a death is seconds, not a vLLM start. A real vLLM's engine core killed with SIGKILL is
tests/engine/test_lifecycle.py's ``test_dead_engine_is_detected_and_restarted``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
SPANLAB = str(Path(sys.executable).with_name("spanlab"))

STANDIN = '''"""A stand-in for vLLM's API server: /health, /v1/models (with its pid), /exit?code=N (exits with N)."""
import argparse, json, os
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

parser = argparse.ArgumentParser()
parser.add_argument("--host", default="127.0.0.1")
parser.add_argument("--port", type=int)
parser.add_argument("--served-model-name")
args, _ = parser.parse_known_args()


class Handler(BaseHTTPRequestHandler):
    def answer(self, body):
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        self.wfile.flush()

    def do_GET(self):
        url = urlsplit(self.path)
        if url.path == "/exit":
            code = int(parse_qs(url.query)["code"][0])
            print(f"stand-in engine: exiting with code {code}", flush=True)
            self.answer({})
            os._exit(code)
        if url.path == "/v1/models":
            self.answer({"object": "list", "pid": os.getpid(),
                         "data": [{"id": args.served_model_name, "object": "model", "max_model_len": 512}]})
        else:
            self.answer({})

    def log_message(self, *a):
        pass


print(f"stand-in engine: serving on port {args.port}", flush=True)
ThreadingHTTPServer((args.host, args.port), Handler).serve_forever()
'''


@dataclass
class Served:
    proc: subprocess.Popen[str]
    engine_url: str
    base_url: str
    stderr: Path

    def errors(self) -> str:
        return self.stderr.read_text()


@pytest.fixture
def standin(tmp_path: Path) -> Path:
    """A folder whose ``vllm`` package is the stand-in (only the engine's environment gets it on its path)."""
    pkg = tmp_path / "standin" / "vllm" / "entrypoints" / "openai"
    pkg.mkdir(parents=True)
    for folder in (pkg, pkg.parent, pkg.parent.parent):
        (folder / "__init__.py").write_text("")
    (pkg / "api_server.py").write_text(STANDIN)
    return tmp_path / "standin"


def _serve(tmp_path: Path, standin: Path, *flags: str) -> Iterator[Served]:
    config = {"db": str(tmp_path / "spans.duckdb"), "gateway": {"port": 0},
              "engine": {"model": "standin/engine", "device": "cpu", "log_path": str(tmp_path / "engine.log"),
                         "startup_timeout_s": 60, "stop_grace_s": 2, "extra_env": {"PYTHONPATH": str(standin)}}}
    (tmp_path / "serve.yaml").write_text(yaml.safe_dump(config))
    stderr = tmp_path / "stderr.txt"
    with stderr.open("w") as err:  # COLUMNS: the one-line error is not wrapped at 80 columns
        proc = subprocess.Popen([SPANLAB, "serve", "--config", str(tmp_path / "serve.yaml"), *flags], cwd=tmp_path,
                                env={**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "2000"},
                                stdout=subprocess.PIPE, stderr=err, text=True)
    try:
        printed: dict[str, str] = {}
        assert proc.stdout is not None
        for line in proc.stdout:
            key, _, value = line.partition(":")
            printed[key.strip()] = value.strip()
            if line.startswith("Ctrl-C"):
                break
        assert "engine" in printed and "base URL" in printed, f"{printed}\n{stderr.read_text()}"
        yield Served(proc, printed["engine"], printed["base URL"], stderr)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def test_serve_stops_non_zero_with_one_line_when_its_engine_dies(tmp_path: Path, standin: Path) -> None:
    for served in _serve(tmp_path, standin):
        assert httpx.get(f"{served.base_url}/models", timeout=30).status_code == 200  # the gateway reaches it
        port = served.engine_url.rsplit(":", 1)[1]
        httpx.get(f"{served.engine_url}/exit", params={"code": 3}, timeout=30)
        assert served.proc.wait(timeout=60) == 2
        errors = served.errors()
        (line,) = [line for line in errors.splitlines() if line.startswith("error:")]
        assert f"vLLM on port {port} died: its API server exited with code 3; log {tmp_path / 'engine.log'}" in line
        assert line.endswith("| stand-in engine: exiting with code 3 | [spanlab guard] command exited with code 3 "
                             "(--restart-engine restarts a dead engine)"), line
        assert "Traceback" not in errors and "LOST" not in errors
        with pytest.raises(httpx.TransportError):  # everything stopped: the gateway no longer answers
            httpx.get(f"{served.base_url}/models", timeout=5)


def test_serve_restarts_a_dead_engine_on_its_port_when_asked(tmp_path: Path, standin: Path) -> None:
    for served in _serve(tmp_path, standin, "--restart-engine"):
        first = httpx.get(f"{served.engine_url}/v1/models", timeout=30).json()["pid"]
        os.kill(first, signal.SIGKILL)
        deadline = time.monotonic() + 60
        again = None
        while time.monotonic() < deadline:
            try:
                again = httpx.get(f"{served.engine_url}/v1/models", timeout=5).json()["pid"]
                if again != first:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        assert again is not None and again != first, served.errors()
        resp = httpx.get(f"{served.base_url}/models", timeout=30)  # the gateway's URL to it still works
        assert resp.status_code == 200 and resp.json()["data"][0]["id"] == "standin/engine"
        assert served.proc.poll() is None  # serve is still up
        served.proc.send_signal(signal.SIGINT)
        assert served.proc.wait(timeout=60) == 0
        errors = " ".join(served.errors().split())
        assert "died: its API server exited with code 137 (128 + SIGKILL)" in errors, errors
        assert "[spanlab guard] command killed by SIGKILL" in errors and "restarting it (--restart-engine)" in errors
        assert "Traceback" not in errors
