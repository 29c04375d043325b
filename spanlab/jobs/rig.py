"""What every training job stands on: the span store, the engine, the recording gateway, a rollout collector.

Algorithms differ in what they do with rollouts, not in how rollouts are made, so every job opens the
same rig: the store file (cancelling rollouts an interrupted run left queued), vLLM (a running one from
``engine_url``, several from ``engine_urls``, or ``engine.replicas`` started here and stopped with the job),
the gateway in front of them (TITO when the config says so; with several engines each attempt is pinned to
one, docs/replicas.md; with ``policies`` each role's calls go to its policy's adapter, docs/multi_policy.md),
and a collector that runs the configured agent through that gateway. The rig sees the
gateway only as :class:`RecordingGateway` (its URL and a flush), through the gateway package's API.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import httpx

from spanlab.errors import ConfigError
from spanlab.jobs.config import TrainConfig
from spanlab.jobs.rig_backends import open_gateway, open_ray_runner, open_store
from spanlab.jobs.rollouts import RolloutCollector, cancel_leftovers
from spanlab.store.base import StoreAPI

logger = logging.getLogger(__name__)


class RecordingGateway(Protocol):
    """What a job needs of the gateway: where agents call it, and a way to wait until its spans are stored."""

    @property
    def url(self) -> str: ...

    def flush(self, timeout: float | None = 30.0) -> bool: ...

    def set_served_version(self, engine_url: str, version: str | None) -> None: ...

    def set_policy_version(self, policy: str, version: str | None) -> None: ...


@dataclass(frozen=True)
class Rig:
    store: StoreAPI
    root_url: str  # the engine, e.g. http://127.0.0.1:8000 (no /v1)
    served: str  # the model name the engine serves
    gateway: RecordingGateway
    collector: RolloutCollector
    root_urls: tuple[str, ...] = ()  # every engine behind the gateway (root_url is the first)


def check_writable(*paths: Path, keep: bool = False) -> None:
    """The store file's folder and the run folder can be created and written (a real write, as root bypasses
    permission bits); folders this made are removed again unless ``keep`` (``--check`` leaves no trace)."""
    for path in paths:
        folder = path if path.suffix == "" else path.parent
        made = [p for p in (folder, *folder.parents) if not p.exists()]
        try:
            folder.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryFile(dir=folder):
                pass
            if path.suffix and path.exists() and not os.access(path, os.W_OK):
                raise PermissionError(13, "not writable")
        except OSError as exc:
            raise ConfigError(f"cannot write {path}: {exc.strerror or exc}") from exc
        finally:
            for p in made if not keep else ():
                with contextlib.suppress(OSError):
                    p.rmdir()


def open_rig(stack: ExitStack, config: TrainConfig) -> Rig:
    """Open everything on ``stack`` (closed in reverse order when the job ends, also on errors and Ctrl-C)."""
    check_writable(config.db, config.run_dir, keep=True)
    runner = config.runner
    store, store_url, store_token = open_store(stack, runner, config.db)
    cancel_leftovers(store)
    stack.callback(cancel_leftovers, store, "never run: the job stopped early")  # nothing stays queued
    # Ray before the engine: a cluster that cannot host the workers fails in seconds, not after vLLM's minute.
    remote = open_ray_runner(stack, runner, store, store_url, store_token) if store_url is not None else None
    root_urls, served = engines(stack, config)
    gateway, gateway_url, gateway_token = open_gateway(stack, config.gateway, store, root_urls, tito=config.tito,
                                                       tool_call_parser=config.engine.tool_call_parser,
                                                       reasoning_parser=config.engine.reasoning_parser,
                                                       policies=config.policies)
    collector = RolloutCollector(store, gateway_url, config.agent.name, dict(config.agent.kwargs),
                                 concurrency=config.rollouts.concurrency, timeout_s=config.rollouts.timeout_s,
                                 remote=remote,
                                 worker_concurrency=runner.worker_concurrency(config.rollouts.concurrency),
                                 max_attempts=runner.max_attempts, unresponsive_s=runner.unresponsive_s,
                                 gateway_token=gateway_token, seed=config.rollouts.seed)
    return Rig(store, root_urls[0], served, gateway, collector, tuple(root_urls))


def served_model(root: str, key: str) -> str:
    """The model name the vLLM at ``root`` serves; a ConfigError naming ``key`` and the URL if none answers."""
    try:
        return str(httpx.get(f"{root}/v1/models", timeout=30).json()["data"][0]["id"])
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
        raise ConfigError(f"{key}: no vLLM answers at {root}/v1/models: {exc}") from exc


def engines(stack: ExitStack, config: TrainConfig) -> tuple[list[str], str]:
    """(root URLs, served model name): the configured running vLLM(s), or ``engine.replicas`` started here."""
    if config.engine_url:
        root = config.engine_url.rstrip("/").removesuffix("/v1")
        return [root], served_model(root, "engine_url")
    if config.engine_urls:
        roots = list(config.engine_urls)
        names = {root: served_model(root, "engine_urls") for root in roots}
        if len(set(names.values())) > 1:
            raise ConfigError(f"engine_urls: the engines serve different models ({names}); replicas must serve one")
        return roots, names[roots[0]]
    n = config.engine.replicas
    logger.info("starting %s for %s (about a minute on CPU)", f"{n} vLLM replicas" if n > 1 else "vLLM",
                config.engine.model)
    if n > 1:
        from spanlab.engine.replicas import EngineReplicas

        replicas = stack.enter_context(EngineReplicas(config.engine))
        return replicas.root_urls, replicas.model
    from spanlab.engine.server import VLLMServer

    server = stack.enter_context(VLLMServer(config.engine))
    return [server.root_url], server.model
