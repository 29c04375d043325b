"""``/v1/responses`` without an engine: bad requests (400, no span), an unreachable engine (502, an error span
named ``responses``), an unknown attempt (404 before forwarding). Real HTTP on loopback, as in
tests/gateway/test_gateway_http.py; the "engine" is a closed port."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import httpx
import pytest
from openai import APIStatusError, OpenAI

from spanlab.gateway import GatewayServer
from spanlab.store import SpanStore
from spanlab.types import Attempt, Rollout

BODY = {"model": "m", "input": "hi", "instructions": "be brief", "max_output_tokens": 2}


@pytest.fixture
def dead_gateway(store: SpanStore) -> Iterator[GatewayServer]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with GatewayServer(store, f"http://127.0.0.1:{port}/v1") as gw:
        yield gw


@pytest.mark.parametrize(("body", "needle"), [
    (b"{not json", "not valid JSON"),
    (b'{"model": "m", "input": "x", "previous_response_id": "resp_1"}', "previous_response_id"),
    (b'{"model": "m", "input": "x", "tools": [{"type": "file_search"}]}', "'file_search' is not supported"),
    (b'{"model": "m", "input": [{"type": "computer_call"}]}', "'computer_call' are not supported"),
])
def test_requests_it_cannot_serve_are_400_and_leave_no_span(
    dead_gateway: GatewayServer, store: SpanStore, body: bytes, needle: str
) -> None:
    resp = httpx.post(dead_gateway.base_url() + "/responses", content=body)
    assert resp.status_code == 400 and needle in resp.json()["error"]["message"], resp.text
    dead_gateway.flush(10)
    assert list(store.iter_spans()) == []


@pytest.mark.parametrize("stream", [False, True])
def test_an_unreachable_engine_is_502_and_an_error_span(
    dead_gateway: GatewayServer, store: SpanStore, started: tuple[Rollout, Attempt], stream: bool
) -> None:
    rollout, attempt = started
    client = OpenAI(base_url=dead_gateway.base_url(rollout.rollout_id, attempt.attempt_id), api_key="x",
                    max_retries=0)
    with pytest.raises(APIStatusError) as err:
        client.responses.create(**BODY, stream=stream)
    assert err.value.status_code == 502 and "upstream" in str(err.value)
    assert dead_gateway.flush(10)
    (span,) = store.iter_spans()
    assert (span.name, span.status, span.attempt_id) == ("responses", "error", attempt.attempt_id)
    assert span.attributes["endpoint"] == "/v1/responses" and span.attributes["stream"] is stream
    assert span.llm.request_messages == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    assert span.attributes["request_params"]["max_tokens"] == 2


def test_an_unknown_attempt_is_404_before_forwarding(dead_gateway: GatewayServer, store: SpanStore) -> None:
    resp = httpx.post(dead_gateway.base_url("ro-x", "at-missing") + "/responses", json=BODY)
    assert resp.status_code == 404 and "at-missing" in resp.json()["error"]["message"]
    assert list(store.iter_spans()) == []
