"""Serving an ASGI app with uvicorn on a daemon thread: the store server and gateway inside a process; and the
rule a server follows: no bind beyond loopback without a token (:func:`check_bind`); the checks of each request
are in :mod:`spanlab.guards`.

``port=0`` binds any free port, and the socket is bound before the thread starts, so ``url`` is
known immediately and two servers never race for a port. :class:`ListenConfig` is the config side of a
server a job starts for its workers: where it binds, and the URL the workers are given.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import socket
import threading
import time
from collections.abc import Iterator
from types import FrameType
from typing import Any
from urllib.parse import urlparse

import uvicorn
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from spanlab.errors import ConfigError
from spanlab.guards import LOOPBACK_NAMES, HostCheck, loopback_hosts

logger = logging.getLogger(__name__)
__all__ = ["LOOPBACK_NAMES", "ListenConfig", "ThreadedServer", "check_bind"]


def check_bind(host: str, token: str | None, *, insecure_no_token: bool = False,
               flag: str = "--insecure-no-token", what: str = "the store",
               token_hint: str = "--token or $SPANLAB_STORE_TOKEN") -> None:
    """Refuse to serve ``what`` beyond loopback without a token: anyone who reaches the port could then read,
    cancel and rewrite every rollout (or, for the gateway, spend the engines and write spans into any attempt).
    ``insecure_no_token`` (``flag`` in the error) is the explicit way."""
    if host in LOOPBACK_NAMES or token:
        return
    if not insecure_no_token:
        raise ConfigError(
            f"refusing to serve {what} on {host} without a token: anyone who can reach it could read and "
            f"change it. Set a token ({token_hint}), bind 127.0.0.1, or pass {flag} "
            "if this network is trusted"
        )
    logger.warning("serving %s on %s WITHOUT a token (%s): anyone who can reach it can read and change it",
                   what, host, flag)


@contextlib.contextmanager
def sigterm_exits() -> Iterator[None]:
    """SIGTERM unwinds the stack (``SystemExit(0)``) as Ctrl-C does (``KeyboardInterrupt``), so a ``with store:``
    around ``uvicorn.run`` closes the store and DuckDB holds every write. Needed because uvicorn re-raises the
    signal it shut down for, and SIGTERM's default action ends the process at once. Enter it before the store,
    so a second SIGTERM cannot cut the store's close short. Main thread only."""
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    logger.info("SIGTERM: stopping")
    raise SystemExit(0)


class ThreadedServer:
    """``app`` served on ``host:port``; bound to loopback, it answers only loopback Host names (:class:`HostCheck`:
    DNS rebinding), whatever the app."""

    def __init__(self, app: Any, *, host: str = "127.0.0.1", port: int = 0, name: str = "server") -> None:
        self.app, self.host, self.name = app, host, name
        hosts = loopback_hosts(host)
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, port))
        self.port: int = self._sock.getsockname()[1]
        self._server = uvicorn.Server(
            # log_config=None: uvicorn's dictConfig would reset every existing logger's level in the host
            # process (httpx's INFO line per request came back in `spanlab train` that way).
            uvicorn.Config(app if hosts is None else HostCheck(app, hosts), log_level="warning", log_config=None,
                           access_log=False, lifespan="on",
                           timeout_graceful_shutdown=5)
        )
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, name=f"spanlab-{name}-{self.port}", daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 30.0) -> ThreadedServer:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive():
                raise RuntimeError(f"the {self.name} on {self.url} failed to start (see the log)")
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"the {self.name} on {self.url} did not start within {timeout}s")
            time.sleep(0.01)
        return self

    def stop(self, *, force: bool = False) -> None:
        """Stop serving; the app's shutdown hooks (draining writes) run before this returns. ``force``: do not
        wait for requests in flight (on Ctrl-C their clients are gone already)."""
        self._server.force_exit = force
        self._server.should_exit = True
        # A forced stop cancels the requests in flight; uvicorn would log each cancellation as a traceback.
        errors = logging.getLogger("uvicorn.error")
        level = errors.level
        if force:
            errors.setLevel(logging.CRITICAL)
        try:
            if self._thread.is_alive():
                self._thread.join()
        finally:
            errors.setLevel(level)
        self._sock.close()

    def __enter__(self) -> ThreadedServer:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        self.stop(force=exc_type is not None and not issubclass(exc_type, Exception))


WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", ""})  # bind every interface: an address to listen on, not to call


class ListenConfig(BaseModel):
    """Where a server the job starts listens (``host``, ``port``) and the URL its workers are given to call it.

    The two differ as soon as workers run on other machines: ``0.0.0.0`` is where a server listens, not an
    address anyone can call, and behind a reverse proxy or NAT the callers' URL names another host and port.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str = Field(default="127.0.0.1", description="the interface to bind: 127.0.0.1 (this machine only), "
                      "0.0.0.0 (every interface), or one address of this machine")
    port: int = Field(default=0, ge=0, le=65_535, description="0: any free port (only for workers on this machine)")
    advertise_url: str | None = Field(default=None, description="the URL workers call, e.g. http://10.0.0.5:8701; "
                                      "default: http://host:port (127.0.0.1 for a 0.0.0.0 bind)")

    @field_validator("host")
    @classmethod
    def _host_is_a_host(cls, host: str) -> str:
        if not host or any(c in host for c in "/ ") or "://" in host:
            raise ValueError(f"{host!r} is not a host to bind, such as 127.0.0.1 or 0.0.0.0")
        return host

    @field_validator("advertise_url")
    @classmethod
    def _advertise_url_is_callable(cls, url: str | None) -> str | None:
        if url is None:
            return None
        parts = urlparse(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"advertise_url {url!r} is not an http(s) URL such as http://10.0.0.5:8701")
        if parts.hostname in WILDCARD_HOSTS:
            raise ValueError(f"advertise_url {url!r} names {parts.hostname}, which no worker can call; "
                             "give this machine's address or name")
        return url.rstrip("/")

    @model_validator(mode="after")
    def _advertised_port_is_fixed(self) -> ListenConfig:
        if self.advertise_url is not None and self.port == 0:
            raise ValueError("port: 0 picks a free port at start, which advertise_url cannot name; set port")
        return self

    @property
    def reachable_elsewhere(self) -> bool:
        """Whether workers on other machines can be given this server: advertised, or bound to a real address."""
        return self.advertise_url is not None or self.host not in WILDCARD_HOSTS | LOOPBACK_NAMES

    @property
    def loopback(self) -> bool:
        return self.host in LOOPBACK_NAMES

    def url(self, server: ThreadedServer) -> str:
        """The URL callers are given: ``advertise_url``, else the bound address (loopback for a wildcard bind)."""
        if self.advertise_url is not None:
            return self.advertise_url
        host = "127.0.0.1" if self.host in WILDCARD_HOSTS else self.host
        return f"http://{f'[{host}]' if ':' in host else host}:{server.port}"
