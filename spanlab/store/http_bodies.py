"""What the store server's HTTP surface adds around the store: strict request and response bodies, and the
body limit (counted as the bytes arrive, so a chunked upload cannot slip past a declared length)."""

from __future__ import annotations

from typing import Any

from fastapi import HTTPException
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from spanlab.types import MAX_INT32, Attempt, FinishedAttemptStatus, ResourceKind, Rollout, RolloutMode, Span


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DequeueRequest(_Strict):
    worker_id: str | None = None
    mode: RolloutMode | None = None


class DequeueResponse(_Strict):
    rollout: Rollout
    attempt: Attempt


class FinishRequest(_Strict):
    status: FinishedAttemptStatus
    spans: list[Span] = Field(default_factory=list, description="the attempt's last spans, stored with the finish")


class ResourceRequest(_Strict):
    name: str = Field(min_length=1)
    payload: dict[str, Any] = Field(default_factory=dict)
    kind: ResourceKind = "other"


class SqlRequest(_Strict):
    query: str = Field(min_length=1, max_length=100_000)
    max_rows: int = Field(default=10_000, ge=1, le=1_000_000)


class LastAttemptsRequest(_Strict):
    rollout_ids: list[str]


class SummariesRequest(_Strict):
    rollout_ids: list[str] | None = None
    statuses: list[str] | None = None
    metadata: dict[str, str] | None = None


class MetricsRequest(_Strict):
    run_id: str = Field(min_length=1)
    algorithm: str
    step: int = Field(ge=0, le=MAX_INT32)
    metrics: dict[str, float | None]


class InsertedResponse(_Strict):
    inserted: int
    span_ids: list[str]


class BodyLimit:
    """413 for bodies over the limit: a declared length is checked before anything is read, and the bytes
    of every body are counted as they arrive, so a chunked upload (no length) is cut off at the limit too.

    Plain ASGI rather than Starlette's ``BaseHTTPMiddleware``, which re-wraps every request and response
    in memory streams.
    """

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_bytes):
            detail = f"body of {length.decode(errors='replace')} bytes is over the {self.max_bytes}-byte limit"
            await JSONResponse({"detail": detail}, 413)(scope, receive, send)
            return
        received = 0

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise HTTPException(413, f"body over the {self.max_bytes}-byte limit")
            return message

        await self.app(scope, counted, send)
