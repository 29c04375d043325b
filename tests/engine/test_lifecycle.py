"""Process lifecycle of the managed server: no orphans after a parent SIGKILL, a dead engine's one-line reason and
its restart.

Each starts or restarts a real server (~40-80 s each on 2 cores). The orphan check's child serves
the session's tiny random model (tests/engine_fixtures.py): what it checks is the process tree, not the model.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from spanlab.engine import _guard
from spanlab.engine.server import VLLMServer
from spanlab.engine.watch import EngineDiedError, watch_engines

pytestmark = pytest.mark.vllm

REPO = Path(__file__).resolve().parents[2]


def _alive(pids: list[int]) -> list[int]:
    out = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state not in ("Z", "X"):
            out.append(pid)
    return out


def test_parent_sigkill_leaves_no_vllm_processes(tiny_model_dir: Path) -> None:
    """The child serves the tiny model: what is checked is the process tree, not what the model says."""
    script = textwrap.dedent("""
        import json, sys, time
        from spanlab.engine.config import EngineConfig
        from spanlab.engine.server import VLLMServer
        server = VLLMServer(EngineConfig(model=sys.argv[1], max_model_len=512)).start()
        print(json.dumps({"pgid": server.pgid, "pids": server.pids()}), flush=True)
        time.sleep(3600)
    """)
    parent = subprocess.Popen([sys.executable, "-c", script, str(tiny_model_dir)], cwd=REPO, stdout=subprocess.PIPE,
                              text=True)
    try:
        line = parent.stdout.readline() if parent.stdout else ""
        assert line, "child did not start a server"
        info = json.loads(line)
        names = " ".join(_guard.cmdline(p) for p in info["pids"])
        assert "vllm.entrypoints.openai.api_server" in names and "VLLM::EngineCore" in names
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and (_alive(info["pids"]) or _guard.group_members(info["pgid"])):
            time.sleep(0.5)
        assert _alive(info["pids"]) == [] and _guard.group_members(info["pgid"]) == []
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()


def test_dead_engine_is_detected_and_restarted(vllm_server: Any) -> None:
    if not isinstance(vllm_server, VLLMServer):
        pytest.skip("needs a server this session controls")
    base_url = vllm_server.base_url
    core = [p for p in vllm_server.pids() if "VLLM::EngineCore" in _guard.cmdline(p)]
    assert core, "no EngineCore process found"
    os.kill(core[0], signal.SIGKILL)
    deadline = time.monotonic() + 30
    while vllm_server.status() != "dead" and time.monotonic() < deadline:
        time.sleep(0.5)
    assert vllm_server.status() == "dead"
    # what `spanlab serve` says and does (spanlab.engine.watch): one line, the core's death and the API server's status
    reason = vllm_server.death()
    assert reason is not None and "\n" not in reason
    assert f"died: its engine core (pid {', '.join(map(str, core))}) died and its API server " in reason, reason
    assert f"log {vllm_server.log_path} ends: " in reason
    with pytest.raises(EngineDiedError, match=r"died: its engine core .* \(--restart-engine restarts a dead engine\)"):
        watch_engines([vllm_server], threading.Event(), restart=False, interval_s=0.1)
    assert vllm_server.ensure_healthy() is True
    assert vllm_server.status() == "healthy" and vllm_server.base_url == base_url
    resp = httpx.post(f"{base_url}/completions", timeout=60,
                      json={"model": vllm_server.model, "prompt": "Hi", "max_tokens": 2})
    assert resp.status_code == 200, resp.text
    assert vllm_server.ensure_healthy() is False


def test_startup_failure_raises_with_log_tail(tmp_path: Path) -> None:
    from spanlab.engine.config import EngineConfig
    from spanlab.engine.errors import ServerStartError

    bad = tmp_path / "not-a-model"
    bad.mkdir()
    server = VLLMServer(EngineConfig(model=str(bad), startup_timeout_s=120, log_path=tmp_path / "v.log"))
    with pytest.raises(ServerStartError) as err:
        server.start()
    assert "exited with code" in str(err.value) and str(bad) in str(err.value)
    assert server.pids() == []
