"""A bearer token on every gateway route, for a gateway that workers on other machines call.

The gateway forwards generation to the engines and writes spans into the store for any rollout and attempt
named in the path, so a gateway reachable from a network must not take calls from whoever finds the port
(:class:`GatewayServer <spanlab.gateway.app.GatewayServer>` refuses a bind beyond loopback without one).
Agents already send ``Authorization: Bearer <api_key>`` (the OpenAI SDK does), so the token is simply the
``api_key`` they are given (``RolloutContext.llm_api_key``). Checked by :class:`spanlab.guards.BearerToken`
before routing or reading the body; the token is the gateway's own and is not forwarded to the engine.
"""

from __future__ import annotations

from spanlab.gateway.protocol import dumps, error_body

_CODES = {401: ("invalid_api_key", "authentication_error"), 413: ("body_too_large", "invalid_request_error")}


def refusal(status: int, message: str) -> bytes:
    """The guards' refusals (401, 413) in OpenAI's error shape with Anthropic's ``"type": "error"`` on top: the
    guards answer before any route runs, so one body must read right to both SDKs (``/v1/messages`` agents too)."""
    code, err_type = _CODES.get(status, ("invalid_request", "invalid_request_error"))
    if status == 401:
        message += " (the gateway's token: gateway.token)"
    return dumps({"type": "error", **error_body(message, code=code, err_type=err_type)})
