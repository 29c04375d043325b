"""``POST /v1/responses``: the Responses API served over the gateway's chat path, recorded like chat.

The request is translated to a chat request (:mod:`.responses_protocol`) and handed to
:meth:`Gateway.forward <spanlab.gateway.proxy.Gateway.forward>` unstreamed, so it takes the same way a chat
call does: per call with ``return_token_ids``, or through the attempt's TITO buffer when TITO is on. The
span is an ordinary ``llm_call`` span named ``responses`` (``attributes.endpoint`` ``/v1/responses``,
``attributes.stream`` as the agent asked, ``attributes.responses.response_id``) with the exact prompt and
sampled IDs; it is stored before the agent gets its answer. A streamed request gets the whole event
stream once generation is done (as a streamed TITO chat call does), so ``response.completed`` always
follows a stored span. Errors keep the engine's status and OpenAI error body.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import Response

from spanlab.gateway.protocol import BadRequestError, dumps, error_body, loads
from spanlab.gateway.recording import RouteInfo
from spanlab.gateway.responses_protocol import sse_events, to_chat, to_response

if TYPE_CHECKING:
    from spanlab.gateway.proxy import Gateway

logger = logging.getLogger(__name__)

PATH = "/v1/responses"


class ResponsesRoute:
    """The handler of ``/v1/responses`` (every attribution prefix) on one gateway."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    async def create(self, request: Request) -> Response:
        start = time.time()
        try:
            body = self.gateway._parse_body(await request.body())
            chat = to_chat(body)
        except BadRequestError as exc:
            logger.warning("rejected %s %s: %s", request.method, request.url.path, exc)
            return Response(dumps(error_body(str(exc), code=exc.code)), exc.status_code,
                            media_type="application/json")
        stream = bool(body.get("stream"))
        response_id = f"resp_{self.gateway._span_id().removeprefix('sp-')}"
        route = RouteInfo(name="responses", path=PATH, stream=stream, attributes={"response_id": response_id})
        answer = await self.gateway.forward("chat", chat, request, start, route=route)
        if answer.status_code != 200:
            return answer  # the OpenAI error body, as the chat route gave it
        reply = to_response(loads(answer.body), body)
        reply["id"] = response_id
        headers = {k: v for k, v in answer.headers.items() if k.startswith("x-spanlab-")}
        if stream:
            return Response(sse_events(reply), 200, media_type="text/event-stream", headers=headers)
        return Response(dumps(reply), 200, media_type="application/json", headers=headers)
