"""Building the gateway app, and serving it in-process.

``create_app`` returns a plain Starlette app (no FastAPI: its validation layer would cost latency on
every call and the bodies are forwarded as they are anyway). ``GatewayServer`` runs it with uvicorn on
a loopback port in a background thread, so tests, notebooks and in-process runners can start and stop
a gateway without a subprocess:

    with GatewayServer(store, "http://127.0.0.1:8000") as gw:
        client = AsyncOpenAI(base_url=gw.base_url(rollout.rollout_id, attempt.attempt_id), api_key="x")
        ...
        gw.flush()   # a completed call is stored before its answer; flush waits for failed calls' spans
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Collection
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response

from spanlab.errors import ConfigError
from spanlab.gateway.auth import refusal
from spanlab.gateway.config import GatewayConfig
from spanlab.gateway.messages.reply import error_body as messages_error_body
from spanlab.gateway.messages.reply import is_messages_path
from spanlab.gateway.protocol import dumps, error_body
from spanlab.gateway.proxy import Gateway
from spanlab.guards import BodyTooLargeError, add_guards
from spanlab.store.base import StoreAPI
from spanlab.threaded_server import ThreadedServer, check_bind

logger = logging.getLogger(__name__)


_ROUTES = ("the gateway serves /v1/chat/completions, /v1/completions, /v1/responses, /v1/messages and /v1/models, "
           "optionally under /rollout/{rid}/attempt/{aid}")


def _api_error(request: Request, status: int, message: str, code: str, headers: dict[str, str] | None = None
               ) -> Response:
    """An error in the shape of the API the path is on: Anthropic's on ``/v1/messages*``, else OpenAI's."""
    if is_messages_path(request.url.path):
        body = messages_error_body(message, status)
    else:
        body = dumps(error_body(message, code=code))
    return Response(body, status, media_type="application/json", headers=headers)


async def _not_found(request: Request, exc: Exception) -> Response:
    return _api_error(request, 404, f"no route {request.method} {request.url.path}; {_ROUTES}", "not_found")


async def _not_allowed(request: Request, exc: Exception) -> Response:
    allowed = getattr(exc, "headers", None) or {}
    return _api_error(request, 405, f"{request.method} is not allowed on {request.url.path}"
                      + (f"; use {allowed['Allow']}" if "Allow" in allowed else ""), "method_not_allowed", allowed)


async def _too_large(request: Request, exc: Exception) -> Response:
    return Response(refusal(413, str(exc), request.url.path), 413, media_type="application/json")


def create_app(
    store: StoreAPI, upstream_base_url: str | None = None, *, config: GatewayConfig | None = None,
    hosts: Collection[str] | None = None, **overrides: Any
) -> Starlette:
    """A gateway in front of ``upstream_base_url`` recording into ``store`` (which the caller owns).

    Pass a full ``config``, or the URL plus any :class:`GatewayConfig` fields as keywords. The app's
    lifespan starts the upstream client and span writer, and on shutdown flushes every queued span. The
    guards of every surface (:mod:`spanlab.guards`) run before a route: ``hosts``, the only ``Host`` names
    answered (None: any); ``config.token``, a bearer token every request must carry (:mod:`spanlab.gateway.auth`);
    :func:`body_limit`. Unknown routes and wrong methods get 404 and 405 in the error shape of the path's API.
    Bodies follow the JSON policy (:func:`~spanlab.gateway.protocol.parse_request`).
    """
    if config is None:
        if upstream_base_url is None and not overrides.get("upstream_urls"):
            raise TypeError("create_app needs upstream_base_url, upstream_urls or config")
        if upstream_base_url is not None:
            overrides["upstream_base_url"] = upstream_base_url
        config = GatewayConfig(**overrides)
    elif upstream_base_url is not None or overrides:
        raise TypeError("pass either config or upstream_base_url/overrides, not both")
    gateway = Gateway(store, config)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await gateway.start()
        logger.info("gateway up, forwarding to %s", ", ".join(config.upstreams))
        try:
            yield
        finally:
            await gateway.stop()

    app = Starlette(routes=gateway.routes(), lifespan=lifespan,
                    exception_handlers={404: _not_found, 405: _not_allowed, BodyTooLargeError: _too_large})
    add_guards(app, hosts=hosts, token=None if config.token is None else config.token.get_secret_value(),
               max_body_bytes=body_limit(config, store), refusal=refusal)
    app.state.gateway = gateway
    return app


def body_limit(config: GatewayConfig, store: StoreAPI) -> int:
    """The largest request body the gateway takes: ``config.max_body_bytes``, by default the store's record limit
    (``store.max_json_bytes``), and never above it: a body the door let through whose record the store refused
    would be a call generated, then answered 503 and lost (:mod:`spanlab.gateway.oversize` covers the rare record
    a little over the limit from a body under it)."""
    if config.max_body_bytes is None:
        return store.max_json_bytes
    if config.max_body_bytes > store.max_json_bytes:
        raise ConfigError(f"gateway max_body_bytes={config.max_body_bytes} is over the span store's record limit "
                          f"({store.max_json_bytes} bytes, max_json_bytes): a call with a larger body could not be "
                          "recorded; leave max_body_bytes unset (it follows the store) or lower it")
    return config.max_body_bytes


class GatewayServer(ThreadedServer):
    """A gateway served by uvicorn on ``host:port`` in a daemon thread (``port=0``: any free port). Beyond
    loopback it needs ``token`` (``insecure_no_token``: the explicit way not to); on loopback it answers only
    loopback Host names (:class:`~spanlab.threaded_server.ThreadedServer`)."""

    def __init__(self, store: StoreAPI, upstream_base_url: str | None = None, *, host: str = "127.0.0.1",
                 port: int = 0, config: GatewayConfig | None = None, insecure_no_token: bool = False,
                 **overrides: Any) -> None:
        token = config.token if config is not None else overrides.get("token")
        check_bind(host, token.get_secret_value() if hasattr(token, "get_secret_value") else token,
                   insecure_no_token=insecure_no_token, flag="insecure_no_token", what="the gateway",
                   token_hint="gateway.token")
        super().__init__(create_app(store, upstream_base_url, config=config, **overrides), host=host, port=port,
                         name="gateway")
        self.gateway: Gateway = self.app.state.gateway

    def base_url(self, rollout_id: str | None = None, attempt_id: str | None = None, agent: str | None = None) -> str:
        """The OpenAI ``base_url`` an agent should use (attributed when IDs are given; ``agent``: a role's)."""
        if rollout_id is None and attempt_id is None and agent is None:
            return f"{self.url}/v1"
        if rollout_id is None or attempt_id is None:
            raise ValueError("give both rollout_id and attempt_id (and optionally agent), or none")
        role = "" if agent is None else f"/agent/{agent}"
        return f"{self.url}/rollout/{rollout_id}/attempt/{attempt_id}{role}/v1"

    def flush(self, timeout: float | None = 30.0) -> bool:
        """Block until every span recorded so far is in the store."""
        return self.gateway.writer.flush(timeout)

    def set_served_version(self, engine_url: str, version: str | None) -> None:
        """Weight sync tells the gateway what ``engine_url`` serves now; later spans record it."""
        self.gateway.router.set_version(engine_url, version)

    def set_policy_version(self, policy: str, version: str | None) -> None:
        """A policy's adapter is served at ``version`` now (after its hot-load); later spans of its roles record it."""
        if self.gateway.policies is None:
            raise ValueError(f"policy {policy!r}: this gateway was started without policies")
        self.gateway.policies.set_version(policy, version)

    def start(self, timeout: float = 30.0) -> GatewayServer:
        super().start(timeout)
        return self

    def __enter__(self) -> GatewayServer:
        return self.start()
