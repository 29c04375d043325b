"""Fuzz the recording gateway as fuzz_store_server.py fuzzes the store server, and count the answers >= 500.

The gateway is a plain Starlette app with no OpenAPI of its own, so :data:`GATEWAY_OPENAPI` describes the
routes agents call (chat, completions, responses, messages, attributed or not; models; health; flush) with the fields
the gateway itself reads. Each operation gets ``--examples`` schemathesis requests per generation mode, then
the hostile bodies (NaN, Infinity, deep nesting, lone surrogates, invalid UTF-8). The "engine" is a closed
port, so a request the gateway lets through answers 502 ``upstream_unreachable``: the right answer, not
counted. Leaves out: a live engine (its answers are vLLM's), streaming, TITO.

Run: python benchmarks/fuzz_gateway.py [--examples 100] [--seed 20]
The CI test (tests/gateway/test_gateway_fuzz.py) runs the same code with few examples per operation.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import schemathesis
from schemathesis import GenerationMode

from spanlab.gateway import GatewayServer
from spanlab.store import SpanStore
from spanlab.types import Rollout

logger = logging.getLogger("fuzz_gateway")


def _store_fuzzer() -> Any:
    """benchmarks/fuzz_store_server.py, whose loop, report and hostile bodies this run shares."""
    path = Path(__file__).with_name("fuzz_store_server.py")
    spec = importlib.util.spec_from_file_location("fuzz_store_server", path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules.setdefault(spec.name, module)  # type: ignore[union-attr]
    spec.loader.exec_module(sys.modules[spec.name])  # type: ignore[union-attr]
    return sys.modules[spec.name]


_MESSAGE = {"type": "object", "required": ["role", "content"], "properties": {
    "role": {"type": "string", "enum": ["system", "user", "assistant", "tool"]}, "content": {"type": "string"}}}
_SAMPLING = {"n": {"type": "integer"}, "temperature": {"type": "number"}, "max_tokens": {"type": "integer"},
             "logprobs": {"type": "boolean"}, "user": {"type": "string"}}
_BODIES = {
    "/v1/chat/completions": {"required": ["model", "messages"], "properties": {
        "model": {"type": "string"}, "messages": {"type": "array", "items": _MESSAGE}, **_SAMPLING}},
    "/v1/completions": {"required": ["model", "prompt"], "properties": {
        "model": {"type": "string"}, "prompt": {"type": "string"}, **_SAMPLING}},
    "/v1/responses": {"required": ["model", "input"], "properties": {
        "model": {"type": "string"}, "input": {"type": "string"}, "instructions": {"type": "string"},
        "max_output_tokens": {"type": "integer"}, "temperature": {"type": "number"}}},
    "/v1/messages": {"required": ["model", "messages", "max_tokens"], "properties": {  # booleans strict (issue 65)
        "model": {"type": "string"}, "max_tokens": {"type": "integer"}, "system": {"type": "string"},
        "messages": {"type": "array", "items": {"type": "object", "required": ["role", "content"], "properties": {
            "role": {"type": "string", "enum": ["user", "assistant"]}, "content": {"type": "string"}}}},
        "stream": {"type": "boolean"}, "temperature": {"type": "number"},
        "tool_choice": {"type": "object", "properties": {"type": {"type": "string", "enum": ["auto", "any"]},
                                                         "disable_parallel_tool_use": {"type": "boolean"}}}}},
}
_PREFIX = "/rollout/{rollout_id}/attempt/{attempt_id}"
_IDS = [{"name": n, "in": "path", "required": True, "schema": {"type": "string"}} for n in ("rollout_id", "attempt_id")]
_OK = {"200": {"description": "the engine's answer"}}


def _post(path: str, with_ids: bool) -> dict[str, Any]:
    op: dict[str, Any] = {"requestBody": {"required": True, "content": {"application/json": {"schema": {
        "type": "object", **_BODIES[path]}}}}, "responses": _OK}
    return {"post": {**op, "parameters": _IDS}} if with_ids else {"post": op}


GATEWAY_OPENAPI: dict[str, Any] = {
    "openapi": "3.0.3", "info": {"title": "spanlab gateway (as agents call it)", "version": "1"},
    "paths": {
        **{path: _post(path, False) for path in _BODIES},
        **{_PREFIX + path: _post(path, True) for path in _BODIES},
        "/v1/models": {"get": {"responses": _OK}},
        "/health": {"get": {"responses": _OK}},
        "/spanlab/flush": {"post": {"parameters": [{"name": "timeout", "in": "query", "schema": {"type": "number"}}],
                                    "responses": _OK}},
    },
}


def unreachable_engine(response: Any) -> bool:
    """The gateway's answer when the engine cannot be reached: the right one here (``/v1/messages``: in Anthropic's
    shape, whose error has a type and a message but no code)."""
    try:
        error = response.json()["error"]
        reason = error["code"] if "code" in error else error["type"] == "api_error" and error["message"]
        return response.status_code in (502, 504) and "upstream" in reason
    except (ValueError, KeyError, TypeError, AttributeError):
        return False


@contextmanager
def fuzz_gateway() -> Iterator[str]:
    """A gateway on 127.0.0.1 in front of a closed port, over an in-memory store with one live attempt."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    with SpanStore(":memory:") as store:
        store.enqueue([Rollout(rollout_id="ro-0", input={"q": 1})])
        store.dequeue(worker_id="fuzz")
        with GatewayServer(store, f"http://127.0.0.1:{closed}", max_body_bytes=4 << 20,
                           request_timeout_s=5.0) as gw:
            yield gw.url


def fuzz(url: str, *, examples: int, seed: int, modes: tuple[GenerationMode, ...]) -> Any:
    schema = schemathesis.openapi.from_dict(GATEWAY_OPENAPI)
    return _store_fuzzer().fuzz(url, examples=examples, seed=seed, modes=modes, schema=schema,
                                expected=unreachable_engine)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=100, help="requests per operation and generation mode")
    ap.add_argument("--seed", type=int, default=20)
    ap.add_argument("--modes", default="positive,negative", help="schemathesis generation modes")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logger.setLevel(logging.INFO)
    modes = tuple(GenerationMode(m) for m in args.modes.split(","))
    with fuzz_gateway() as url:
        start = time.monotonic()
        report = fuzz(url, examples=args.examples, seed=args.seed, modes=modes)
        took = time.monotonic() - start
    logger.info("%d requests in %.0f s; status codes: %s", report.requests, took, dict(report.by_status))
    logger.info("%d answers >= 500 in %d causes", report.server_errors, len(report.errors))
    for cause, n in report.errors.most_common():
        logger.info("%6d  %s\n        e.g. %s", n, cause, report.examples[cause])


if __name__ == "__main__":
    main()
