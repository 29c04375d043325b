"""``runner:`` in a train config: where a job's rollouts run, in this process or on Ray actors.

``backend: local`` (the default) runs the agent in the job's own event loop, as it always did.
``backend: ray`` runs ``workers`` Ray actors, each a spanlab :class:`~spanlab.runner.Worker` with its own agent
(and whatever the agent starts: an MCP server, a sandbox), that dequeue the job's rollouts through the store
server. Everything that can be checked without a cluster is checked here, so ``spanlab train --check``
catches a missing ``ray`` extra, a malformed address or a resource request Ray would reject.

Workers on other machines must reach the job's gateway and store server: :class:`GatewayListenConfig`
(``gateway:`` of a train config) and ``runner.store_server`` say where each binds and which URL the workers
are given (``advertise_url``), since a server bound to 0.0.0.0 listens everywhere but is called at a real address.
"""

from __future__ import annotations

import importlib.util
from typing import Literal
from urllib.parse import urlparse

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from spanlab.threaded_server import WILDCARD_HOSTS, ListenConfig

RAY_EXTRA_HINT = "install the `ray` extra: pip install 'spanlab[ray]' (scripts/setup.sh does)"


def ray_installed() -> bool:
    """Whether ``import ray`` would find the package, without importing it (importing Ray costs seconds)."""
    try:
        return importlib.util.find_spec("ray") is not None
    except (ImportError, ValueError):  # ValueError: a module object without a spec (sys.modules['ray'] = None)
        return False


def split_address(address: str) -> tuple[str, int]:
    """``host:port`` of a Ray address (``host:port``, ``ray://host:port``); ValueError if it has neither."""
    parts = urlparse(address if "://" in address else f"gcs://{address}")
    if parts.scheme not in ("gcs", "ray") or not parts.hostname or parts.port is None:
        raise ValueError(f"{address!r} is not a Ray address such as 127.0.0.1:6379 or ray://head:10001")
    return parts.hostname, parts.port


def unreachable(listen: ListenConfig, key: str, who: str) -> str | None:
    """The one-line error for a server bound to every interface with no URL to give the workers, else None."""
    if listen.host in WILDCARD_HOSTS and listen.advertise_url is None:
        return (f"{key}.advertise_url: {key}.host {listen.host} is where the {who} listens, not an address Ray "
                f"workers can call; set {key}.advertise_url to this machine's URL (e.g. http://10.0.0.5:{listen.port})")
    return None


class GatewayListenConfig(ListenConfig):
    """``gateway:`` of a train config: where the job's recording gateway listens, the URL agents are given, its token.

    On loopback (the default) it takes calls from this machine only, without a token. Bound anywhere else it
    always has one: ``token``, or a fresh random one per job, which the job hands its workers (the agents send
    it as their ``api_key``), as the job's own store server does with its token.
    """

    token: SecretStr | None = Field(default=None, description="the bearer token agents send as api_key; default: "
                                    "none on loopback, a fresh random one per job on any other host")

    @field_validator("token")
    @classmethod
    def _token_not_empty(cls, token: SecretStr | None) -> SecretStr | None:
        if token is not None and not token.get_secret_value().strip():
            raise ValueError("token is empty: give a token, or leave it out")
        return token

    def secret(self) -> str | None:
        """``token`` in the clear, for the agents that send it."""
        return None if self.token is None else self.token.get_secret_value()


class RolloutRunnerConfig(BaseModel):
    """Where a training job's rollouts run; the retry settings apply to the Ray backend, whose workers can die."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    backend: Literal["local", "ray"] = Field(default="local", description="local: in the job's process; ray: "
                                             "Ray actors")
    address: str | None = Field(default=None, description="a running Ray cluster (host:port or ray://host:port); "
                                "default: start a local one in this process, stopped with the job")
    workers: int = Field(default=2, ge=1, le=4096, description="Ray actors, each a spanlab worker with its own agent")
    concurrency: int | None = Field(default=None, ge=1, le=4096, description="rollouts in flight per worker; "
                                    "default: rollouts.concurrency split across the workers")
    resources: dict[str, float] = Field(default_factory=lambda: {"CPU": 1.0},
                                        description="Ray resources each actor holds: CPU, GPU, or custom names")
    heartbeat_s: float = Field(default=2.0, gt=0, le=3600, description="how often a running attempt tells the "
                               "store it is alive")
    unresponsive_s: float = Field(default=30.0, gt=0, le=86_400,
                                  description="an attempt silent this long (its worker died) is ended and retried")
    max_attempts: int = Field(default=3, ge=1, le=100, description="attempts per rollout when workers are lost")
    start_timeout_s: float = Field(default=120.0, gt=0, le=3600, description="how long the actors may take to start")
    store_url: str | None = Field(default=None, description="a store server (spanlab store serve) the job and the "
                                  "workers share, instead of the job's own on 127.0.0.1")
    store_token: SecretStr | None = Field(default=None, description="that store server's bearer token "
                                          "(printed masked by --check)")
    store_server: ListenConfig | None = Field(default=None, description="where the job serves its own store to "
                                              "the workers (without store_url): host, port, advertise_url")

    @field_validator("address")
    @classmethod
    def _address_is_host_port(cls, address: str | None) -> str | None:
        if address is not None and address != "auto":
            split_address(address)
        return address

    @field_validator("store_url")
    @classmethod
    def _store_url_is_http(cls, url: str | None) -> str | None:
        if url is not None:
            parts = urlparse(url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ValueError(f"{url!r} is not an http(s) URL such as http://127.0.0.1:8700")
        return url

    @field_validator("resources")
    @classmethod
    def _resources_are_counts(cls, resources: dict[str, float]) -> dict[str, float]:
        bad = {k: v for k, v in resources.items() if v < 0 or not k}
        if bad:
            raise ValueError(f"resource amounts must be >= 0, got {bad}")
        return resources

    @model_validator(mode="after")
    def _ray_settings_need_ray(self) -> RolloutRunnerConfig:
        if self.backend == "local":
            given = sorted(k for k in ("address", "store_url", "store_token", "store_server")
                           if getattr(self, k) is not None)
            if given:
                raise ValueError(f"{', '.join(given)}: only used with backend: ray")
            return self
        if not ray_installed():
            raise ValueError(f"backend: ray needs the `ray` package, which is not installed; {RAY_EXTRA_HINT}")
        if self.store_token is not None and self.store_url is None:
            raise ValueError("store_token: only used with store_url (the job's own store server makes its own token)")
        if self.store_server is not None:
            if self.store_url is not None:
                raise ValueError("store_server: only used without store_url (with it, the workers use store_url)")
            problem = unreachable(self.store_server, "store_server", "job's store server")
            if problem:
                raise ValueError(problem)
        return self

    def actor_options(self) -> dict[str, object]:
        """``resources`` in the words of Ray's ``.options()``: CPU and GPU by name, the rest as custom resources."""
        custom = {k: v for k, v in self.resources.items() if k not in ("CPU", "GPU")}
        options: dict[str, object] = {"num_cpus": self.resources.get("CPU", 0.0)}
        if "GPU" in self.resources:
            options["num_gpus"] = self.resources["GPU"]
        if custom:
            options["resources"] = custom
        return options

    @property
    def token(self) -> str | None:
        """``store_token`` in the clear, for the client that sends it."""
        return None if self.store_token is None else self.store_token.get_secret_value()

    def worker_concurrency(self, total: int) -> int:
        """Rollouts in flight per worker: the configured number, else ``total`` (rollouts.concurrency) split up."""
        return self.concurrency or max(1, -(-total // self.workers))
