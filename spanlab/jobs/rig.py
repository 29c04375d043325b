"""What every training job stands on: the span store, the engine, the recording gateway, a rollout collector.

GRPO and APO differ in what they do with rollouts, not in how rollouts are made, so both open the same
rig: the store file (cancelling rollouts an interrupted run left queued), vLLM (a running one from
``engine_url``, or one started here and stopped with the job), the gateway in front of it (TITO when the
config says so), and a collector that runs the configured agent through that gateway.
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass

import httpx
from rich.console import Console

from spanlab.jobs.config import TrainConfig
from spanlab.jobs.rollouts import RolloutCollector, cancel_leftovers
from spanlab.store.base import StoreAPI


@dataclass(frozen=True)
class Rig:
    store: StoreAPI
    root_url: str  # the engine, e.g. http://127.0.0.1:8000 (no /v1)
    served: str  # the model name the engine serves
    gateway: object  # spanlab.gateway.app.GatewayServer (imported lazily: it pulls in the web stack)
    collector: RolloutCollector


def open_rig(stack: ExitStack, config: TrainConfig, console: Console) -> Rig:
    """Open everything on ``stack`` (closed in reverse order when the job ends, also on errors)."""
    from spanlab.gateway.app import GatewayServer
    from spanlab.store import SpanStore

    config.run_dir.mkdir(parents=True, exist_ok=True)
    config.db.parent.mkdir(parents=True, exist_ok=True)
    store = stack.enter_context(SpanStore(config.db))
    cancel_leftovers(store)
    root_url, served = _engine(stack, config, console)
    gateway = stack.enter_context(GatewayServer(store, root_url, tito=config.tito))
    collector = RolloutCollector(store, gateway.url, config.agent.name, dict(config.agent.kwargs),
                                 concurrency=config.loop.concurrency, timeout_s=config.loop.rollout_timeout_s)
    return Rig(store, root_url, served, gateway, collector)


def _engine(stack: ExitStack, config: TrainConfig, console: Console) -> tuple[str, str]:
    """(root URL, served model name): the configured running vLLM, or one started here."""
    if config.engine_url:
        root = config.engine_url.rstrip("/").removesuffix("/v1")
        return root, httpx.get(f"{root}/v1/models", timeout=30).json()["data"][0]["id"]
    from spanlab.engine.server import VLLMServer

    console.log(f"starting vLLM for {config.engine.model} (about a minute on CPU)")
    server = stack.enter_context(VLLMServer(config.engine))
    return server.root_url, server.model
