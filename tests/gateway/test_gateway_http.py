"""Gateway behaviour that needs no engine: bad requests, an unreachable or silent upstream.

Real HTTP throughout: the gateway runs under uvicorn on loopback; the "engines" are a closed port and
a socket that accepts connections but never answers (both real network conditions, not mocks).
"""

from __future__ import annotations

import socket
from collections.abc import Iterator

import httpx
import pytest

from spanlab.gateway import ATTEMPT_HEADER, ROLLOUT_HEADER, GatewayServer
from spanlab.gateway.attribution import AGENT_HEADER
from spanlab.store import SpanStore
from spanlab.types import Attempt, Rollout

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


@pytest.fixture
def silent_upstream() -> Iterator[str]:
    """Accepts TCP connections (the kernel's backlog does) but never reads or answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(16)
        yield f"http://127.0.0.1:{s.getsockname()[1]}"


@pytest.fixture
def dead_gateway(store: SpanStore, closed_port: int) -> Iterator[GatewayServer]:
    with GatewayServer(store, f"http://127.0.0.1:{closed_port}/v1") as gw:
        yield gw


def _errors(store: SpanStore) -> list:
    return [s for s in store.iter_spans() if s.status == "error"]


@pytest.mark.parametrize("stream", [False, True])
def test_unreachable_upstream_is_502_and_an_error_span(
    dead_gateway: GatewayServer, store: SpanStore, started: tuple[Rollout, Attempt], stream: bool
) -> None:
    rollout, attempt = started
    url = dead_gateway.base_url(rollout.rollout_id, attempt.attempt_id) + "/chat/completions"
    resp = httpx.post(url, json={**CHAT, "stream": stream})
    assert resp.status_code == 502
    assert resp.json()["error"]["code"] == "upstream_unreachable"
    assert dead_gateway.flush(10)
    (span,) = _errors(store)
    assert (span.rollout_id, span.attempt_id) == (rollout.rollout_id, attempt.attempt_id)
    assert span.attributes["error"]["type"] == "upstream_unreachable"
    assert span.llm.request_messages == CHAT["messages"] and span.llm.response_token_ids == []
    assert span.span_id == resp.headers.get("x-spanlab-span-ids", span.span_id)


def test_silent_upstream_is_504_after_the_timeout(store: SpanStore, silent_upstream: str) -> None:
    with GatewayServer(store, silent_upstream, request_timeout_s=0.3) as gw:
        resp = httpx.post(gw.base_url() + "/chat/completions", json=CHAT, timeout=10)
        assert resp.status_code == 504
        assert "0.3s" in resp.json()["error"]["message"]
        gw.flush(10)
    (span,) = _errors(store)
    assert span.rollout_id is None and span.attributes["error"]["type"] == "upstream_timeout"


@pytest.mark.parametrize(
    ("body", "status", "needle"),
    [
        (b"{not json", 400, "not valid JSON"),
        (b"[1, 2]", 400, "JSON object"),
        (b'{"model": "m"}', 400, "messages"),
        (b'{"model": "m", "messages": [], "n": -1}', 400, "`n`"),
    ],
)
def test_bad_bodies_are_400_with_a_clear_message_and_no_span(
    dead_gateway: GatewayServer, store: SpanStore, body: bytes, status: int, needle: str
) -> None:
    resp = httpx.post(dead_gateway.base_url() + "/chat/completions", content=body)
    assert resp.status_code == status and needle in resp.json()["error"]["message"]
    dead_gateway.flush(10)
    assert list(store.iter_spans()) == []


def test_unknown_or_mismatched_attempts_are_rejected_before_forwarding(
    dead_gateway: GatewayServer, store: SpanStore, started: tuple[Rollout, Attempt]
) -> None:
    rollout, attempt = started
    unknown = httpx.post(dead_gateway.base_url(rollout.rollout_id, "at-missing") + "/chat/completions", json=CHAT)
    assert unknown.status_code == 404 and "unknown attempt 'at-missing'" in unknown.json()["error"]["message"]
    wrong = httpx.post(dead_gateway.base_url("ro-other", attempt.attempt_id) + "/chat/completions", json=CHAT)
    assert wrong.status_code == 404 and f"belongs to rollout {rollout.rollout_id!r}" in wrong.json()["error"]["message"]
    half = httpx.post(dead_gateway.base_url() + "/chat/completions", json=CHAT, headers={ROLLOUT_HEADER: "r"})
    assert half.status_code == 400 and ATTEMPT_HEADER in half.json()["error"]["message"]
    clash = httpx.post(
        dead_gateway.base_url(rollout.rollout_id, attempt.attempt_id) + "/chat/completions",
        json=CHAT,
        headers={ROLLOUT_HEADER: "ro-x", ATTEMPT_HEADER: "at-x"},
    )
    assert clash.status_code == 400
    dead_gateway.flush(10)
    assert list(store.iter_spans()) == []


def test_a_model_the_engines_do_not_serve_is_the_gateways_404_naming_what_they_serve(
    store: SpanStore, closed_port: int, started: tuple[Rollout, Attempt]
) -> None:
    """``spanlab serve`` tells the gateway the served names: a client using another (the README's default name
    against a trained folder) gets an OpenAI-shaped 404 listing them, on every API, before anything is forwarded."""
    import openai

    rollout, attempt = started
    with GatewayServer(store, f"http://127.0.0.1:{closed_port}/v1", served_models=("calc-grpo",)) as gw:
        for base in (gw.base_url(), gw.base_url(rollout.rollout_id, attempt.attempt_id)):
            for path, body in (("/chat/completions", CHAT), ("/completions", {"model": "m", "prompt": "hi"}),
                               ("/responses", {"model": "m", "input": "hi"})):
                resp = httpx.post(base + path, json={**body, "model": "smollm2-135m-instruct"})
                assert resp.status_code == 404, (path, resp.text)
                error = resp.json()["error"]
                assert error["code"] == "model_not_found", error
                assert error["message"] == ("model 'smollm2-135m-instruct' is not served here; this gateway "
                                            "serves 'calc-grpo'")
        client = openai.OpenAI(base_url=gw.base_url(), api_key="none", max_retries=0)
        with pytest.raises(openai.NotFoundError, match="this gateway serves 'calc-grpo'"):
            client.chat.completions.create(model="smollm2-135m-instruct", messages=CHAT["messages"])
        gw.flush(10)
        assert list(store.iter_spans()) == []  # refused before forwarding: nothing to record
        # the served name (and a request naming no model) goes on to the engine: here a closed port, so 502
        assert httpx.post(gw.base_url() + "/chat/completions", json={**CHAT, "model": "calc-grpo"}).status_code == 502
        no_model = {k: v for k, v in CHAT.items() if k != "model"}
        assert httpx.post(gw.base_url() + "/chat/completions", json=no_model).status_code == 502


def test_header_attribution_reaches_the_span(
    dead_gateway: GatewayServer, store: SpanStore, started: tuple[Rollout, Attempt]
) -> None:
    rollout, attempt = started
    resp = httpx.post(
        dead_gateway.base_url() + "/chat/completions",
        json=CHAT,
        headers={ROLLOUT_HEADER: rollout.rollout_id, ATTEMPT_HEADER: attempt.attempt_id},
    )
    assert resp.status_code == 502
    dead_gateway.flush(10)
    (span,) = _errors(store)
    assert span.attempt_id == attempt.attempt_id


def test_agent_roles_are_recorded_from_the_url_or_the_header(
    dead_gateway: GatewayServer, store: SpanStore, started: tuple[Rollout, Attempt]
) -> None:
    rollout, attempt = started
    ids = (rollout.rollout_id, attempt.attempt_id)
    by_url = httpx.post(dead_gateway.base_url(*ids, agent="writer") + "/chat/completions", json=CHAT)
    by_header = httpx.post(dead_gateway.base_url(*ids) + "/chat/completions", json=CHAT,
                           headers={AGENT_HEADER: "checker"})
    assert by_url.status_code == by_header.status_code == 502
    clash = httpx.post(dead_gateway.base_url(*ids, agent="writer") + "/chat/completions", json=CHAT,
                       headers={AGENT_HEADER: "checker"})
    assert clash.status_code == 400 and "differs" in clash.json()["error"]["message"]
    bad = httpx.post(dead_gateway.base_url(*ids) + "/chat/completions", json=CHAT, headers={AGENT_HEADER: "a b"})
    assert bad.status_code == 400 and "bad agent name 'a b'" in bad.json()["error"]["message"]
    dead_gateway.flush(10)
    assert sorted(s.attributes.get("agent") for s in _errors(store)) == ["checker", "writer"]
    (row,) = store.query("SELECT agent FROM llm_calls WHERE agent = 'writer'").to_pylist()
    assert row == {"agent": "writer"}


def test_health_flush_and_unknown_routes(dead_gateway: GatewayServer) -> None:
    health = httpx.get(dead_gateway.url + "/health").json()
    assert health["status"] == "ok" and health["spans"]["pending"] == 0
    assert httpx.post(dead_gateway.url + "/spanlab/flush").json()["flushed"] is True
    missing = httpx.post(dead_gateway.url + "/v1/embeddings", json={})
    assert missing.status_code == 404 and "/v1/chat/completions" in missing.json()["error"]["message"]
    assert httpx.get(dead_gateway.base_url() + "/models").status_code == 502
