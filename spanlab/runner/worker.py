"""One rollout worker: dequeue, run the agent, heartbeat, record the reward, finish the attempt.

Several rollouts run at once per worker (``concurrency``), as asyncio tasks. The outcome maps onto
the store's retry policy: the agent raising ends the attempt ``failed`` (with an error span holding
the traceback), running past the rollout's ``timeout_s`` ends it ``timeout``; a worker that dies or
blocks stops heartbeating and the store ends its attempts ``unresponsive``. If the store ends an
attempt first (it timed out there), the next heartbeat says so and the agent is cancelled.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from spanlab.runner.agent import Agent, RolloutContext, Scored
from spanlab.store.base import StoreAPI
from spanlab.types import ACTIVE_ATTEMPT_STATUSES, Attempt, FinishedAttemptStatus, Resource, Rollout, Span, reward_span

logger = logging.getLogger(__name__)
PENDING = ("queuing", "requeuing", "preparing", "running")
RolloutDone = Callable[[float | None], None]  # a finished attempt's reward (None: it recorded none), for progress


@dataclass
class WorkerStats:
    succeeded: int = 0
    failed: int = 0
    timeout: int = 0
    lost: int = 0  # ended by the store before the agent finished


def attempt_url(gateway_url: str, rollout_id: str, attempt_id: str) -> str:
    """The OpenAI base URL that records calls as spans of this attempt."""
    return f"{gateway_url.rstrip('/')}/rollout/{rollout_id}/attempt/{attempt_id}/v1"


def resolve_resources(store: StoreAPI, version: str | None) -> dict[str, Resource]:
    """The resources a rollout runs with: the versions it pinned (``name@v,...``), else the latest."""
    if not version:
        latest: dict[str, Resource] = {}
        for res in store.list_resources():
            latest[res.name] = res  # listed by name, then version: the last one wins
        return latest
    out = {}
    for ref in version.split(","):
        name, _, v = ref.partition("@")
        out[name] = store.get_resource(name, int(v))
    return out


class Worker:
    def __init__(self, store: StoreAPI, agent: Agent, *, worker_id: str | None = None, gateway_url: str | None = None,
                 concurrency: int = 4, heartbeat_s: float = 2.0, poll_s: float = 0.2, mode: str | None = None,
                 exit_when_idle: bool = True, gateway_token: str | None = None,
                 on_finished: RolloutDone | None = None) -> None:
        self.store, self.agent = store, agent
        self.worker_id = worker_id or f"{socket.gethostname()}-{os.getpid()}"
        self.gateway_url, self.gateway_token = gateway_url, gateway_token
        self.concurrency, self.heartbeat_s, self.poll_s = concurrency, heartbeat_s, poll_s
        self.mode, self.exit_when_idle = mode, exit_when_idle
        self.on_finished = on_finished
        self.stats = WorkerStats()
        self._stopping = False

    def stop(self) -> None:
        """Make ``run`` return within ``poll_s``: nothing more is taken and the agents still running are cancelled
        (call it in the worker's event loop; their attempts are the caller's to end in the store, e.g. cancelled)."""
        self._stopping = True

    async def run(self, max_rollouts: int | None = None) -> WorkerStats:
        """Work until the store has nothing left (or ``max_rollouts`` were taken, or ``stop`` was called)."""
        in_flight: set[asyncio.Task[None]] = set()
        taken = 0
        while True:
            if self._stopping:
                for task in in_flight:
                    task.cancel()
                await asyncio.gather(*in_flight, return_exceptions=True)
                break
            can_take = len(in_flight) < self.concurrency and (max_rollouts is None or taken < max_rollouts)
            if can_take:
                got = await asyncio.to_thread(self.store.dequeue, self.worker_id, self.mode)
                if got is not None:
                    taken += 1
                    in_flight.add(asyncio.create_task(self._run_one(*got)))
                    continue
            if not in_flight:
                if max_rollouts is not None and taken >= max_rollouts:
                    break
                if self.exit_when_idle and await self._nothing_pending():
                    break
                await asyncio.sleep(self.poll_s)
                continue
            done, in_flight = await asyncio.wait(in_flight, timeout=self.poll_s, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                task.result()  # surface bugs in the worker itself
        return self.stats

    async def _nothing_pending(self) -> bool:
        """True once no rollout anywhere waits or runs (others' attempts may still be requeued)."""
        return await asyncio.to_thread(self.store.count_rollouts, PENDING) == 0

    async def _run_one(self, rollout: Rollout, attempt: Attempt) -> None:
        started = time.monotonic()  # the attempt's clock starts at dequeue, whatever setup costs
        resources = await asyncio.to_thread(resolve_resources, self.store, rollout.resources_version)
        llm_url = attempt_url(self.gateway_url, rollout.rollout_id, attempt.attempt_id) if self.gateway_url else None
        ctx = RolloutContext(rollout=rollout, attempt=attempt, store=self.store, llm_base_url=llm_url,
                             resources=resources, llm_api_key=self.gateway_token or "spanlab")
        agent_task = asyncio.create_task(self.agent.run(rollout.input, ctx))
        beats = asyncio.create_task(self._heartbeat(attempt.attempt_id, agent_task))
        status: FinishedAttemptStatus
        spans: list[Span] = []
        try:
            limit = rollout.config.timeout_s
            reward = await asyncio.wait_for(agent_task, None if limit is None else limit - (time.monotonic() - started))
            status = "succeeded"
            if reward is not None:
                spans.append(reward_span(rollout.rollout_id, attempt.attempt_id, float(reward), final=True,
                                         attributes=reward.attributes if isinstance(reward, Scored) else None))
        except asyncio.TimeoutError:
            status = "timeout"
        except asyncio.CancelledError:
            this = asyncio.current_task()
            if not agent_task.cancelled() or (this is not None and getattr(this, "cancelling", lambda: 0)()):
                raise  # the worker itself is being cancelled (Ctrl-C, shutdown): not the store's doing
            self.stats.lost += 1
            logger.warning("attempt %s was ended by the store; its agent was cancelled", attempt.attempt_id)
            return
        except Exception as exc:
            status = "failed"
            spans.append(Span(rollout_id=rollout.rollout_id, attempt_id=attempt.attempt_id, name="agent_error",
                              kind="custom", status="error",
                              attributes={"error": repr(exc), "traceback": traceback.format_exc(limit=20)}))
            logger.info("rollout %s attempt %d failed: %r", rollout.rollout_id, attempt.sequence_id, exc)
        finally:
            beats.cancel()
        await asyncio.to_thread(self.store.finish_attempt, attempt.attempt_id, status, spans)
        setattr(self.stats, status, getattr(self.stats, status) + 1)
        if self.on_finished is not None:
            self.on_finished(float(reward) if status == "succeeded" and reward is not None else None)

    async def _heartbeat(self, attempt_id: str, agent_task: asyncio.Task) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_s)
            state = await asyncio.to_thread(self.store.heartbeat, attempt_id)
            if state.status not in ACTIVE_ATTEMPT_STATUSES:
                agent_task.cancel()
                return


async def run_then_close(worker: Worker, agent: Any, max_rollouts: int | None = None) -> WorkerStats:
    """Run the worker in this event loop, then close what the agent opened in it (an MCP server, say)."""
    try:
        return await worker.run(max_rollouts=max_rollouts)
    finally:
        close = getattr(agent, "aclose", None)
        if close is not None:
            await close()
