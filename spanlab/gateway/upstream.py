"""The gateway's HTTP client to the engine, with the client library's errors translated at the edge.

Why aiohttp and not httpx: on this 2-core machine httpx's ``AsyncClient`` managed ~600 sequential and
~170 concurrent (32 connections) calls/s against a trivial loopback server, aiohttp ~2,100 and ~4,900
(benchmarks/gateway_overhead.py, docs/gateway.md). Through a proxy every call pays the client twice.

Timeouts: ``request_timeout_s`` bounds the wait for *each read* from the engine (aiohttp ``sock_read``):
for a non-streamed call that is the whole generation, for a stream the gap between chunks.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Literal

import aiohttp

from spanlab.errors import SpanlabError
from spanlab.gateway.config import GatewayConfig

FailureCode = Literal["upstream_timeout", "upstream_unreachable"]


class UpstreamError(SpanlabError, ConnectionError):
    """The engine did not give a usable answer; ``status_code`` is what the agent gets (502/504)."""

    def __init__(self, code: FailureCode, message: str) -> None:
        super().__init__(message)
        self.code: FailureCode = code
        self.status_code = 504 if code == "upstream_timeout" else 502


class UpstreamClient:
    """One pooled aiohttp session to the engine; created inside the serving event loop."""

    def __init__(self, config: GatewayConfig) -> None:
        self.config = config
        self.base_url = config.upstream_base_url
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        cfg = self.config
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(
                total=None, sock_connect=cfg.connect_timeout_s, sock_read=cfg.request_timeout_s
            ),
            connector=aiohttp.TCPConnector(limit=cfg.max_upstream_connections),
            auto_decompress=False,
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    def _translate(self, exc: BaseException) -> UpstreamError:
        if isinstance(exc, TimeoutError | asyncio.TimeoutError):
            return UpstreamError("upstream_timeout", f"upstream did not answer within {self.config.request_timeout_s}s")
        return UpstreamError(
            "upstream_unreachable", f"cannot reach upstream {self.base_url}: {type(exc).__name__}: {exc}"
        )

    async def send(
        self, method: str, path: str, *, body: bytes | None = None, headers: dict[str, str] | None = None
    ) -> aiohttp.ClientResponse:
        """Send and return once the status line and headers are in; the caller reads and releases."""
        if self._session is None:
            raise RuntimeError("the upstream client is not started (serve the gateway through its app's lifespan)")
        try:
            return await self._session.request(method, self.base_url + path, data=body, headers=headers)
        except (aiohttp.ClientError, OSError, TimeoutError, asyncio.TimeoutError) as exc:
            raise self._translate(exc) from exc

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
