"""The web UI: a JSON API over a span store file, read-only, plus one static page (vanilla JS, no build step).

Routes (all GET except ``/api/sql``): ``/api/info``, ``/api/rollouts`` (filters and LIMIT/OFFSET paging),
``/api/rollouts/{id}`` (attempts, one attempt's spans in order), ``/api/calls/{span_id}/tokens`` and
``/api/sessions/{attempt_id}/tokens`` (token view), ``/api/runs`` and ``/api/runs/{run_id}/metrics`` (curves),
``/api/runs/{run_id}/roles`` (the run's ``role_summary`` rows: rewards, calls and policy versions per role),
``POST /api/sql`` (the SQL box: the same read-only path as ``spanlab sql``, on two threads of its own under a
time and size limit, so a runaway query never holds the threads the pages need). Errors are JSON
``{"error": ...}`` with 404 (unknown ID), 400 (bad or stopped query), 423 (a writer holds the file), 503 (the SQL
workers are busy) or 500. ``serve_ui`` answers only requests whose ``Host`` is a name it is bound to
(:mod:`spanlab.ui.hosts`: DNS rebinding).

Run: ``spanlab ui [--db PATH] [--port 8600] [--tokenizer DIR]``; API: ``create_app(db, loader)``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
from collections.abc import AsyncIterator, Callable, Collection
from pathlib import Path
from typing import Annotated, Any, TypeVar

from fastapi import FastAPI, Query, Request
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, ConfigDict, Field

from spanlab.errors import NotFoundError, QueryError, SpanlabError, StoreLockedError
from spanlab.guards import add_guards, policy_app
from spanlab.sql_surface import SURFACE_MAX_BYTES, SURFACE_TIMEOUT_S, QueryBusyError, QueryLimits, SqlPool
from spanlab.threaded_server import LOOPBACK_NAMES
from spanlab.ui import queries
from spanlab.ui.db import ReadOnlyStore, fetch
from spanlab.ui.hosts import allowed_hosts
from spanlab.ui.tokens import TokenizerLoader, TokenText

logger = logging.getLogger(__name__)
STATIC = Path(__file__).with_name("static")
MAX_PAGE = 500
MAX_SQL_ROWS = 5000
MAX_BODY_BYTES = 1024 * 1024  # the one body the UI takes is a SQL query (at most 100,000 characters)
T = TypeVar("T")


class SqlRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    query: str = Field(min_length=1, max_length=100_000)
    max_rows: int = Field(default=200, ge=1, le=MAX_SQL_ROWS)


def _status(exc: SpanlabError) -> int:
    if isinstance(exc, StoreLockedError):
        return 423
    if isinstance(exc, QueryBusyError):
        return 503
    if isinstance(exc, NotFoundError):
        return 404
    if isinstance(exc, QueryError):
        return 400
    return 500


def create_app(db: str | Path, tokenizer_loader: TokenizerLoader | None = None, *, preload: bool = False,
               hosts: Collection[str] | None = None, sql_timeout_s: float = SURFACE_TIMEOUT_S) -> FastAPI:
    """The UI app for the store file ``db``; ``tokenizer_loader`` gives the tokenizer for the token view,
    loaded on first use, or at once on a background thread with ``preload`` (the first token view is then fast).
    ``hosts``: the only ``Host`` names answered (None: any, for tests and embedding)."""
    store = ReadOnlyStore(db)
    sql_pool = SqlPool(2, timeout_s=sql_timeout_s, max_bytes=SURFACE_MAX_BYTES)
    text = TokenText(tokenizer_loader)
    if preload:
        threading.Thread(target=text.tokenizer, name="spanlab-ui-tokenizer", daemon=True).start()
    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        sql_pool.close()

    app = policy_app(title="spanlab UI", docs_url="/api/docs", openapi_url="/api/openapi.json", redoc_url=None,
                     lifespan=lifespan)
    add_guards(app, hosts=hosts, token=None, max_body_bytes=MAX_BODY_BYTES)

    @app.exception_handler(SpanlabError)
    async def _spanlab_error(_: Request, exc: SpanlabError) -> JSONResponse:
        code = _status(exc)
        if code == 500:
            logger.error("UI request failed: %s", exc)
        return JSONResponse({"error": str(exc), "locked": code == 423}, status_code=code)

    async def read(fn: Callable[..., T], *args: Any, **kw: Any) -> T:
        """Run a read on a worker thread with its own short-lived connection (DuckDB releases the GIL)."""

        def call() -> T:
            with store.connection() as conn:
                return fn(conn, *args, **kw)

        return await asyncio.to_thread(call)

    @app.get("/api/info")
    async def info() -> dict[str, Any]:
        def counts(conn: Any) -> dict[str, Any]:
            (n,) = fetch(conn, "SELECT (SELECT count(*) FROM rollouts) AS rollouts, "
                               "(SELECT count(*) FROM spans) AS spans")
            return {**n, **queries.facets(conn)}

        return {"db": str(store.path), **await read(counts)}

    @app.get("/api/rollouts")
    async def rollouts(
        status: str | None = None, mode: str | None = None, version: str | None = None, search: str | None = None,
        min_reward: float | None = None, max_reward: float | None = None, sort: queries.RolloutSort = "newest",
        offset: Annotated[int, Query(ge=0)] = 0, limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50,
    ) -> dict[str, Any]:
        flt = queries.RolloutFilter(status, mode, version, search, min_reward, max_reward)
        return await read(queries.rollouts_page, flt, sort=sort, offset=offset, limit=limit)

    @app.get("/api/rollouts/{rollout_id}")
    async def rollout(rollout_id: str, attempt: str | None = None, offset: Annotated[int, Query(ge=0)] = 0,
                      limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 200) -> dict[str, Any]:
        return await read(queries.rollout_detail, rollout_id, attempt, offset=offset, limit=limit)

    async def tokens(fn: Callable[..., queries.TokenSequence], key: str, offset: int, limit: int) -> dict[str, Any]:
        seq = await read(fn, key)
        return await asyncio.to_thread(text.render, seq, offset, limit)

    @app.get("/api/calls/{span_id}/tokens")
    async def call_tokens(span_id: str, offset: Annotated[int, Query(ge=0)] = 0,
                          limit: Annotated[int, Query(ge=1, le=200_000)] = 20_000) -> dict[str, Any]:
        return await tokens(queries.call_tokens, span_id, offset, limit)

    @app.get("/api/sessions/{attempt_id}/tokens")
    async def session_tokens(attempt_id: str, offset: Annotated[int, Query(ge=0)] = 0,
                             limit: Annotated[int, Query(ge=1, le=200_000)] = 20_000) -> dict[str, Any]:
        return await tokens(queries.session_tokens, attempt_id, offset, limit)

    @app.get("/api/runs")
    async def runs() -> list[dict[str, Any]]:
        return await read(queries.runs)

    @app.get("/api/runs/{run_id:path}/metrics")  # :path: a run_id may hold "/" (runs.js encodes it as %2F)
    async def run_metrics(run_id: str, names: str = "reward_mean,loss") -> dict[str, Any]:
        wanted = [n for n in names.split(",") if n][:20]
        return await read(queries.run_metrics, run_id, wanted)

    @app.get("/api/runs/{run_id:path}/roles")
    async def run_roles(run_id: str) -> list[dict[str, Any]]:
        return await read(queries.run_roles, run_id)

    def sql_json(query: str, max_rows: int, limits: QueryLimits) -> bytes:
        """On the SQL pool's thread, JSON included: a big result encoded on the event loop would stall the pages."""
        columns, rows, truncated = store.user_query(query, max_rows, limits)
        return json.dumps({"columns": columns, "rows": rows, "truncated": truncated}, ensure_ascii=False).encode()

    @app.post("/api/sql", response_model=dict[str, Any])
    async def sql(req: SqlRequest, request: Request) -> Response:
        body = await sql_pool.run(request.is_disconnected, sql_json, req.query, req.max_rows)
        return Response(body, media_type="application/json")

    @app.get("/", include_in_schema=False)
    async def index() -> FileResponse:
        return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})

    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    return app


def serve_ui(db: Path, *, host: str = "127.0.0.1", port: int = 8600, tokenizer_dir: Path | None = None,
             extra_hosts: Collection[str] = ()) -> None:
    """Serve the UI until Ctrl-C. Fails early if the file does not exist; a writer's lock is only a warning
    (the page shows it, and reads work again once the writer closes the file)."""
    import uvicorn

    from spanlab.ui.tokens import default_loader

    store = ReadOnlyStore(db)
    try:
        with store.connection():
            pass
    except StoreLockedError as exc:
        logger.warning("%s", exc)
    if host not in LOOPBACK_NAMES:
        logger.warning("serving the UI on %s: anyone who can reach it can read the store (there is no login)", host)
    app = create_app(db, default_loader(tokenizer_dir), preload=True, hosts=allowed_hosts(host, extra_hosts))
    logger.info("spanlab UI for %s at http://%s:%d (Ctrl-C stops it)", db, host, port)
    uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False)
