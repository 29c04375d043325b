"""Rollout workers as Ray actors: each a spanlab :class:`Worker` on the store server, with its own agent.

The job keeps the queue: it enqueues a step's rollouts in the store, asks every actor to work, and waits
for those rollout IDs to end in the store, not for the actors. Heartbeats, timeouts and retries stay the
store's, so a lost actor (killed, its node gone) is only a worker that stopped heartbeating: its attempt
ends ``unresponsive`` after ``unresponsive_s`` and the retry policy requeues the rollout for the others.
A dead actor is replaced, so the pool keeps its size. Ray is imported here only, when a runner starts.
In an async training loop (docs/async.md) the actors instead work for as long as the loop keeps groups queued
(:meth:`RayRunner.serve`, in a thread of the job's).
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any

from spanlab.errors import ConfigError
from spanlab.runner.agent import load_agent
from spanlab.runner.config import RAY_EXTRA_HINT, RolloutRunnerConfig, split_address
from spanlab.runner.worker import RolloutDone, Worker, run_then_close
from spanlab.store.base import StoreAPI
from spanlab.types import RolloutMode

logger = logging.getLogger(__name__)
TERMINAL = ("succeeded", "failed", "cancelled")
WAITING = ("queuing", "requeuing")
LOCAL_OBJECT_STORE_BYTES = 128 * 1024 * 1024  # rollouts pass IDs and small dicts; Ray's default takes 30% of RAM


class RolloutActor:
    """The body of one Ray actor (``ray.remote`` wraps it when a runner starts, so importing this needs no Ray)."""

    def __init__(self, store_url: str, store_token: str | None, worker_id: str, heartbeat_s: float,
                 poll_s: float) -> None:
        from spanlab.store.client import StoreClient

        logging.basicConfig(level=logging.INFO, format=f"[{worker_id}] %(levelname)s %(name)s: %(message)s")
        for name in ("httpx", "httpx2"):  # one INFO line per model call (openai logs via httpx2) is noise here
            logging.getLogger(name).setLevel(logging.WARNING)
        self.store = StoreClient(store_url, token=store_token)
        self.worker_id = worker_id
        self.heartbeat_s, self.poll_s = heartbeat_s, poll_s

    def ready(self) -> str:
        return self.worker_id

    def work(self, agent_name: str, agent_kwargs: dict[str, Any], gateway_url: str | None, mode: RolloutMode | None,
             concurrency: int, gateway_token: str | None = None) -> dict[str, int]:
        """Run rollouts of ``mode`` until nothing waits or runs in the store; the agent lives for this call."""
        agent = load_agent(agent_name, agent_kwargs)
        worker = Worker(self.store, agent, worker_id=self.worker_id, gateway_url=gateway_url,
                        concurrency=concurrency, heartbeat_s=self.heartbeat_s, poll_s=self.poll_s, mode=mode,
                        gateway_token=gateway_token)
        return asdict(asyncio.run(run_then_close(worker, agent)))


def _import_ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise ConfigError(f"runner.backend: ray needs the `ray` package ({exc}); {RAY_EXTRA_HINT}") from exc
    return ray


def check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """Fail in seconds on an address nothing listens at (``ray.init`` would retry for minutes)."""
    host, port = split_address(address)
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError as exc:
        raise ConfigError(f"runner.address: no Ray cluster answers at {address}: {exc.strerror or exc}") from exc


class RayRunner:
    """``workers`` actors on a Ray cluster (the configured one, or a local one this starts and stops)."""

    def __init__(self, config: RolloutRunnerConfig, *, store: StoreAPI, store_url: str, store_token: str | None,
                 poll_s: float = 0.25) -> None:
        self.config, self.store = config, store
        self.store_url, self.store_token = store_url, store_token
        self.poll_s = poll_s
        self.actors: dict[str, Any] = {}  # worker_id -> actor handle, the live ones
        self._slots: list[str] = []  # slot -> its current worker_id
        self._respawns = 0
        self._ray: Any = None
        self._owns_ray = False

    # --- lifecycle ------------------------------------------------------------------------------------
    def start(self) -> RayRunner:
        ray = self._ray = _import_ray()
        if not ray.is_initialized():  # a process already connected (a notebook, a Ray job) keeps its connection
            self._init(ray)
            self._owns_ray = True
        self._actor_class = ray.remote(RolloutActor)
        for slot in range(self.config.workers):
            self._slots.append(self._spawn(f"ray-{slot}"))
        try:
            ray.get([a.ready.remote() for a in self.actors.values()], timeout=self.config.start_timeout_s)
        except ray.exceptions.GetTimeoutError:
            have = ray.cluster_resources()
            self.close()
            raise ConfigError(f"runner.workers/runner.resources: {self.config.workers} actors asking "
                              f"{self.config.resources} each did not start within {self.config.start_timeout_s:g}s "
                              f"(runner.start_timeout_s); the cluster has {have}") from None
        logger.info("%d Ray rollout workers ready", len(self.actors))
        return self

    def _init(self, ray: Any) -> None:
        quiet = {"logging_level": logging.WARNING, "log_to_driver": True}
        if self.config.address is None:
            cpus = max(os.cpu_count() or 1, math.ceil(self.config.workers * self.config.resources.get("CPU", 0.0)))
            try:
                ray.init(num_cpus=cpus, include_dashboard=False, object_store_memory=LOCAL_OBJECT_STORE_BYTES,
                         **quiet)
            except Exception as exc:  # Ray raises a bare Exception when its processes do not come up in time
                raise ConfigError(f"runner: cannot start a local Ray cluster (runner.address unset): {exc}") from exc
            return
        if self.config.address != "auto":
            check_reachable(self.config.address)
        try:
            ray.init(address=self.config.address, **quiet)
        except ConnectionError as exc:
            raise ConfigError(f"runner.address: cannot connect to Ray at {self.config.address}: {exc}") from exc

    def _spawn(self, worker_id: str) -> str:
        actor = self._actor_class.options(**self.config.actor_options()).remote(
            self.store_url, self.store_token, worker_id, self.config.heartbeat_s, self.poll_s)
        self.actors[worker_id] = actor
        return worker_id

    def close(self) -> None:
        """Kill the actors (their in-flight attempts end ``unresponsive`` in the store) and a cluster started here."""
        if self._ray is None:
            return
        for actor in self.actors.values():
            self._ray.kill(actor)
        self.actors.clear()
        if self._owns_ray:
            self._ray.shutdown()
            self._owns_ray = False

    def __enter__(self) -> RayRunner:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- rollouts -------------------------------------------------------------------------------------
    def run(self, rollout_ids: Sequence[str], *, agent_name: str, agent_kwargs: dict[str, Any],
            gateway_url: str | None, mode: RolloutMode | None, concurrency: int,
            gateway_token: str | None = None, on_ended: RolloutDone | None = None) -> None:
        """Have every actor work on the queue, and return once each of ``rollout_ids`` has ended in the store
        (``on_ended`` gets each one's reward as the polling sees it end)."""
        if not rollout_ids:
            return
        pending = set(rollout_ids)

        def ended() -> bool:
            for summary in self.store.rollout_summaries(list(pending), statuses=TERMINAL):
                pending.discard(summary.rollout_id)
                if on_ended is not None:
                    on_ended(summary.final_reward)
            return not pending

        self._keep_working((agent_name, agent_kwargs, gateway_url, mode, concurrency, gateway_token), until=ended)

    def serve(self, stop: threading.Event, *, agent_name: str, agent_kwargs: dict[str, Any],
              gateway_url: str | None, mode: RolloutMode | None, concurrency: int,
              gateway_token: str | None = None) -> None:
        """Keep the actors working on whatever the queue holds until ``stop`` is set (the async loop's workers,
        run in a thread of their own); then wait for their calls to end (the caller cancels what is left)."""
        self._keep_working((agent_name, agent_kwargs, gateway_url, mode, concurrency, gateway_token),
                           until=stop.is_set)

    def _keep_working(self, args: tuple[Any, ...], until: Callable[[], bool]) -> None:
        """Actor calls work until the queue is empty, so a slot whose call ended gets a new one when rollouts wait;
        stale attempts are expired meanwhile (a lost worker's attempt ends even while nobody dequeues)."""
        ray = self._ray
        calls: dict[int, Any] = {}
        while True:
            self.store.expire_stale_attempts()
            if until():
                break
            if len(calls) < len(self._slots) and self.store.count_rollouts(WAITING):
                for slot in set(range(len(self._slots))) - set(calls):
                    calls[slot] = self.actors[self._slots[slot]].work.remote(*args)
            if not calls:
                time.sleep(self.poll_s)
                continue
            done, _ = ray.wait(list(calls.values()), num_returns=len(calls), timeout=self.poll_s)
            for slot in [s for s, ref in calls.items() if ref in done]:
                self._reap(slot, calls.pop(slot))
        for slot, ref in calls.items():  # they stop once the queue is empty; wait so the next run starts clean
            self._reap(slot, ref, timeout_s=max(30.0, 4 * self.config.heartbeat_s))

    def _reap(self, slot: int, ref: Any, timeout_s: float | None = None) -> None:
        """A worker call ended: fine (the queue was empty then), a bug (raised here), or its process was lost."""
        errors = self._ray.exceptions
        try:
            self._ray.get(ref, timeout=timeout_s)
        except errors.GetTimeoutError:
            logger.warning("Ray worker %s still works after its rollouts ended (others' rollouts in the store?)",
                           self._slots[slot])
        except errors.RayTaskError:
            raise  # the agent or worker code raised: every replacement would too
        except errors.RayError as exc:  # the actor died: killed, out of memory, its node gone
            dead = self._slots[slot]
            self.actors.pop(dead, None)
            self._respawns += 1
            self._slots[slot] = self._spawn(f"ray-{slot}.{self._respawns}")
            logger.warning("Ray worker %s was lost (%s); replaced by %s", dead, type(exc).__name__, self._slots[slot])
