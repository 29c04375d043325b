"""Several vLLM servers of one model (``engine: {replicas: N}``), started together and stopped together.

Why separate processes rather than vLLM's own data parallelism: each replica is an ordinary
:class:`~spanlab.engine.server.VLLMServer` (its own port, log, guard process and weight routes), so the
gateway can route attempts over them and drop one that dies (:mod:`spanlab.gateway.routing`), and weight
sync reaches each over the same HTTP routes as one engine (:class:`spanlab.engine.weights.ReplicaWeightSync`).

The replicas start concurrently (the wait is the slowest one, not the sum). If any does not become ready,
every one already started is stopped before the error is raised, so a failed start leaves no process behind;
the error is one line naming ``engine.replicas``, the replica and its log.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from types import TracebackType

from spanlab.engine.config import EngineConfig
from spanlab.engine.errors import ServerStartError
from spanlab.engine.server import VLLMServer

logger = logging.getLogger(__name__)


class ReplicaStartError(ServerStartError):
    """A replica did not become ready; every replica of the set was stopped."""


class EngineReplicas:
    """``config.replicas`` VLLMServers; ``root_urls`` once started. Use as a context manager."""

    def __init__(self, config: EngineConfig, *, python: str | None = None) -> None:
        self.config = config
        self.servers = [VLLMServer(config.replica(i), python=python) for i in range(config.replicas)]

    @property
    def root_urls(self) -> list[str]:
        return [s.root_url for s in self.servers]

    @property
    def model(self) -> str:
        return self.config.name

    def start(self) -> EngineReplicas:
        n = len(self.servers)
        try:
            with ThreadPoolExecutor(max_workers=n, thread_name_prefix="spanlab-replica-start") as pool:
                futures = [pool.submit(s.start) for s in self.servers]
                errors = [(i, f.exception()) for i, f in enumerate(futures) if f.exception() is not None]
        except BaseException:  # Ctrl-C: the pool waited for the starts in flight; stop what they started
            self.stop()
            raise
        if errors:
            self.stop()
            i, exc = errors[0]
            server = self.servers[i]
            first_line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            where = f"port {server.port}" if server.port is not None else "no port"
            raise ReplicaStartError(
                f"engine.replicas: replica {i + 1} of {n} ({where}) did not become ready: {first_line.rstrip(':')}"
                + (f"; {len(errors) - 1} more failed" if len(errors) > 1 else "")
                + f"; all {n} stopped"
            ) from exc
        logger.info("%d vLLM replicas ready: %s", n, ", ".join(self.root_urls))
        return self

    def stop(self) -> None:
        """Stop every replica (each waits until its whole process tree is gone)."""
        for server in self.servers:
            try:
                server.stop()
            except Exception:  # one replica's stop failing must not leave the others running
                logger.exception("stopping vLLM replica on port %s failed", server.port)

    def pids(self) -> list[int]:
        return [pid for s in self.servers for pid in s.pids()]

    def __enter__(self) -> EngineReplicas:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
