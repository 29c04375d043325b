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


@pytest.mark.parametrize(("change", "needle"), [
    ({"stream": "yes"}, "`stream` must be true or false, not 'yes'"),
    ({"stream": 0}, "`stream` must be true or false, not 0"),
    ({"stream": 1}, "`stream` must be true or false, not 1"),
    ({"return_token_ids": "true"}, "`return_token_ids` must be true or false"),
    ({"tools": [{"name": "add", "input_schema": {"type": "object"}, "strict": "no"}]},
     "`tools[0].strict` must be true or false, not 'no'"),
    ({"tool_choice": {"type": "auto", "disable_parallel_tool_use": 1}},
     "`tool_choice.disable_parallel_tool_use` must be true or false, not 1"),
])
def test_booleans_are_strict(dead_gateway: GatewayServer, store: SpanStore, started: tuple[Rollout, Attempt],
                             change: dict[str, Any], needle: str) -> None:
    """``"stream": "yes"`` was read as true and ``0`` as false (issue 65, item 5): a boolean is true or false."""
    base = dead_gateway.base_url(started[0].rollout_id, started[1].attempt_id)
    resp = httpx.post(base + "/messages", json=BODY | change)
    assert resp.status_code == 400 and needle in resp.json()["error"]["message"], resp.text
    assert resp.json()["type"] == "error" and resp.json()["error"]["type"] == "invalid_request_error"
    assert dead_gateway.flush(10) and list(store.iter_spans()) == []


def test_true_false_and_null_booleans_are_taken(dead_gateway: GatewayServer, store: SpanStore,
                                                started: tuple[Rollout, Attempt]) -> None:
    """The strict booleans still take ``true``, ``false`` and ``null`` (left out): each call is forwarded (the closed
    port answers 502) and recorded."""
    base = dead_gateway.base_url(started[0].rollout_id, started[1].attempt_id)
    for stream in (True, False, None):
        resp = httpx.post(base + "/messages", json=BODY | {"stream": stream})
        assert resp.status_code == 502 and resp.json()["error"]["type"] == "api_error", resp.text
    assert dead_gateway.flush(10)
    assert [s.attributes["stream"] for s in store.iter_spans()] == [True, False, False]


@pytest.mark.parametrize(("method", "path", "status"), [
    ("GET", "/v1/messages", 405), ("PUT", "/v1/messages", 405), ("DELETE", "/v1/messages", 405),
    ("GET", "/rollout/ro-x/attempt/at-x/v1/messages", 405),
    ("POST", "/v1/messages/count_tokens", 404), ("GET", "/v1/messages/batches", 404),
    ("POST", "/rollout/ro-x/attempt/at-x/agent/writer/v1/messages/count_tokens", 404),
])
def test_every_answer_on_the_messages_paths_is_in_anthropics_shape(
    dead_gateway: GatewayServer, method: str, path: str, status: int
) -> None:
    """A plain-text 405 and an OpenAI-shaped 404 were answered here (issue 65, item 8)."""
    resp = httpx.request(method, dead_gateway.url + path, json=BODY)
    assert resp.status_code == status and resp.headers["content-type"] == "application/json", resp.text
    body = resp.json()
    assert set(body) == {"type", "error"} and body["type"] == "error" and set(body["error"]) == {"type", "message"}
    assert body["error"]["type"] == ("not_found_error" if status == 404 else "invalid_request_error")
    assert path in body["error"]["message"]
    if status == 405:
        assert resp.headers["allow"] == "POST" and "use POST" in body["error"]["message"]


def test_the_other_paths_keep_openais_shape(dead_gateway: GatewayServer) -> None:
    for method, path, status in [("GET", "/v1/chat/completions", 405), ("POST", "/v1/nothing", 404),
                                 ("POST", "/v1/messagesx", 404)]:
        resp = httpx.request(method, dead_gateway.url + path, json={})
        assert resp.status_code == status and "type" not in resp.json(), resp.text
        assert resp.json()["error"]["code"] in ("not_found", "method_not_allowed")
    resp = httpx.post(dead_gateway.base_url() + "/chat/completions", content=b"x" * 8000)
    assert resp.status_code == 413 and resp.json()["error"]["code"] == "body_too_large" and "type" not in resp.json()


def test_a_chunked_body_over_the_limit_is_413_in_the_messages_shape(dead_gateway: GatewayServer) -> None:
    """Without a length the limit is found while the body is read; the answer is still Anthropic's."""
    def chunks() -> Iterator[bytes]:
        yield from [b"{" + b" " * 4000] * 3

    resp = httpx.post(dead_gateway.base_url() + "/messages", content=chunks())
    assert resp.status_code == 413 and resp.json()["type"] == "error", resp.text
    assert resp.json()["error"]["type"] == "request_too_large" and set(resp.json()["error"]) == {"type", "message"}


def test_a_missing_token_is_401_in_the_messages_shape(store: SpanStore) -> None:
    with GatewayServer(store, "http://127.0.0.1:9", token="s3cret") as gw:
        resp = httpx.post(gw.base_url() + "/messages", json=BODY)
        assert resp.status_code == 401 and resp.json()["error"]["type"] == "authentication_error", resp.text
        assert set(resp.json()) == {"type", "error"}
        resp = httpx.post(gw.base_url() + "/chat/completions", json={})
        assert resp.status_code == 401 and resp.json()["error"]["code"] == "invalid_api_key"
