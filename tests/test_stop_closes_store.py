"""Stopping a server that owns the store closes it: the DuckDB file alone then holds every write.

The gateway (``python -m spanlab.gateway --db``), the store server (``spanlab store serve``) and ``spanlab
serve`` each get calls, then SIGTERM (what a service manager sends) or, after their engine died, SIGINT;
the DuckDB file is then read read-only, without the hot SQLite file beside it that a later open would copy
from. Before, SIGTERM ended the gateway and the store server inside uvicorn, before ``with store:`` closed the
store, and DuckDB lacked the last writes.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import httpx
import pytest
import yaml

from spanlab.threaded_server import ThreadedServer
from tests.gateway.test_gateway_kill import _engine_app
from tests.stores import SPANLAB, ServerProcess, free_port

CALLS = 20
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def _up(url: str, proc: subprocess.Popen) -> None:
    deadline = time.time() + 60
    while time.time() < deadline:
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else proc.returncode
        try:
            if httpx.get(f"{url}/health").status_code < 500:
                return
        except httpx.TransportError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not come up")


def _gateway(db: Path, engine: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "spanlab.gateway", "--upstream", engine, "--db", str(db),
                             "--port", str(port), "--log-level", "warning"], stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    _up(url, proc)
    return proc, f"{url}/v1"


def _serve(db: Path, engine: str, tmp_path: Path) -> tuple[subprocess.Popen, str]:
    cfg = tmp_path / "serve.yaml"
    cfg.write_text(yaml.safe_dump({"db": str(db), "gateway": {"port": 0, "upstream_url": engine},
                                   "store_server": {"port": 0}}))
    proc = subprocess.Popen([SPANLAB, "serve", "--config", str(cfg)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    for line in proc.stdout:
        if line.startswith("base URL:"):
            return proc, line.split()[-1]
    raise RuntimeError(f"spanlab serve did not start: {proc.stderr.read()}")


@pytest.mark.parametrize("how", ["sigterm", "engine-dies-then-sigint"])
@pytest.mark.parametrize("server", ["gateway", "store-server", "spanlab-serve"])
def test_a_stopped_server_leaves_every_write_in_duckdb(tmp_path: Path, server: str, how: str) -> None:
    db = tmp_path / "s.duckdb"
    engine = ThreadedServer(_engine_app(), name="engine").start()
    try:
        if server == "store-server":
            store_server = ServerProcess(db).start()
            proc = store_server.proc
            with store_server.client() as client:
                for _ in range(CALLS):
                    client.enqueue_one({"q": 1})
        else:
            proc, base_url = _gateway(db, engine.url) if server == "gateway" else _serve(db, engine.url, tmp_path)
            for _ in range(CALLS):
                assert httpx.post(f"{base_url}/chat/completions", json=CHAT, timeout=30).status_code == 200
        if how == "engine-dies-then-sigint":
            engine.stop()
        proc.send_signal(signal.SIGTERM if how == "sigterm" else signal.SIGINT)
        rc = proc.wait(timeout=60)
    finally:
        engine.stop()
    if how == "sigterm":
        assert rc == 0, proc.stderr.read()[-2000:]
    (db.parent / f"{db.name}.hot.sqlite").rename(tmp_path / "hot-store-set-aside")
    with duckdb.connect(str(db), read_only=True) as con:
        table = "rollouts" if server == "store-server" else "spans"
        assert con.execute(f"SELECT count(*) FROM {table}").fetchone()[0] == CALLS
