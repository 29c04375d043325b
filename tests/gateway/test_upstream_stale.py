"""A pooled connection the engine closed just as a call reuses it: the call is sent again, not failed.

vLLM (uvicorn) closes a connection after 5 s idle; aiohttp kept idle ones for 15 s, and retries a request
that died on a reused connection only for idempotent methods, while every engine route is a POST. A main-job
run lost a render call that way (``ClientOSError: Can not write request body``). The engine here is a real
TCP server on 127.0.0.1 that answers the first request of each connection with keep-alive and closes the
connection, unanswered, when a second request arrives on it: the race, made deterministic.
"""

from __future__ import annotations

import asyncio

from spanlab.gateway.config import GatewayConfig
from spanlab.gateway.upstream import UpstreamClient

_OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\nConnection: keep-alive\r\n\r\n{}"


async def _one_answer_per_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    answered = False
    while True:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length")), 0)
        await reader.readexactly(length)
        if answered:
            writer.close()
            return
        writer.write(_OK)
        await writer.drain()
        answered = True


async def _two_calls(keepalive_s: float) -> tuple[list[int], bool]:
    server = await asyncio.start_server(_one_answer_per_connection, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = UpstreamClient(GatewayConfig(upstream_base_url=f"http://127.0.0.1:{port}",
                                          upstream_keepalive_s=keepalive_s))
    await client.start()
    statuses = []
    try:
        for _ in range(2):
            resp = await client.send("POST", "/render", body=b'{"a": 1}')
            await client.read(resp)
            statuses.append(resp.status)
    finally:
        await client.close()
        server.close()
        await server.wait_closed()
    return statuses, client.healthy


def test_a_post_on_a_connection_the_engine_closed_is_sent_again_and_the_engine_stays_up() -> None:
    statuses, healthy = asyncio.run(_two_calls(keepalive_s=60.0))
    assert statuses == [200, 200]
    assert healthy
