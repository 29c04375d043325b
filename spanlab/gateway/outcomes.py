"""How a generation call ends, whichever path served it: its spans stored or handed on, and the agent's answer.

Why a module of its own: the per-call path (:mod:`.proxy`), TITO (:mod:`.tito`) and the Responses API
(:mod:`.responses`) end a call the same three ways: the spans stored before the agent sees the answer, the
engine's 4xx/5xx passed through and recorded, or no usable answer at all (an error span, and the agent told
why). They share :class:`CallOutcomes`; it imports none of them, so none of them imports the proxy back.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import aiohttp
from starlette.responses import Response

from spanlab.gateway.protocol import dumps, error_body, loads
from spanlab.gateway.recording import CallContext, error_span
from spanlab.gateway.writer import SpanJob, SpanWriter

logger = logging.getLogger(__name__)

SPAN_IDS_HEADER = "x-spanlab-span-ids"


def error_response(status: int, message: str, code: str, err_type: str = "invalid_request_error") -> Response:
    """An OpenAI-shaped error body with ``status``."""
    return Response(dumps(error_body(message, code=code, err_type=err_type)), status, media_type="application/json")


class CallOutcomes:
    """The ends of a call on one gateway's span writer; ``store_timeout_s``: how long a stored-first call waits."""

    def __init__(self, writer: SpanWriter, store_timeout_s: float) -> None:
        self.writer = writer
        self.store_timeout_s = store_timeout_s

    async def record(self, job: SpanJob) -> Response | None:
        """Store a completed call's spans before the agent sees the answer (see :mod:`.writer`); None once
        stored, else the 503 to answer instead."""
        if await self.writer.store_call(job, self.store_timeout_s):
            return None
        return error_response(503, "the span store could not take this call's spans; the call is not recorded",
                              "store_unavailable", "store_error")

    def upstream_error(self, ctx: CallContext, upstream: aiohttp.ClientResponse, content: bytes) -> Response:
        """Pass the engine's 4xx/5xx through unchanged, and record it."""
        try:
            body: Any = loads(content)
        except ValueError:
            body = content[:4096].decode("utf-8", "replace")
        message = (
            body.get("error", {}).get("message")
            if isinstance(body, dict) and isinstance(body.get("error"), dict)
            else None
        )
        error = {
            "type": "upstream_http_error",
            "status_code": upstream.status,
            "message": message or str(body)[:500],
            "body": body,
        }
        end = time.time()
        self.writer.submit(lambda: [error_span(ctx, end_time=end, upstream_status=upstream.status, error=error)])
        return Response(
            content,
            upstream.status,
            media_type=upstream.headers.get("content-type"),
            headers={SPAN_IDS_HEADER: ctx.span_ids[0]},
        )

    def fail(self, ctx: CallContext, status: int, code: str, message: str) -> Response:
        """No usable answer from the engine: record an error span, tell the agent ``status``."""
        logger.error("call %s failed: %s", ctx.span_ids[0], message)
        error = {"type": code, "status_code": status, "message": message}
        end = time.time()
        self.writer.submit(lambda: [error_span(ctx, end_time=end, upstream_status=None, error=error)])
        return error_response(status, message, code, "upstream_error")
