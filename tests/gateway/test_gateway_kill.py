"""A gateway killed right after answering an agent loses none of the calls the agent got an answer to.

The agent may end its attempt ``succeeded`` as soon as it has its last answer; if the gateway only queued the
call's span and died before writing it, the attempt would be recorded complete without that call. Here a
real gateway process (writing through a store server process) is SIGKILLed the moment the agent has its
answer, with a writer interval long enough that a queued span would still be waiting: the span is stored.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from spanlab.threaded_server import ThreadedServer
from tests.stores import TOKEN, ServerProcess, free_port


def _engine_app() -> Starlette:
    """The smallest vLLM-shaped chat engine: exact token IDs, as the gateway asks for them."""
    ids = [11, 12, 13]

    async def chat(request: Request) -> Response:
        body = json.loads(await request.body())
        if body.get("stream"):
            chunks = [{"id": "c", "object": "chat.completion.chunk", "model": "m", "prompt_token_ids": [1, 2],
                       "choices": [{"index": 0, "delta": {"role": "assistant", "content": "hi"},
                                    "token_ids": ids, "finish_reason": "stop"}]}]
            events = [f"data: {json.dumps(c)}\n\n".encode() for c in chunks] + [b"data: [DONE]\n\n"]

            async def gen() -> Iterator[bytes]:
                for e in events:
                    yield e
            return StreamingResponse(gen(), media_type="text/event-stream")
        return JSONResponse({"id": "c", "object": "chat.completion", "model": "m", "prompt_token_ids": [1, 2],
                             "choices": [{"index": 0, "finish_reason": "stop", "token_ids": ids,
                                          "message": {"role": "assistant", "content": "hi"}}],
                             "usage": {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5}})

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": "m", "object": "model"}]})

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"]), Route("/v1/models", models)])


@pytest.fixture
def engine() -> Iterator[str]:
    server = ThreadedServer(_engine_app(), name="engine").start()
    yield server.url
    server.stop()


def _gateway(engine: str, store_url: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "spanlab.gateway", "--upstream", engine, "--store-url", store_url,
                             "--store-token", TOKEN, "--port", str(port), "--flush-interval", "30",
                             "--log-level", "warning"], stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 60
    while time.time() < deadline:
        assert proc.poll() is None, proc.stderr.read()
        try:
            if httpx.get(f"{url}/health").is_success:
                return proc, url
        except httpx.TransportError:
            time.sleep(0.1)
    raise RuntimeError("gateway did not come up")


@pytest.mark.parametrize("stream", [False, True], ids=["unary", "stream"])
def test_a_gateway_killed_after_answering_loses_no_call(tmp_path: Path, engine: str, stream: bool) -> None:
    store_server = ServerProcess(tmp_path / "s.duckdb").start()
    store = store_server.client()
    try:
        store.enqueue_one({"q": 1})
        rollout, attempt = store.dequeue("w")
        gateway, url = _gateway(engine, store_server.url)
        try:
            base = f"{url}/rollout/{rollout.rollout_id}/attempt/{attempt.attempt_id}/v1"
            resp = httpx.post(f"{base}/chat/completions", timeout=30,
                              json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": stream})
            assert resp.status_code == 200, resp.text
            span_id = resp.headers["x-spanlab-span-ids"]
        finally:
            gateway.send_signal(signal.SIGKILL)  # the moment the agent has its answer
            gateway.wait(timeout=30)
        store.finish_attempt(attempt.attempt_id, "succeeded")  # what the agent's runner does next
        calls = store.spans_table(attempt_ids=[attempt.attempt_id], kinds=["llm_call"],
                                  columns=["span_id", "response_token_ids"]).to_pylist()
        assert calls == [{"span_id": span_id, "response_token_ids": [11, 12, 13]}]
    finally:
        store.close()
        store_server.stop()
