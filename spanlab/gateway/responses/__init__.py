"""``POST /v1/responses``: the OpenAI Responses API served as chat calls, recorded like them.

:mod:`.route` is the handler, :mod:`.protocol` the request/response translation (pure functions),
:mod:`.stream` the chat chunks -> Responses events translation of a streamed call.
"""

from spanlab.gateway.responses.route import ResponsesRoute

__all__ = ["ResponsesRoute"]
