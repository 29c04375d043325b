"""The gateway under the same guards as the store server (issue 42, item 4): the JSON policy, a body limit, a
bounded ``n``, a token before the body, a token beyond loopback, and Host checks.

Real HTTP on loopback; the "engine" is a closed port, so a request the gateway lets through answers 502, and
one it refuses answers 4xx without reaching it.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from spanlab.errors import ConfigError
from spanlab.gateway import GatewayServer
from spanlab.gateway.protocol import MAX_N
from spanlab.store import SpanStore

CHAT = b'{"model":"m","messages":[{"role":"user","content":"hi"}]'
RESPONSES = b'{"model":"m","input":"hi"'


@pytest.fixture
def gateway(store: SpanStore, closed_port: int) -> Iterator[GatewayServer]:
    with GatewayServer(store, f"http://127.0.0.1:{closed_port}/v1", max_body_bytes=1 << 20) as gw:
        yield gw


def _post(gw: GatewayServer, path: str, body: bytes, **headers: str) -> httpx.Response:
    return httpx.post(gw.url + path, content=body, headers={"content-type": "application/json", **headers},
                      timeout=30)


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/responses"])
@pytest.mark.parametrize(("extra", "says"), [
    (b',"x":' + b"[" * 100_000 + b"]" * 100_000, "nested deeper"),
    (b',"x":' + b"[" * 300 + b"]" * 300, "nested deeper"),
    (b',"temperature":NaN', "NaN"),
    (b',"temperature":Infinity', "Infinity"),
    (b',"user":"\\ud800"', "surrogate"),
    (b',"user":"\xff"', "UTF-8"),
])
def test_json_the_policy_refuses_is_422(gateway: GatewayServer, path: str, extra: bytes, says: str) -> None:
    base = CHAT if path.endswith("completions") else RESPONSES
    r = _post(gateway, path, base + extra + b"}")
    assert r.status_code == 422 and says in r.json()["error"]["message"], r.text[:300]
    assert r.json()["error"]["code"] == "invalid_json"


def test_n_is_bounded_before_any_span_id_is_made(gateway: GatewayServer) -> None:
    start = time.monotonic()
    r = _post(gateway, "/v1/chat/completions", CHAT + b',"n":2147483648}')
    assert r.status_code == 400 and f"1 to {MAX_N}" in r.json()["error"]["message"], r.text
    assert time.monotonic() - start < 5
    assert _post(gateway, "/v1/chat/completions", CHAT + f',"n":{MAX_N + 1}}}'.encode()).status_code == 400
    assert _post(gateway, "/v1/chat/completions", CHAT + f',"n":{MAX_N}}}'.encode()).status_code == 502  # let through


def test_bodies_over_the_limit_are_413_chunked_or_not(gateway: GatewayServer) -> None:
    big = CHAT + b',"user":"' + b"x" * (2 << 20) + b'"}'
    r = _post(gateway, "/v1/chat/completions", big)
    assert r.status_code == 413 and r.json()["error"]["code"] == "body_too_large", r.text[:300]

    def chunks() -> Iterator[bytes]:
        yield CHAT + b',"user":"'
        for _ in range(64):
            yield b"x" * 65536
        yield b'"}'

    r = httpx.post(gateway.url + "/v1/chat/completions", content=chunks(), timeout=30)
    assert r.status_code == 413 and r.json()["error"]["code"] == "body_too_large", r.text[:300]
    assert gateway.gateway.writer.given_up == 0  # nothing was recorded, nothing lost


def test_the_token_is_checked_before_the_body_is_read(store: SpanStore, closed_port: int) -> None:
    with GatewayServer(store, f"http://127.0.0.1:{closed_port}", token="t") as gw, \
            socket.create_connection(("127.0.0.1", gw.port), timeout=5) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n" + b"100000\r\n" + b"[" * 65536)
        answer = sock.recv(4096)
    assert answer.startswith(b"HTTP/1.1 401") and b"invalid_api_key" in answer, answer[:300]


def test_beyond_loopback_a_token_is_needed(store: SpanStore, closed_port: int) -> None:
    with pytest.raises(ConfigError, match=r"refusing to serve the gateway on 0\.0\.0\.0 without a token"):
        GatewayServer(store, f"http://127.0.0.1:{closed_port}", host="0.0.0.0")
    with GatewayServer(store, f"http://127.0.0.1:{closed_port}", host="0.0.0.0", token="t") as gw:
        assert httpx.get(f"http://127.0.0.1:{gw.port}/health").status_code == 401
        ok = httpx.get(f"http://127.0.0.1:{gw.port}/health", headers={"Authorization": "Bearer t"})
        assert ok.status_code == 200


def test_on_loopback_only_loopback_host_names_are_answered(gateway: GatewayServer) -> None:
    assert httpx.get(gateway.url + "/health").status_code == 200
    assert httpx.get(gateway.url + "/health", headers={"Host": "evil.example"}).status_code == 421
