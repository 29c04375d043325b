"""One size limit for a recorded call (issue 65, item 1): the gateway takes no body larger than the store's largest
record (413 at the door, before the engine is called), and a record a little over it from a body under it is
stored cut and marked (``attributes.truncated``), never answered 503 and lost.

Real HTTP on loopback, on both store kinds (the store server tells its client its limit). The no-engine tests
point the gateway at a closed port: a call forwarded there would be a 502 and an error span, so a 413 with no span
shows nothing was forwarded. The ``vllm`` tests send the 200 and 400 cases to the session's real vLLM.
"""

from __future__ import annotations

import json
import logging
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from spanlab.errors import ConfigError
from spanlab.gateway import GatewayServer
from spanlab.gateway.oversize import fit_span, json_bytes
from spanlab.store import SpanStore, StoreAPI, StoreClient
from spanlab.store.schema import MAX_JSON_BYTES
from spanlab.store.server import create_store_app
from spanlab.threaded_server import ThreadedServer
from spanlab.types import LLMCall, Span
from tests.gateway.helpers import Upstream
from tests.stores import TOKEN

SMALL = 128 * 1024  # the small stores' record limit: the gateway's door follows it
N_EXPANDING = 16_000  # numbers sent as ``1e5`` (4 bytes each), stored as ``100000.0`` (9 bytes each)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _store(kind: str, tmp_path: Path, max_json_bytes: int = MAX_JSON_BYTES) -> Iterator[StoreAPI]:
    if kind == "duckdb":
        with SpanStore(":memory:", max_json_bytes=max_json_bytes) as store:
            yield store
        return
    with SpanStore(tmp_path / "served.duckdb", max_json_bytes=max_json_bytes) as served, \
            ThreadedServer(create_store_app(served, token=TOKEN), name="store server") as server, \
            StoreClient(server.url, token=TOKEN, retry_for_s=5) as client:
        yield client


@pytest.fixture(params=["duckdb", "http"])
def small_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreAPI]:
    """A store whose record limit is ``SMALL``, of each kind."""
    yield from _store(request.param, tmp_path, SMALL)


def _attempt(store: StoreAPI) -> tuple[str, str]:
    store.enqueue_one({"q": 1})
    got = store.dequeue(worker_id="w")
    assert got is not None
    return got[0].rollout_id, got[1].attempt_id


def _expanding(body: dict) -> bytes:
    """``body`` with ``"x": [1e5, ...]`` as the agent wrote it: a body under the limit whose record is over it."""
    return json.dumps(body)[:-1].encode() + b', "x": [' + b",".join([b"1e5"] * N_EXPANDING) + b"]}"


def _no_lost_line(caplog: pytest.LogCaptureFixture) -> None:
    assert not [r for r in caplog.records if "LOST" in r.getMessage()], caplog.text[-2000:]


