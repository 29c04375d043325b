"""The store server: one process owns the DuckDB file and serves the store API over HTTP.

DuckDB lets one process write a file, so workers elsewhere reach the store through this server (with
``StoreClient``). Every route runs its store call in a thread, never on the event loop, and answers a write
after its commit. With a token, every request needs ``Authorization: Bearer <token>`` except the API's own
description (``/openapi.json``, ``/docs``), public on purpose: it ships in the package and holds no data.
``/sql`` runs one read-only SELECT under a time and byte limit on a small pool of its own
(:class:`~spanlab.sql_surface.SqlPool`), so it cannot starve the queue.

Run: spanlab store serve --db runs/spans.duckdb --port 8700 [--token T]
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
from collections.abc import AsyncIterator, Collection
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from spanlab import otel
from spanlab.errors import InvalidSpanError, NotFoundError, QueryError, StoreError
from spanlab.guards import add_guards, policy_app
from spanlab.sql_surface import SURFACE_MAX_BYTES, SURFACE_TIMEOUT_S, QueryBusyError, QueryLimits, SqlPool, rows
from spanlab.store import wire
from spanlab.store.base import RolloutSummary
from spanlab.store.duckdb_store import SpanStore
from spanlab.store.spans import table_to_spans
from spanlab.types import MAX_INT32, FinishedAttemptStatus, Resource, Rollout, Span

logger = logging.getLogger(__name__)
run = asyncio.to_thread  # every store call off the event loop
DEFAULT_MAX_BODY_BYTES = 256 * 1024 * 1024
# The most specific class first: QueryBusyError is a QueryError.
_STATUS: dict[type[Exception], int] = {InvalidSpanError: 422, NotFoundError: 404, QueryBusyError: 503,
                                       QueryError: 400, StoreError: 503}


def create_store_app(store: SpanStore, *, token: str | None = None, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
                     sql_workers: int = 2, sql_timeout_s: float = SURFACE_TIMEOUT_S,
                     sql_max_bytes: int = SURFACE_MAX_BYTES, hosts: Collection[str] | None = None) -> FastAPI:
    """The FastAPI app over ``store``; the caller owns the store and closes it after the app stops.
    ``hosts``: the only ``Host`` names answered (None: any; :class:`~spanlab.threaded_server.ThreadedServer` checks
    them itself for a loopback bind). The token, Host and body size are checked before a route runs or a
    body is read (:mod:`spanlab.guards`); JSON bodies follow :mod:`spanlab.jsonpolicy`."""
    store.restrict_to_store()
    sql_pool = SqlPool(sql_workers, timeout_s=sql_timeout_s, max_bytes=sql_max_bytes)
    bearer = HTTPBearer(auto_error=False)

    def authorize(cred: HTTPAuthorizationCredentials | None = Depends(bearer)) -> None:
        """Checked before the body by :class:`~spanlab.guards.BearerToken`; declared here for the OpenAPI."""
        if token is not None and (cred is None or not hmac.compare_digest(cred.credentials.encode(), token.encode())):
            raise HTTPException(401, "missing or wrong bearer token", headers={"WWW-Authenticate": "Bearer"})

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        sql_pool.close()

    app = policy_app(title="spanlab store", version="1", dependencies=[Depends(authorize)], lifespan=lifespan)
    add_guards(app, hosts=hosts, token=token, max_body_bytes=max_body_bytes,
               public=(app.openapi_url, app.docs_url, app.docs_url + "/oauth2-redirect"))

    async def error(_: Request, exc: Exception) -> JSONResponse:
        status = next(code for kind, code in _STATUS.items() if isinstance(exc, kind))
        if status == 503:
            logger.error("store error: %s", exc)
        headers = {"Retry-After": "2"} if isinstance(exc, QueryBusyError) else None
        return JSONResponse({"detail": str(exc)}, status, headers=headers)

    for kind in _STATUS:
        app.add_exception_handler(kind, error)

    async def write_spans(spans: list[Span]) -> wire.InsertedResponse:
        new_ids = await run(store.ingest, spans)
        return wire.InsertedResponse(inserted=len(new_ids), span_ids=new_ids)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        """Up, and the largest JSON column of a span the store takes (a gateway's body limit follows it)."""
        return {"status": "ok", "max_json_bytes": store.max_json_bytes}

    # Store methods whose own signature is the route's (path parameters, optional query strings): FastAPI
    # runs these plain methods on its thread pool, never on the event loop.
    app.get("/rollouts/{rollout_id}")(store.get_rollout)
    app.get("/rollouts/{rollout_id}/attempts")(store.list_attempts)
    app.post("/rollouts/{rollout_id}/cancel")(store.cancel_rollout)
    app.get("/attempts/{attempt_id}")(store.get_attempt)
    app.post("/attempts/{attempt_id}/heartbeat")(store.heartbeat)
    app.post("/expire")(store.expire_stale_attempts)
    app.get("/resources")(store.list_resources)
    app.get("/metrics")(store.metrics)

    @app.post("/rollouts")
    async def enqueue(rollouts: list[Rollout]) -> list[Rollout]:
        return await run(store.enqueue, rollouts)

    @app.get("/rollouts")
    async def list_rollouts(status: str | None = None, mode: str | None = None,
                            limit: int = Query(1000, ge=1, le=100_000),
                            offset: int = Query(0, ge=0, le=MAX_INT32)) -> list[Rollout]:
        return await run(store.list_rollouts, status=status, mode=mode, limit=limit, offset=offset)

    @app.post("/rollouts/last-attempts")
    async def last_attempts(req: wire.LastAttemptsRequest) -> list[wire.DequeueResponse]:
        """Each rollout with its latest attempt (rollouts never dequeued are left out)."""
        got = await run(store.last_attempts, req.rollout_ids)
        return [wire.DequeueResponse.model_construct(rollout=r, attempt=a) for r, a in got]

    @app.post("/rollouts/summaries")
    async def rollout_summaries(req: wire.SummariesRequest) -> list[RolloutSummary]:
        return await run(store.rollout_summaries, req.rollout_ids, statuses=req.statuses, metadata=req.metadata)

    @app.get("/rollout-count")
    async def count_rollouts(statuses: list[str] | None = Query(None)) -> int:
        return await run(store.count_rollouts, statuses)

    @app.post("/dequeue")
    async def dequeue(req: wire.DequeueRequest) -> wire.DequeueResponse | None:
        got = await run(store.dequeue, req.worker_id, req.mode)
        return None if got is None else wire.DequeueResponse.model_construct(rollout=got[0], attempt=got[1])

    @app.post("/attempts/{attempt_id}/finish")
    async def finish(attempt_id: str, req: wire.FinishRequest) -> Rollout:
        return await run(store.finish_attempt, attempt_id, req.status, req.spans)

    @app.post("/attempts/{attempt_id}/finish/arrow",
              openapi_extra={"requestBody": {"content": {wire.ARROW_STREAM: {"schema": {}}}}})
    async def finish_arrow(attempt_id: str, request: Request, status: FinishedAttemptStatus = Query()) -> Rollout:
        """Finish with the last spans as an Arrow IPC stream (the `spans` table's columns)."""
        tbl = wire.bytes_to_table(await request.body(), max_body_bytes)
        return await run(lambda: store.finish_attempt(attempt_id, status, table_to_spans(tbl)))

    @app.post("/spans")
    async def add_spans(spans: list[Span]) -> wire.InsertedResponse:
        """Spans as JSON (any language); the Arrow route below is the fast path."""
        return await write_spans(spans)

    @app.post("/spans/arrow", openapi_extra={"requestBody": {"content": {wire.ARROW_STREAM: {"schema": {}}}}})
    async def add_spans_arrow(request: Request) -> wire.InsertedResponse:
        """A span batch as an Arrow IPC stream with the `spans` table's columns."""
        return await write_spans(await run(table_to_spans, wire.bytes_to_table(await request.body(), max_body_bytes)))

    @app.get("/spans/arrow", response_class=StreamingResponse)
    async def read_spans(rollout_ids: list[str] | None = Query(None), attempt_ids: list[str] | None = Query(None),
                         kinds: list[str] | None = Query(None), columns: list[str] | None = Query(None),
                         batch_size: int = Query(1024, ge=1, le=65_536),
                         span_ids: list[str] | None = Query(None)) -> StreamingResponse:
        reader = await run(store.spans_reader, rollout_ids=rollout_ids, attempt_ids=attempt_ids, kinds=kinds,
                           columns=columns, batch_size=batch_size, span_ids=span_ids)
        return StreamingResponse(wire.reader_to_chunks(reader), media_type=wire.ARROW_STREAM)

    @app.post("/v1/traces", openapi_extra={"requestBody": {"content": {
        "application/x-protobuf": {"schema": {}}, "application/json": {"schema": {}}}}})
    async def otlp_traces(request: Request) -> Response:
        """OTLP/HTTP traces (protobuf or JSON, gzip or not); GenAI spans become llm_call spans (spanlab/otel)."""
        try:
            kind, spans = await run(otel.read_request, await request.body(), request.headers.get("content-type"),
                                    request.headers.get("content-encoding"), max_body_bytes)
        except otel.OtlpError as exc:
            return JSONResponse({"detail": str(exc)}, exc.status_code)
        if spans:
            await write_spans(spans)
        return Response(otel.answer(kind), media_type=kind)

    @app.post("/resources")
    async def add_resource(req: wire.ResourceRequest) -> Resource:
        return await run(store.add_resource, req.name, req.payload, req.kind)

    @app.get("/resources/{name}")
    async def get_resource(name: str, version: int | None = Query(None, ge=1, le=MAX_INT32)) -> Resource:
        return await run(store.get_resource, name, version)

    @app.post("/metrics")
    async def add_metrics(req: wire.MetricsRequest) -> None:
        await run(store.add_metrics, req.run_id, req.algorithm, req.step, req.metrics)

    def sql_json(query: str, max_rows: int, limits: QueryLimits) -> tuple[bytes, list[str]]:
        """On the SQL pool's thread, JSON included: 32 MB of rows encoded on the event loop would stall it."""
        table = store.query(query, max_rows, limits=limits)
        return json.dumps(list(rows(table)), ensure_ascii=False).encode(), table.column_names

    @app.post("/sql", response_model=list[dict[str, Any]])
    async def sql(req: wire.SqlRequest, request: Request) -> Response:
        """One read-only SELECT over the tables and views; rows as JSON objects, the column names in the
        ``x-spanlab-columns`` header (JSON: an empty result has them too). 400 for a refused or stopped query (time
        or size limit), 503 when every SQL worker is busy."""
        body, columns = await sql_pool.run(request.is_disconnected, sql_json, req.query, req.max_rows)
        return Response(body, media_type="application/json", headers={wire.SQL_COLUMNS_HEADER: json.dumps(columns)})

    return app
