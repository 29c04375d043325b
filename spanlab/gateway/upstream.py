"""The gateway's HTTP client to the engine, with the client library's errors translated at the edge.

Why aiohttp and not httpx: on this 2-core machine httpx's ``AsyncClient`` managed ~600 sequential and
~170 concurrent (32 connections) calls/s against a trivial loopback server, aiohttp ~2,100 and ~4,900
(benchmarks/gateway_overhead.py, docs/gateway.md). Through a proxy every call pays the client twice.

Health: a call that cannot connect (refused, reset, DNS) marks the engine down at once, since that is what a
dead engine looks like; a timeout does not (a busy engine is slow, not gone). Any answer marks it up again.
:mod:`spanlab.gateway.routing` reads ``healthy`` to keep new attempts off an engine that stopped answering.

Stale connections: an engine closes a pooled connection after its own keep-alive (uvicorn: 5 s idle). The
pool drops idle connections sooner (``upstream_keepalive_s``), and a call whose request could not be sent
or got no answer on a reused connection (``ServerDisconnectedError``, "Can not write request body") is
sent once more on a fresh one: aiohttp retries that case itself only for idempotent methods, and every
engine route here is a POST. Such a failure does not mark the engine down; a failed *connect* does.

Timeouts: ``request_timeout_s`` bounds the wait for *each read* from the engine (aiohttp ``sock_read``):
for a non-streamed call that is the whole generation, for a stream the gap between chunks.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Literal

import aiohttp

from spanlab.errors import SpanlabError
from spanlab.gateway.config import GatewayConfig

logger = logging.getLogger(__name__)

FailureCode = Literal["upstream_timeout", "upstream_unreachable"]


class UpstreamError(SpanlabError, ConnectionError):
    """The engine did not give a usable answer; ``status_code`` is what the agent gets (502/504)."""

    def __init__(self, code: FailureCode, message: str) -> None:
        super().__init__(message)
        self.code: FailureCode = code
        self.status_code = 504 if code == "upstream_timeout" else 502


class UpstreamClient:
    """One pooled aiohttp session to one engine (``base_url``, default the config's first); created inside the
    serving event loop."""

    def __init__(self, config: GatewayConfig, base_url: str | None = None) -> None:
        self.config = config
        self.base_url = base_url or config.upstream_base_url
        self.healthy = True
        self.down_reason: str | None = None
        self._probe_failures = 0
        self._session: aiohttp.ClientSession | None = None

    def mark_down(self, reason: str) -> None:
        if self.healthy:
            logger.warning("engine %s marked down: %s", self.base_url, reason)
        self.healthy, self.down_reason = False, reason

    def mark_up(self) -> None:
        if not self.healthy:
            logger.info("engine %s answers again", self.base_url)
        self.healthy, self.down_reason, self._probe_failures = True, None, 0

    async def probe(self) -> bool:
        """``GET /health`` within ``health_timeout_s``; ``health_failures`` failures in a row mark it down."""
        if self._session is None:
            return self.healthy
        try:
            async with self._session.get(self.base_url + "/health",
                                         timeout=aiohttp.ClientTimeout(total=self.config.health_timeout_s)) as resp:
                ok, why = resp.status == 200, f"/health answered {resp.status}"
        except (aiohttp.ClientError, OSError, TimeoutError, asyncio.TimeoutError) as exc:
            ok, why = False, f"/health failed: {type(exc).__name__}: {exc}"
        if ok:
            self.mark_up()
        else:
            self._probe_failures += 1
            if self._probe_failures >= self.config.health_failures:
                self.mark_down(why)
        return self.healthy

    async def start(self) -> None:
        cfg = self.config
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(
                total=None, sock_connect=cfg.connect_timeout_s, sock_read=cfg.request_timeout_s
            ),
            connector=aiohttp.TCPConnector(
                limit=cfg.max_upstream_connections, keepalive_timeout=cfg.upstream_keepalive_s
            ),
            auto_decompress=False,
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    def _translate(self, exc: BaseException) -> UpstreamError:
        if isinstance(exc, TimeoutError | asyncio.TimeoutError):
            return UpstreamError("upstream_timeout", f"upstream did not answer within {self.config.request_timeout_s}s")
        self.mark_down(f"{type(exc).__name__}: {exc}")
        return UpstreamError(
            "upstream_unreachable", f"cannot reach upstream {self.base_url}: {type(exc).__name__}: {exc}"
        )

    async def send(
        self, method: str, path: str, *, body: bytes | None = None, headers: dict[str, str] | None = None
    ) -> aiohttp.ClientResponse:
        """Send and return once the status line and headers are in; the caller reads and releases."""
        if self._session is None:
            raise RuntimeError("the upstream client is not started (serve the gateway through its app's lifespan)")
        url = self.base_url + path
        try:
            try:
                resp = await self._session.request(method, url, data=body, headers=headers)
            except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
                if isinstance(exc, aiohttp.ClientConnectorError):
                    raise
                logger.debug("%s %s on a stale connection (%s); sending it again", method, url, exc)
                resp = await self._session.request(method, url, data=body, headers=headers)
        except (aiohttp.ClientError, OSError, TimeoutError, asyncio.TimeoutError) as exc:
            raise self._translate(exc) from exc
        if not self.healthy:
            self.mark_up()
        return resp

    async def read(self, resp: aiohttp.ClientResponse) -> bytes:
        """The whole body; the connection goes back to the pool."""
        try:
            return await resp.read()
        except (aiohttp.ClientError, OSError, TimeoutError, asyncio.TimeoutError) as exc:
            raise self._translate(exc) from exc
        finally:
            resp.release()

    async def line_batches(self, resp: aiohttp.ClientResponse) -> AsyncIterator[list[bytes]]:
        """The body as lists of complete lines, one list per network read, as bytes arrive.

        Per read, not per line: when the engine is ahead of the agent several SSE events arrive
        together and can go on in one write. No line-length limit: a first SSE chunk carrying the
        ``prompt_token_ids`` of a long prompt is one line of hundreds of KB.
        """
        buf = b""
        try:
            async for piece in resp.content.iter_any():
                buf += piece
                if b"\n" in buf:
                    *complete, buf = buf.split(b"\n")
                    yield complete
        except (aiohttp.ClientError, OSError, TimeoutError, asyncio.TimeoutError) as exc:
            raise self._translate(exc) from exc
        if buf:
            yield [buf]
