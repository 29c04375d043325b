"""Rollout workers that keep working while the trainer trains: the async loop's producer side.

The sync loop runs one step's rollouts and waits for them (``RolloutCollector.run``). The async loop
(docs/async.md) needs workers that take whatever the store's queue holds for as long as the loop runs: a
runner :class:`~spanlab.runner.worker.Worker` in an event loop on a thread of this process (``runner.backend:
local``), or the Ray actors kept at work by :meth:`~spanlab.runner.ray_runner.RayRunner.serve` from a thread
(``backend: ray``). Either way the queue, the heartbeats and the retries are the store's, so the loop sees the
same thing whoever runs the agents.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import Any

from spanlab.errors import RolloutWorkersError
from spanlab.runner.agent import load_agent
from spanlab.runner.worker import Worker, run_then_close
from spanlab.store.base import StoreAPI

logger = logging.getLogger(__name__)


class BackgroundRollouts:
    """``serve(stop)`` on a thread of its own until ``close``; ``check`` raises once it ended with an error."""

    def __init__(self, serve: Callable[[threading.Event], object], *, name: str = "spanlab-rollouts",
                 join_timeout_s: float = 60.0) -> None:
        self._serve, self._stop, self._error = serve, threading.Event(), None
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self.join_timeout_s = join_timeout_s

    def _main(self) -> None:
        try:
            self._serve(self._stop)
        except BaseException as exc:  # handed to the trainer's thread by check()
            self._error = exc

    def start(self) -> BackgroundRollouts:
        self._thread.start()
        return self

    def check(self) -> None:
        """Raise if the workers stopped before ``close`` (the loop would otherwise wait for rollouts forever)."""
        if self._error is not None:
            raise RolloutWorkersError(f"the rollout workers stopped: {self._error!r}") from self._error
        if not self._thread.is_alive() and not self._stop.is_set():
            raise RolloutWorkersError("the rollout workers stopped before the loop ended")

    def close(self) -> None:
        """Stop the workers; the rollouts they still ran are the caller's to have ended in the store first."""
        self._stop.set()
        self._thread.join(self.join_timeout_s)
        if self._thread.is_alive():
            logger.warning("the rollout workers did not stop within %.0fs", self.join_timeout_s)

    def __enter__(self) -> BackgroundRollouts:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def serve_locally(store: StoreAPI, agent_name: str, agent_kwargs: dict[str, Any], *, gateway_url: str,
                  concurrency: int, mode: str = "train", poll_s: float = 0.05,
                  gateway_token: str | None = None) -> Callable[[threading.Event], None]:
    """A ``serve`` that runs one Worker (``concurrency`` rollouts at once) in an event loop until ``stop``."""
    agent = load_agent(agent_name, agent_kwargs)  # here, so a bad agent fails in the caller's thread

    async def work(stop: threading.Event) -> None:
        worker = Worker(store, agent, gateway_url=gateway_url, concurrency=concurrency, mode=mode, poll_s=poll_s,
                        exit_when_idle=False, gateway_token=gateway_token)
        running = asyncio.create_task(run_then_close(worker, agent))
        while not stop.is_set() and not running.done():
            await asyncio.sleep(poll_s)
        worker.stop()
        await running  # re-raises a bug of the worker's

    return lambda stop: asyncio.run(work(stop))
