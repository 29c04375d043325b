"""A bearer token on every gateway route, for a gateway that workers on other machines call.

The gateway forwards generation to the engines and writes spans into the store for any rollout and attempt
named in the path, so a gateway reachable from a network must not take calls from whoever finds the port
(:class:`GatewayServer <spanlab.gateway.app.GatewayServer>` refuses a bind beyond loopback without one).
Agents already send ``Authorization: Bearer <api_key>`` (the OpenAI SDK does), so the token is simply the
``api_key`` they are given (``RolloutContext.llm_api_key``). Checked by :class:`spanlab.guards.BearerToken`
before routing or reading the body; the token is the gateway's own and is not forwarded to the engine.
"""

from __future__ import annotations

from spanlab.gateway.messages.reply import error_body as messages_error_body
from spanlab.gateway.messages.reply import is_messages_path
from spanlab.gateway.protocol import dumps, error_body

_CODES = {401: ("invalid_api_key", "authentication_error"), 413: ("body_too_large", "invalid_request_error")}


def refusal(status: int, message: str, path: str) -> bytes:
    """The guards' refusals (401, 413) in the error shape of the API the path belongs to: Anthropic's on
    ``/v1/messages`` and below (:func:`~spanlab.gateway.messages.reply.is_messages_path`), OpenAI's elsewhere."""
    if status == 401:
        message += " (the gateway's token: gateway.token)"
    elif status == 413:
        message += " (the gateway takes no body larger than the span store's largest record)"
    if is_messages_path(path):
        return messages_error_body(message, status)
    code, err_type = _CODES.get(status, ("invalid_request", "invalid_request_error"))
    return dumps(error_body(message, code=code, err_type=err_type))
