"""Both store implementations for tests: ``SpanStore`` in-process and ``StoreClient`` over real HTTP.

``ServerProcess`` runs ``spanlab store serve`` on a free 127.0.0.1 port (the CLI's own tests use it). The
``any_store`` fixture (registered in tests/conftest.py) gives each test a fresh store of each kind, so a test
written against ``StoreAPI`` runs on both. Its HTTP case serves a fresh DuckDB file from a
:class:`~spanlab.threaded_server.ThreadedServer` in the test's process, the way ``spanlab train`` serves its store
to its workers: a loopback round trip through the real app and client, without a process start per case.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from spanlab.store import SpanStore, StoreAPI, StoreClient
from spanlab.store.server import create_store_app
from spanlab.threaded_server import ThreadedServer

SPANLAB = str(Path(sys.executable).with_name("spanlab"))
TOKEN = "t0k3n"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """``spanlab store serve`` in a subprocess; ``stop(signal.SIGKILL)`` kills it without a goodbye."""

    def __init__(self, db: Path, port: int | None = None, *extra: str) -> None:
        self.db, self.port, self.extra = db, port or free_port(), extra
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self) -> ServerProcess:
        cmd = [SPANLAB, "store", "serve", "--db", str(self.db), "--port", str(self.port), "--token", TOKEN,
               *self.extra]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 60
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"store server exited: {self.proc.stderr.read()}")
            try:
                if httpx.get(f"{self.url}/health", headers={"Authorization": f"Bearer {TOKEN}"}).is_success:
                    return self
            except httpx.TransportError:
                time.sleep(0.1)
        raise RuntimeError("store server did not come up")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=30)

    def client(self, **kw: object) -> StoreClient:
        return StoreClient(self.url, token=TOKEN, **kw)


@pytest.fixture(params=["duckdb", "http"])
def any_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreAPI]:
    """A fresh ``SpanStore(":memory:")``, then a fresh ``StoreClient`` to its own store server (a DuckDB file)."""
    if request.param == "duckdb":
        with SpanStore(":memory:") as store:
            yield store
        return
    with SpanStore(tmp_path / "served.duckdb") as served, \
            ThreadedServer(create_store_app(served, token=TOKEN), name="store server") as server, \
            StoreClient(server.url, token=TOKEN, retry_for_s=5) as client:
        yield client


def running_attempts(store: StoreAPI, n: int, worker_id: str = "w") -> list[tuple[str, str]]:
    """``n`` rollouts queued and dequeued at once: their ``(rollout_id, attempt_id)``, as a gateway sees them."""
    out = []
    for i in range(n):
        store.enqueue_one({"q": i})
        got = store.dequeue(worker_id=worker_id)
        assert got is not None
        out.append((got[0].rollout_id, got[1].attempt_id))
    return out


def wait_until(check: Callable[[], bool], timeout_s: float = 30.0) -> bool:
    """Poll ``check`` every 10 ms until it holds (True) or ``timeout_s`` passes (False): for work a background
    thread finishes, where no event can be awaited."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True
