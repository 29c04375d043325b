"""The parts of a job's rig that ``runner:`` decides: where the store lives and who runs the rollouts.

With ``backend: local`` the job opens the store file and runs rollouts in its own event loop. With
``backend: ray`` the workers are other processes (maybe other machines), so they reach the store through a
store server: the job serves its own file on 127.0.0.1 with a fresh bearer token, or, with
``runner.store_url``, the job and its workers share a store server that already runs. ``runner.store_server``
binds the job's own server elsewhere (``0.0.0.0``) and names the URL workers on other machines are given.
:func:`open_gateway` does the same for the gateway (``gateway:``), with a bearer token off loopback. The checks here
(the Ray address answers, the store server takes the token) are cheap, so ``spanlab train --check`` runs them.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import httpx

from spanlab.errors import ConfigError
from spanlab.runner.config import GatewayListenConfig, RolloutRunnerConfig
from spanlab.store.base import StoreAPI
from spanlab.threaded_server import ListenConfig

if TYPE_CHECKING:
    from spanlab.gateway import GatewayServer
    from spanlab.runner.ray_runner import RayRunner

T = TypeVar("T")


def check_runner(runner: RolloutRunnerConfig) -> None:
    """What can be checked of ``runner:`` before anything starts: the Ray address, the shared store server."""
    if runner.backend != "ray":
        return
    if runner.address not in (None, "auto"):
        from spanlab.runner.ray_runner import check_reachable

        check_reachable(runner.address)
    if runner.store_url is not None:
        check_store_server(runner.store_url, runner.token)


def check_store_server(url: str, token: str | None) -> None:
    """The store server answers and takes ``token`` (a 401 names the setting to fix, not a stack trace later)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        resp = httpx.get(f"{url.rstrip('/')}/health", headers=headers, timeout=10)
    except httpx.HTTPError as exc:
        raise ConfigError(f"runner.store_url: no store server answers at {url}: {exc}") from exc
    if resp.status_code == 401:
        what = "needs a bearer token; set runner.store_token" if token is None else "refused runner.store_token"
        raise ConfigError(f"runner.store_token: the store server at {url} {what}")
    if resp.status_code != 200:
        raise ConfigError(f"runner.store_url: {url}/health answered HTTP {resp.status_code}, not a store server?")


def open_store(stack: ExitStack, runner: RolloutRunnerConfig, db: Path) -> tuple[StoreAPI, str | None, str | None]:
    """The job's store, and the URL and token its Ray workers reach it at (``None, None`` with the local backend)."""
    if runner.backend == "ray" and runner.store_url is not None:
        from spanlab.store.client import StoreClient

        check_store_server(runner.store_url, runner.token)
        client = stack.enter_context(StoreClient(runner.store_url, token=runner.token))
        return client, runner.store_url, runner.token
    from spanlab.store import SpanStore

    store = stack.enter_context(SpanStore(db))
    if runner.backend != "ray":
        return store, None, None
    from spanlab.store.server import create_store_app
    from spanlab.threaded_server import ThreadedServer

    token = secrets.token_urlsafe(32)  # even on loopback: other users of this machine are not us
    listen = runner.store_server or ListenConfig()
    app = create_store_app(store, token=token)
    server = stack.enter_context(bind(lambda: ThreadedServer(app, host=listen.host, port=listen.port,
                                                             name="store server"), "runner.store_server", listen))
    return store, listen.url(server), token


def bind(make: Callable[[], T], key: str, listen: ListenConfig) -> T:
    """``make()`` a server bound to ``listen``; a port in use or a host not of this machine names ``key``."""
    try:
        return make()
    except OSError as exc:
        raise ConfigError(f"{key}: cannot listen on {listen.host}:{listen.port}: {exc.strerror or exc}") from exc


def open_gateway(stack: ExitStack, gateway: GatewayListenConfig, store: StoreAPI, upstream_urls: list[str],
                 **settings: Any) -> tuple[GatewayServer, str, str | None]:
    """Start the job's recording gateway in front of ``upstream_urls``; it, and the URL and token agents are given.

    Off loopback the gateway always has a token: ``gateway.token``, or a fresh random one for this job.
    """
    from spanlab.gateway import GatewayServer

    token = gateway.secret() or (None if gateway.loopback else secrets.token_urlsafe(32))
    server = stack.enter_context(bind(lambda: GatewayServer(store, upstream_urls=tuple(upstream_urls), token=token,
                                                            host=gateway.host, port=gateway.port, **settings),
                                      "gateway", gateway))
    return server, gateway.url(server), token


def open_ray_runner(stack: ExitStack, runner: RolloutRunnerConfig, store: StoreAPI, store_url: str,
                    store_token: str | None) -> RayRunner:
    """The Ray actors, started (and stopped with the job, before the gateway and the store)."""
    from spanlab.runner.ray_runner import RayRunner

    return stack.enter_context(RayRunner(runner, store=store, store_url=store_url, store_token=store_token))
