"""``POST /v1/responses``: the Responses API served over the gateway's chat path, recorded like chat.

The request is translated to a chat request (:mod:`.protocol`) and handed to
:meth:`Gateway.forward <spanlab.gateway.proxy.Gateway.forward>`, so it takes the same way a chat call
does: per call with ``return_token_ids``, or through the attempt's TITO buffer when TITO is on. The span is
an ordinary ``llm_call`` span named ``responses`` (``attributes.endpoint`` ``/v1/responses``,
``attributes.responses.response_id``) with the exact prompt and sampled IDs, stored before the agent gets
its answer. A streamed request is a streamed chat call whose chunks become Responses events as they
arrive (:mod:`.stream`; a TITO call's chunks come at once, as for chat). Errors keep the
engine's status and OpenAI error body.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from spanlab.gateway.protocol import BadRequestError, Endpoint, dumps, error_body, loads, parse_request
from spanlab.gateway.recording import RouteInfo
from spanlab.gateway.responses.protocol import to_chat, to_response
from spanlab.gateway.responses.stream import ResponsesStream
from spanlab.gateway.translated import translated_events

logger = logging.getLogger(__name__)

PATH = "/v1/responses"


class Forward(Protocol):
    """:meth:`Gateway.forward <spanlab.gateway.proxy.Gateway.forward>`: serve a parsed generation request."""

    async def __call__(self, endpoint: Endpoint, body: dict[str, Any], request: Request, start: float,
                       route: RouteInfo | None = None) -> Response: ...


class ResponsesRoute:
    """The handler of ``/v1/responses`` (every attribution prefix) on one gateway: ``forward`` serves the
    translated chat call, ``new_span_id`` names the response (``resp_`` + the hex of a span ID)."""

    def __init__(self, forward: Forward, new_span_id: Callable[[], str]) -> None:
        self.forward = forward
        self.new_span_id = new_span_id

    async def create(self, request: Request) -> Response:
        start = time.time()
        try:
            body = parse_request(await request.body())
            chat = to_chat(body)
        except BadRequestError as exc:
            logger.warning("rejected %s %s: %s", request.method, request.url.path, exc)
            return Response(dumps(error_body(str(exc), code=exc.code)), exc.status_code,
                            media_type="application/json")
        stream = bool(body.get("stream"))
        response_id = f"resp_{self.new_span_id().removeprefix('sp-')}"
        route = RouteInfo(name="responses", path=PATH, attributes={"response_id": response_id})
        answer = await self.forward("chat", chat, request, start, route=route)
        if answer.status_code != 200:
            return answer  # the OpenAI error body, as the chat route gave it
        headers = {k: v for k, v in answer.headers.items() if k.startswith("x-spanlab-")}
        if stream:
            events = translated_events(answer, ResponsesStream(body, response_id))
            return StreamingResponse(events, media_type="text/event-stream", headers=headers)
        reply = {**to_response(loads(answer.body), body), "id": response_id}
        return Response(dumps(reply), 200, media_type="application/json", headers=headers)