@pytest.mark.parametrize("body", [
    {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "unknown": "x" * 20_000_000},
    {"messages": [{"role": "user", "content": "hi " * 7_000_000}], "max_tokens": 2},
], ids=["20MB-unknown-field", "20MB-prompt"])
@pytest.mark.parametrize("kind", ["duckdb", "http"])
def test_a_body_whose_record_the_store_would_refuse_is_413_at_the_door(
    kind: str, body: dict, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    for store in _store(kind, tmp_path):
        rid, aid = _attempt(store)
        with GatewayServer(store, f"http://127.0.0.1:{_closed_port()}") as gw:
            resp = httpx.post(gw.base_url(rid, aid) + "/chat/completions", json={"model": "m", **body}, timeout=60)
            assert resp.status_code == 413, resp.text[:300]
            assert f"{MAX_JSON_BYTES}-byte limit" in resp.json()["error"]["message"]
            assert "span store's largest record" in resp.json()["error"]["message"]
            assert gw.flush(10) and list(store.iter_spans(attempt_ids=[aid])) == []  # not forwarded: no 502 span
    _no_lost_line(caplog)


def test_a_body_limit_over_the_stores_is_refused(store: SpanStore) -> None:
    with pytest.raises(ConfigError, match=r"max_body_bytes=33554432 is over the span store's record limit"):
        GatewayServer(store, "http://127.0.0.1:9", max_body_bytes=32 << 20)
    with GatewayServer(store, "http://127.0.0.1:9", max_body_bytes=1 << 20) as gw:  # lower is fine
        assert httpx.post(gw.base_url() + "/chat/completions", content=b"x" * (2 << 20)).status_code == 413


def test_the_door_follows_a_stores_own_limit(small_store: StoreAPI) -> None:
    assert small_store.max_json_bytes == SMALL  # the store server's client asked its /health
    with GatewayServer(small_store, f"http://127.0.0.1:{_closed_port()}") as gw:
        resp = httpx.post(gw.base_url() + "/chat/completions", content=b"{" + b" " * SMALL + b"}")
    assert resp.status_code == 413 and f"{SMALL}-byte limit" in resp.text


def test_an_engine_failure_whose_record_is_over_the_limit_is_stored_cut(
    small_store: StoreAPI, caplog: pytest.LogCaptureFixture
) -> None:
    """The closed port is the engine's failure (502): its error span carries the expanding numbers."""
    rid, aid = _attempt(small_store)
    body = _expanding({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    assert len(body) < SMALL
    with caplog.at_level(logging.WARNING), GatewayServer(small_store, f"http://127.0.0.1:{_closed_port()}") as gw:
        resp = httpx.post(gw.base_url(rid, aid) + "/chat/completions", content=body, timeout=60)
        assert resp.status_code == 502 and gw.flush(30)
    (span,) = small_store.iter_spans(attempt_ids=[aid])
    _check_cut(span, "error")
    _no_lost_line(caplog)


def _check_cut(span: Span, status: str) -> None:
    assert span.status == status
    cut = span.attributes["truncated"]
    assert list(cut) == ["attributes"] and cut["attributes"]["json_bytes"] > SMALL, cut
    assert "4096" in cut["attributes"]["cut"]
    assert span.attributes["request_params"]["x"] == [1e5] * 4096  # the head kept, the rest cut
    assert span.attributes["endpoint"] == "/v1/chat/completions"  # the gateway's own entries stay
    assert span.llm is not None and span.llm.request_messages == [{"role": "user", "content": "hi"}]


def test_fit_span_cuts_only_the_columns_over_the_limit() -> None:
    llm = LLMCall(model="m", request_messages=[{"role": "user", "content": "y" * 300_000}, {"role": "user"}],
                  response_message={"role": "assistant", "content": "ok"},
                  prompt_token_ids=list(range(50)), response_token_ids=[1, 2])
    span = Span(name="chat.completions", kind="llm_call", start_time=1.0, end_time=2.0, status="ok",
                attributes={"endpoint": "/v1/chat/completions", "many": {str(i): i for i in range(100_000)}}, llm=llm)
    assert fit_span(span, 10 << 20) is None  # nothing over: nothing to cut
    fitted = fit_span(span, 100_000)
    assert fitted is not None and fitted.llm is not None
    for column, value in [("attributes", fitted.attributes), ("request_messages", fitted.llm.request_messages)]:
        assert json_bytes(value) <= 100_000, column
    message = fitted.llm.request_messages[0]["content"]
    assert message.startswith("y" * 65_536) and message.endswith(f"…[{300_000 - 65_536} characters cut]")
    assert len(fitted.attributes["many"]) == 4096 and fitted.attributes["endpoint"] == "/v1/chat/completions"
    assert set(fitted.attributes["truncated"]) == {"request_messages", "attributes"}
    assert fitted.llm.prompt_token_ids == list(range(50)) and fitted.llm.response_message == llm.response_message
    assert fitted.span_id == span.span_id
    assert fit_span(span.model_copy(update={"attributes": {"big": "z" * 200_000}}), 1_500) is not None


@pytest.mark.vllm
@pytest.mark.parametrize("prompt, status, span_status", [("hi", 200, "ok"), ("hi " * 7_000, 400, "error")],
                         ids=["generated", "refused-by-vllm"])
def test_a_real_engines_answer_whose_record_is_over_the_limit_is_stored_cut(
    small_store: StoreAPI, upstream: Upstream, caplog: pytest.LogCaptureFixture, prompt: str, status: int,
    span_status: str
) -> None:
    """vLLM generates (200, stored before the answer) or refuses a prompt over its context (400, recorded after):
    either way the record is stored, cut, and the agent gets vLLM's answer, not a 503."""
    rid, aid = _attempt(small_store)
    body = _expanding({"model": upstream.model, "messages": [{"role": "user", "content": prompt}], "max_tokens": 2})
    assert len(body) < SMALL
    with caplog.at_level(logging.WARNING), GatewayServer(small_store, upstream.base_url) as gw:
        resp = httpx.post(gw.base_url(rid, aid) + "/chat/completions", content=body, timeout=120)
        assert resp.status_code == status, resp.text[:500]
        assert gw.flush(30)
    (span,) = small_store.iter_spans(attempt_ids=[aid])
    assert span.span_id in resp.headers["x-spanlab-span-ids"]
    if status == 200:
        assert span.llm is not None and span.llm.response_token_ids and span.llm.prompt_token_ids
        assert span.llm.request_messages == [{"role": "user", "content": "hi"}]
        cut = span.attributes["truncated"]
        assert list(cut) == ["attributes"] and span.attributes["request_params"]["x"] == [1e5] * 4096
    else:
        assert span.attributes["upstream_status"] == 400 and "context" in span.attributes["error"]["message"]
        assert span.attributes["request_params"]["x"] == [1e5] * 4096
    assert span.status == span_status
    _no_lost_line(caplog)
