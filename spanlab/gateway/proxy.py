"""The request handlers: forward to the engine, answer the agent, hand spans to the writer.

A call is attributed by its URL (``/rollout/{rid}/attempt/{aid}/v1/...``) or by the headers
``x-spanlab-rollout-id`` + ``x-spanlab-attempt-id``; with neither it is forwarded and recorded as
unattributed. A multi-agent attempt adds the role (``.../attempt/{aid}/agent/{name}/v1/...`` or
``x-spanlab-agent``), recorded as ``attributes.agent``. The attempt is checked against the store
once (then cached), so a typo gets a 404 before any tokens are spent instead of a span the store would later reject.

What the agent sees: the engine's own status and body (minus the fields the gateway added), 502
when the engine cannot be reached, 504 when it does not answer in time; every one of those calls
is recorded, failures as ``status="error"`` spans with ``attributes.error``. Only requests that
cannot be forwarded at all (invalid JSON, unknown attempt, a model no engine serves) get a 4xx without a span.

With several engines (``upstream_urls``) each call goes to the engine :mod:`.routing` pins its attempt to;
the span records which (``attributes.replica``) and the weights version it served (``attributes.policy_version``).
With ``policies`` each role's calls go to its policy's LoRA adapter (:mod:`.policy_routing`); the span records the
policy (``attributes.policy``) and the adapter version (``policy_version``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Route

from spanlab.gateway.attribution import AttemptChecker, requested_agent, requested_attribution
from spanlab.gateway.config import GatewayConfig
from spanlab.gateway.messages import MessagesRoute
from spanlab.gateway.outcomes import SPAN_IDS_HEADER, CallOutcomes, error_response
from spanlab.gateway.policy_routing import PolicyRoute, PolicyRouter
from spanlab.gateway.protocol import (
    ENDPOINT_PATHS,
    BadRequestError,
    Endpoint,
    check_model,
    dumps,
    error_body,
    loads,
    needs_rewrite,
    parse_request,
    prepare_upstream,
    strip_for_agent,
)
from spanlab.gateway.recording import CallContext, RouteInfo, spans_from_record
from spanlab.gateway.records import StreamAccumulator, record_from_response
from spanlab.gateway.responses import ResponsesRoute
from spanlab.gateway.routing import Router
from spanlab.gateway.tito import TitoMode
from spanlab.gateway.upstream import UpstreamClient, UpstreamError
from spanlab.gateway.writer import SpanJob, SpanWriter
from spanlab.store.base import StoreAPI

logger = logging.getLogger(__name__)

ROLLOUT_PREFIX = "/rollout/{rollout_id}/attempt/{attempt_id}"
AGENT_PREFIX = ROLLOUT_PREFIX + "/agent/{agent}"
_FORWARDED_HEADERS = ("authorization",)
MAX_FLUSH_WAIT_S = 600.0
# Stream failures the agent has not been told about yet (an in-stream vLLM error event already reached it).
_GATEWAY_STREAM_ERRORS = frozenset({"upstream_timeout", "upstream_stream_broken", "upstream_stream_truncated"})


class Gateway:
    """Handlers of one gateway app; owns the upstream HTTP client and the span writer."""

    def __init__(self, store: StoreAPI, config: GatewayConfig) -> None:
        self.store = store
        self.config = config
        self.writer = SpanWriter(
            store,
            flush_interval_s=config.flush_interval_s,
            max_batch=config.max_batch_spans,
            fallback_path=config.fallback_path,
        )
        self.outcomes = CallOutcomes(self.writer, config.close_timeout_s)
        self.router = Router([UpstreamClient(config, url) for url in config.upstreams],
                             max_pins=config.attempt_cache_size)
        self.policies = None if config.policies is None else PolicyRouter(config.policies)
        self.upstream = self.router.clients[0]  # the first engine (``/v1/models`` and TITO checks ask it)
        self._prober: asyncio.Task[None] | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.attempts = AttemptChecker(store, config.attempt_cache_size)
        # TITO: loads and checks the served model's tokenizer now, so a refusal fails create_app, not a call.
        self.tito = TitoMode.load(config) if config.tito else None
        self._rng = random.Random()  # seeded from os.urandom; span IDs need uniqueness, not secrecy

    def _span_id(self) -> str:
        """``sp-`` + 16 hex digits like ``types.new_id``, without a uuid4 syscall on the hot path."""
        return f"sp-{self._rng.getrandbits(64):016x}"

    # --- lifecycle -------------------------------------------------------------------------------
    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()  # the serving loop: the engine clients live on it
        self.writer.start()
        for client in self.router.clients:
            await client.start()
        if len(self.router.clients) > 1 and self.config.health_interval_s > 0:
            self._prober = asyncio.create_task(self._probe_forever(), name="spanlab-gateway-health")

    async def stop(self) -> None:
        if self._prober is not None:
            self._prober.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._prober
        for client in self.router.clients:
            await client.close()
        await anyio.to_thread.run_sync(self.writer.close, self.config.close_timeout_s)

    async def _probe_forever(self) -> None:
        while True:
            await asyncio.sleep(self.config.health_interval_s)
            await self.router.probe()

    def routes(self) -> list[BaseRoute]:
        """Generation routes first: Starlette tries routes in order, and they take nearly all traffic."""
        routes: list[BaseRoute] = [
            Route(prefix + path, functools.partial(self.generate, endpoint), methods=["POST"])
            for prefix in (AGENT_PREFIX, ROLLOUT_PREFIX, "")
            for endpoint, path in ENDPOINT_PATHS.items()
        ]
        responses = ResponsesRoute(self.forward, self._span_id)
        routes += [Route(prefix + "/v1/responses", responses.create, methods=["POST"])
                   for prefix in (AGENT_PREFIX, ROLLOUT_PREFIX, "")]
        messages = MessagesRoute(self.forward, self._span_id, self.upstream)
        routes += [Route(prefix + "/v1/messages", messages.create, methods=["POST"])
                   for prefix in (AGENT_PREFIX, ROLLOUT_PREFIX, "")]
        routes += [Route(prefix + "/v1/models", self.models, methods=["GET"])
                   for prefix in (AGENT_PREFIX, ROLLOUT_PREFIX, "")]
        routes += [
            Route("/health", self.health, methods=["GET"]),
            Route("/spanlab/flush", self.flush, methods=["POST"]),
        ]
        return routes

    # --- small routes ----------------------------------------------------------------------------
    async def health(self, request: Request) -> Response:
        w = self.writer
        return JSONResponse(
            {
                "status": "ok",
                "upstream": self.config.upstream_base_url,
                "upstreams": self.router.state(),
                "spans": {
                    "pending": w.pending,
                    "written": w.written,
                    "given_up": w.given_up,
                    "write_failures": w.write_failures,
                    "write_ms": w.write_ms(),
                },
                "tito": None if self.tito is None else {"sessions": len(self.tito.sessions)},
            }
        )

    async def flush(self, request: Request) -> Response:
        """Wait until every span recorded so far is in the store (runners call it before scoring)."""
        try:
            timeout = float(request.query_params.get("timeout", "30"))
        except ValueError:
            timeout = -1.0
        if not 0 <= timeout <= MAX_FLUSH_WAIT_S:  # NaN included
            return error_response(400, f"timeout must be a number of seconds from 0 to {MAX_FLUSH_WAIT_S:g}",
                                  "invalid_timeout")
        done = await anyio.to_thread.run_sync(self.writer.flush, timeout)
        return JSONResponse({"flushed": done, "pending": self.writer.pending}, status_code=200 if done else 504)

    async def models(self, request: Request) -> Response:
        try:
            client = self.router.pick(None)
            resp = await client.send("GET", "/v1/models", headers=self._upstream_headers(request))
            content = await client.read(resp)
        except UpstreamError as exc:
            return error_response(exc.status_code, str(exc), exc.code, "upstream_error")
        return Response(content, resp.status, media_type=resp.headers.get("content-type"))

    # --- generation ------------------------------------------------------------------------------
    async def generate(self, endpoint: Endpoint, request: Request) -> Response:
        start = time.time()
        try:
            body = self._parse_body(await request.body())
        except BadRequestError as exc:
            logger.warning("rejected %s %s: %s", request.method, request.url.path, exc)
            return error_response(exc.status_code, str(exc), exc.code)
        return await self.forward(endpoint, body, request, start)

    async def forward(self, endpoint: Endpoint, body: dict[str, Any], request: Request, start: float,
                      route: RouteInfo | None = None) -> Response:
        """Serve one parsed generation request; ``route``: the API the agent spoke, when a handler translated it
        (e.g. :mod:`.responses` hands its requests in as chat)."""
        try:
            check_model(body, self.config.served_models)
            agent = requested_agent(request.path_params, request.headers)
            policy = None if self.policies is None else self.policies.route(agent)
            upstream_body, asked = prepare_upstream(endpoint, body)
            rollout_id, attempt_id = requested_attribution(request.path_params, request.headers)
            if rollout_id is not None and attempt_id is not None:
                await self.attempts.check(rollout_id, attempt_id)
                if "seed" not in body and (seed := self.attempts.next_call_seed(attempt_id)) is not None:
                    body = {**body, "seed": seed}  # recorded with the call's other request parameters
                    upstream_body["seed"] = seed
        except BadRequestError as exc:
            logger.warning("rejected %s %s: %s", request.method, request.url.path, exc)
            return error_response(exc.status_code, str(exc), exc.code)
        ctx = CallContext(
            endpoint=endpoint,
            rollout_id=rollout_id,
            attempt_id=attempt_id,
            agent=agent,
            body=body,
            asked=asked,
            span_ids=[self._span_id() for _ in range(asked.n)],
            start_time=start,
            route=route,
        )
        headers = self._upstream_headers(request)
        try:
            ctx.upstream = self.router.pick(None if attempt_id is None else f"{rollout_id}/{attempt_id}")
        except UpstreamError as exc:
            ctx.upstream = self.router.pinned(f"{rollout_id}/{attempt_id}")
            return self.outcomes.fail(ctx, exc.status_code, exc.code, str(exc))
        ctx.policy_version = self.router.versions[ctx.upstream.base_url]
        if policy is not None and (refused := await self._route_to_policy(ctx, policy, upstream_body)) is not None:
            return refused
        if self.tito is not None and endpoint == "chat":
            served = await self.tito.serve(self.outcomes, ctx, headers)
            if served is not None:
                return served
        content = dumps(upstream_body)
        path = ENDPOINT_PATHS[endpoint]
        client = ctx.upstream
        try:
            upstream = await client.send("POST", path, body=content, headers=headers)
            if upstream.status >= 300:
                return self.outcomes.upstream_error(ctx, upstream, await client.read(upstream))
            if asked.stream:
                return StreamingResponse(
                    self._relay(ctx, upstream),
                    media_type="text/event-stream",
                    headers={SPAN_IDS_HEADER: ",".join(ctx.span_ids)},
                )
            raw = await client.read(upstream)
        except UpstreamError as exc:
            return self.outcomes.fail(ctx, exc.status_code, exc.code, str(exc))
        return await self._unary(ctx, upstream.status, raw)

    async def _route_to_policy(self, ctx: CallContext, route: PolicyRoute, upstream_body: dict[str, Any]
                               ) -> Response | None:
        """Send the call to the model its role's policy names, whatever ``model`` the agent asked for (None);
        the error answer when the engine cannot say which model is its base."""
        assert self.policies is not None and ctx.upstream is not None
        ctx.policy = route.policy
        if route.version is not None:
            ctx.policy_version = route.version
        try:
            model = await self.policies.served_model(route, ctx.upstream)
        except UpstreamError as exc:
            return self.outcomes.fail(ctx, exc.status_code, exc.code, str(exc))
        except ValueError as exc:
            return self.outcomes.fail(ctx, 502, "upstream_bad_response", str(exc))
        asked = ctx.body.get("model")
        if asked != model:
            ctx.requested_model = asked if isinstance(asked, str) or asked is None else repr(asked)[:200]
            ctx.body = {**ctx.body, "model": model}
            upstream_body["model"] = model
        return None

    async def _unary(self, ctx: CallContext, status: int, raw: bytes) -> Response:
        end = time.time()
        try:
            data = loads(raw)
        except ValueError:
            data = None
        if not isinstance(data, dict):
            return self.outcomes.fail(ctx, 502, "upstream_bad_response",
                                      "upstream sent a body that is not a JSON object")
        record = record_from_response(ctx.endpoint, data)  # before stripping: it keeps the IDs
        if (refused := await self.outcomes.record(lambda: spans_from_record(ctx, record, end_time=end))) is not None:
            return refused
        content = dumps(strip_for_agent(data, ctx.endpoint, ctx.asked)) if needs_rewrite(ctx.asked) else raw
        return Response(
            content, status, media_type="application/json", headers={SPAN_IDS_HEADER: ",".join(ctx.span_ids)}
        )

    async def _relay(self, ctx: CallContext, upstream: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
        """Pass SSE events on as they arrive; record one complete span set when the stream ends."""
        acc = StreamAccumulator(ctx.endpoint)
        rewrite = needs_rewrite(ctx.asked)
        error: dict[str, Any] | None = None
        saw_done = recorded = False
        try:
            assert ctx.upstream is not None
            async for lines in ctx.upstream.line_batches(upstream):
                out: list[bytes] = []
                for line in lines:
                    if not line.startswith(b"data:"):
                        continue  # blank separators and comments: events are re-framed below
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        saw_done = True
                    elif (chunk := self._chunk(data)) is not None:
                        acc.add(chunk)
                        if rewrite:
                            data = dumps(strip_for_agent(chunk, ctx.endpoint, ctx.asked))
                    out += (b"data: ", data, b"\n\n")
                if saw_done and not recorded:
                    # Stored before the agent sees [DONE]: once it has, it may end its attempt.
                    recorded = True
                    job, stream_error = self._stream_spans(ctx, acc, None)
                    if stream_error is not None:
                        self.writer.submit(job)
                    elif await self.outcomes.record(job) is not None:
                        failed = error_body("the span store could not take this call's spans; the call is not "
                                            "recorded", code="store_unavailable", err_type="store_error")
                        out[out.index(b"[DONE]")] = dumps(failed)
                if out:
                    yield b"".join(out)
        except UpstreamError as exc:
            error = {
                "type": "upstream_timeout" if exc.code == "upstream_timeout" else "upstream_stream_broken",
                "message": str(exc),
            }
        except BaseException:  # cancelled: the agent went away; record what was generated, then re-raise
            error = {"type": "client_disconnected", "message": "the agent closed the stream before it ended"}
            raise
        finally:
            if saw_done:
                upstream.release()  # keep the connection for the next call
            else:
                upstream.close()  # abandoned midway: closing tells vLLM to stop generating
            if error is None and not saw_done:
                error = {"type": "upstream_stream_truncated", "message": "the stream ended without [DONE]"}
            if not recorded:
                job, error = self._stream_spans(ctx, acc, error)
                self.writer.submit(job)
        if error is not None and error["type"] in _GATEWAY_STREAM_ERRORS:
            yield (
                b"data: " + dumps(error_body(error["message"], code=error["type"], err_type="upstream_error")) + b"\n\n"
            )

    @staticmethod
    def _stream_spans(
        ctx: CallContext, acc: StreamAccumulator, error: dict[str, Any] | None
    ) -> tuple[SpanJob, dict[str, Any] | None]:
        """The span set of a finished stream, and the error it is recorded with (None: a completed call)."""
        if error is None and acc.error is not None:
            error = {"type": "upstream_stream_error", "message": str(acc.error.get("message")), "body": acc.error}
        record, end = acc.result(), time.time()
        return (lambda: spans_from_record(ctx, record, end_time=end, error=error)), error

    @staticmethod
    def _chunk(data: bytes) -> dict[str, Any] | None:
        """An SSE event's JSON object; None (passed on unrecorded) for anything else."""
        try:
            chunk = loads(data)
        except ValueError:
            chunk = None
        if not isinstance(chunk, dict):
            logger.warning("upstream sent an SSE event that is not a JSON object; passed on unrecorded: %.200r", data)
            return None
        return chunk

    # --- request checks --------------------------------------------------------------------------
    @staticmethod
    def _parse_body(raw: bytes) -> dict[str, Any]:
        return parse_request(raw)

    def _upstream_headers(self, request: Request) -> dict[str, str]:
        headers = {"content-type": "application/json"}
        if self.config.token is not None:  # the agents' Authorization carries the gateway's own token
            return headers
        for name in _FORWARDED_HEADERS:
            if name in request.headers:
                headers[name] = request.headers[name]
        return headers
