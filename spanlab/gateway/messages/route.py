"""``POST /v1/messages``: the Anthropic Messages API served over the gateway's chat path, recorded like chat.

The request is translated to a chat request (:mod:`.protocol`) and handed to
:meth:`Gateway.forward <spanlab.gateway.proxy.Gateway.forward>`, so it takes the way a chat call does: per call
with ``return_token_ids``, or through the attempt's TITO buffer when TITO is on. The span is an ordinary
``llm_call`` span named ``messages`` (``attributes.endpoint`` ``/v1/messages``, ``attributes.messages.message_id``:
the ``id`` the agent got) with the exact prompt and sampled IDs, stored before the agent gets its answer. A
streamed request is a streamed chat call whose chunks become Messages events as they arrive (:mod:`.stream`).

Every error is in the Messages API's shape (:mod:`.reply`). The gateway's own refusals (a malformed body or
block, an unknown ``tool_use_id``, ``max_tokens`` missing or over the engine's context length) are answered
before anything is forwarded, so nothing is stored for them; the engine's errors keep their status and are
recorded as error spans, as on the chat route.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from spanlab.gateway.messages.protocol import MessagesError, to_chat
from spanlab.gateway.messages.reply import ToolArgumentsError, error_body, from_openai_error, to_message
from spanlab.gateway.messages.stream import MessagesStream
from spanlab.gateway.protocol import BadRequestError, dumps, loads, parse_request
from spanlab.gateway.recording import RouteInfo
from spanlab.gateway.responses.route import Forward
from spanlab.gateway.translated import translated_events
from spanlab.gateway.upstream import UpstreamClient, UpstreamError

logger = logging.getLogger(__name__)

PATH = "/v1/messages"
RETRY_S = 60.0


def _error(message: str, status: int, err_type: str | None = None, headers: dict[str, str] | None = None) -> Response:
    return Response(error_body(message, status, err_type), status, media_type="application/json", headers=headers)


class MessagesRoute:
    """The handler of ``/v1/messages`` (every attribution prefix) on one gateway: ``forward`` serves the translated
    chat call, ``new_span_id`` names the message (``msg_`` + the hex of a span ID), ``engine`` is asked once for
    its context length (``max_model_len`` in ``/v1/models``), the bound on ``max_tokens``."""

    def __init__(self, forward: Forward, new_span_id: Callable[[], str], engine: UpstreamClient) -> None:
        self.forward = forward
        self.new_span_id = new_span_id
        self.engine = engine
        self._max_model_len: int | None = None
        self._asked_at = -RETRY_S

    async def max_tokens_limit(self) -> int | None:
        """The engine's context length, asked once; None (the engine then judges) while it cannot be read, asked
        again at most every ``RETRY_S`` (an engine without the field must not cost every call a round trip)."""
        if self._max_model_len is None and time.monotonic() - self._asked_at >= RETRY_S:
            self._asked_at = time.monotonic()
            try:
                resp = await self.engine.send("GET", "/v1/models")
                models = loads(await self.engine.read(resp)).get("data") or [{}]
                self._max_model_len = int(models[0]["max_model_len"])
            except (UpstreamError, ValueError, AttributeError, KeyError, IndexError, TypeError) as exc:
                logger.warning("cannot read the engine's max_model_len (max_tokens is left to the engine): %s", exc)
        return self._max_model_len

    async def create(self, request: Request) -> Response:
        start = time.time()
        try:
            body = parse_request(await request.body())
            chat = to_chat(body, await self.max_tokens_limit())
        except BadRequestError as exc:
            logger.warning("rejected %s %s: %s", request.method, request.url.path, exc)
            return _error(str(exc), exc.status_code, exc.err_type if isinstance(exc, MessagesError) else None)
        name = f"msg_{self.new_span_id().removeprefix('sp-')}"
        route = RouteInfo(name="messages", path=PATH, attributes={"message_id": name})
        answer = await self.forward("chat", chat, request, start, route=route)
        headers = {k: v for k, v in answer.headers.items() if k.startswith("x-spanlab-")}
        if answer.status_code != 200:  # the gateway's or the engine's error, in the Messages shape
            return Response(from_openai_error(bytes(answer.body), answer.status_code), answer.status_code,
                            media_type="application/json", headers=headers)
        if body.get("stream"):
            events = translated_events(answer, MessagesStream(body, name))
            return StreamingResponse(events, media_type="text/event-stream", headers=headers)
        try:
            reply = to_message(loads(answer.body), body, name)
        except ToolArgumentsError as exc:  # the span is stored: the sample is real, only its answer cannot be shaped
            return _error(str(exc), 502, "api_error", headers)
        return Response(dumps(reply), 200, media_type="application/json", headers=headers)
