"""``/v1/messages`` without an engine, through the real ``anthropic`` SDK: refused requests (the SDK raises the
Messages API's error, status 400 or 413; no span), an unreachable engine (502 in the Messages shape and an error
span named ``messages``), an unknown attempt (404 before forwarding). Real HTTP on loopback; the "engine" is a
closed port, so nothing here can have been answered by anything but the gateway."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from anthropic import Anthropic, APIStatusError, BadRequestError

from spanlab.gateway import GatewayServer
from spanlab.store import SpanStore
from spanlab.types import Attempt, Rollout

BODY: dict[str, Any] = {"model": "m", "max_tokens": 4, "system": "be brief",
                        "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def dead_gateway(store: SpanStore) -> Iterator[GatewayServer]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with GatewayServer(store, f"http://127.0.0.1:{port}/v1", max_body_bytes=4096) as gw:
        yield gw


def _client(gw: GatewayServer, started: tuple[Rollout, Attempt] | None = None) -> Anthropic:
    base = gw.base_url(*(None, None) if started is None else (started[0].rollout_id, started[1].attempt_id))
    return Anthropic(base_url=base.removesuffix("/v1"), api_key="unused", max_retries=0)


@pytest.mark.parametrize(("change", "needle"), [
    ({"messages": [{"role": "user", "content": [{"type": "text", "txt": "hi"}]}]}, "content[0].text must be a string"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_x", "content": "5"}]}]},
     "unknown tool_use_id 'toolu_x'"),
    ({"max_tokens": -1}, "`max_tokens` must be a positive integer"),
])
@pytest.mark.parametrize("stream", [False, True])
def test_refused_requests_raise_the_messages_error_and_leave_no_span(
    dead_gateway: GatewayServer, store: SpanStore, started: tuple[Rollout, Attempt], change: dict[str, Any],
    needle: str, stream: bool
) -> None:
    with pytest.raises(BadRequestError) as err:
        _client(dead_gateway, started).messages.create(**BODY | change, stream=stream)
    assert err.value.status_code == 400 and needle in err.value.message
    assert err.value.body["type"] == "error" and err.value.body["error"]["type"] == "invalid_request_error"
    assert dead_gateway.flush(10) and list(store.iter_spans()) == []


def test_a_missing_max_tokens_is_refused(dead_gateway: GatewayServer, store: SpanStore) -> None:
    """The SDK will not send a request without ``max_tokens``; a hand-made body shows the gateway's answer."""
    resp = httpx.post(dead_gateway.base_url() + "/messages", json={k: v for k, v in BODY.items() if k != "max_tokens"})
    assert resp.status_code == 400 and resp.json() == {"type": "error", "error": {
        "type": "invalid_request_error", "message": "`max_tokens` is required"}}
    resp = httpx.post(dead_gateway.base_url() + "/messages", content=b"{not json")
    assert resp.status_code == 400 and resp.json()["type"] == "error" and "not valid JSON" in resp.text
    assert dead_gateway.flush(10) and list(store.iter_spans()) == []


def test_a_body_over_the_limit_is_413_in_the_messages_shape(dead_gateway: GatewayServer, store: SpanStore) -> None:
    big = BODY | {"messages": [{"role": "user", "content": "x" * 8000}]}
    with pytest.raises(APIStatusError) as err:
        _client(dead_gateway).messages.create(**big)
    assert err.value.status_code == 413 and err.value.body["type"] == "error"
    assert err.value.body["error"]["type"] == "request_too_large" and "limit" in err.value.body["error"]["message"]
    assert dead_gateway.flush(10) and list(store.iter_spans()) == []


@pytest.mark.parametrize("stream", [False, True])
def test_an_unreachable_engine_is_502_and_an_error_span(
    dead_gateway: GatewayServer, store: SpanStore, started: tuple[Rollout, Attempt], stream: bool
) -> None:
    with pytest.raises(APIStatusError) as err:
        _client(dead_gateway, started).messages.create(**BODY, stream=stream)
    assert err.value.status_code == 502 and err.value.body["error"]["type"] == "api_error"
    assert "upstream" in err.value.body["error"]["message"]
    assert dead_gateway.flush(10)
    (span,) = store.iter_spans()
    assert (span.name, span.status, span.attempt_id) == ("messages", "error", started[1].attempt_id)
    assert span.attributes["endpoint"] == "/v1/messages" and span.attributes["stream"] is stream
    assert span.attributes["messages"]["message_id"].startswith("msg_")
    assert span.llm.request_messages == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    assert span.attributes["request_params"]["max_tokens"] == 4


def test_an_unknown_attempt_is_404_before_forwarding(dead_gateway: GatewayServer, store: SpanStore) -> None:
    client = Anthropic(base_url=dead_gateway.url + "/rollout/ro-x/attempt/at-x", api_key="unused", max_retries=0)
    with pytest.raises(APIStatusError) as err:
        client.messages.create(**BODY)
    assert err.value.status_code == 404 and err.value.body["error"]["type"] == "not_found_error"
    assert dead_gateway.flush(10) and list(store.iter_spans()) == []
