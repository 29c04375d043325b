"""A bearer token on every gateway route, for a gateway that workers on other machines call.

The gateway forwards generation to the engines and writes spans into the store for any rollout and attempt
named in the path, so a gateway reachable from a network must not take calls from whoever finds the port.
Agents already send ``Authorization: Bearer <api_key>`` (the OpenAI SDK does), so the token is simply the
``api_key`` they are given (``RolloutContext.llm_api_key``). Checked in plain ASGI, before routing, so a
refused call costs nothing downstream; the token is the gateway's own and is not forwarded to the engine.
"""

from __future__ import annotations

import hmac
import json
from typing import Any

from spanlab.gateway.protocol import error_body

_REFUSED = json.dumps(error_body("missing or wrong bearer token (the gateway's token: gateway.token)",
                                 code="invalid_api_key", err_type="authentication_error")).encode()


class BearerTokenMiddleware:
    """Answer 401 (OpenAI-shaped) to any HTTP request whose ``Authorization`` is not ``Bearer <token>``."""

    def __init__(self, app: Any, token: str) -> None:
        self.app, self._token = app, token.encode()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or self._allowed(scope):
            await self.app(scope, receive, send)
            return
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")]})
        await send({"type": "http.response.body", "body": _REFUSED})

    def _allowed(self, scope: dict[str, Any]) -> bool:
        value = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
        scheme, _, credential = value.partition(b" ")
        return scheme.lower() == b"bearer" and hmac.compare_digest(credential.strip(), self._token)
