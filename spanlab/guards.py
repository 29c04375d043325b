"""The checks every HTTP surface (store server, gateway, UI) runs, in one place: Host, bearer token, body size,
and the JSON policy (:mod:`spanlab.jsonpolicy`).

The order matters and is the same everywhere (:func:`add_guards`): a request for a foreign Host is refused
first (DNS rebinding), then one without the token, then an oversized body, all as plain ASGI before any
route runs, so a refused request costs no body read. Routes of a FastAPI app then decode JSON bodies with
the policy (:class:`PolicyRoute`); the gateway, a plain Starlette app, calls :func:`spanlab.jsonpolicy.decode`.
"""

from __future__ import annotations

import hmac
import json
import logging
from collections.abc import Callable, Collection, Coroutine
from typing import Any

from fastapi import FastAPI, HTTPException, Request, Response
from fastapi.routing import APIRoute
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from spanlab import jsonpolicy

logger = logging.getLogger(__name__)
# The names a server bound to loopback answers to; a bind to anything else is reachable from other machines.
LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "::1"})
# (status, message, path) -> the whole body of a refusal; each surface (and on the gateway, each API: OpenAI's or
# Anthropic's, told apart by the path) answers in its own error shape.
Refusal = Callable[[int, str, str], bytes]


def detail_body(status: int, message: str, path: str = "") -> bytes:
    """FastAPI's error shape, ``{"detail": ...}``, whatever the path."""
    return json.dumps({"detail": message}).encode()


async def _refuse(send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]] = ()) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), *headers]})
    await send({"type": "http.response.body", "body": body})


def loopback_hosts(bind: str) -> frozenset[str] | None:
    """The Host names a server bound to ``bind`` answers: the loopback names for a loopback bind (a page on
    another site that resolves its name to 127.0.0.1 must not reach it), None (any) beyond loopback, where the
    bearer token, which such a page cannot send, is what protects it."""
    return LOOPBACK_NAMES | {bind} if bind in LOOPBACK_NAMES else None


class BearerToken:
    """401 before the body is read for a request whose ``Authorization`` is not ``Bearer <token>``; ``public``
    paths (an API description) pass without it."""

    def __init__(self, app: ASGIApp, token: str, refusal: Refusal = detail_body,
                 public: Collection[str] = ()) -> None:
        self.app, self._token, self._public, self._refusal = app, token.encode(), frozenset(public), refusal

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self._public or self._allowed(scope):
            await self.app(scope, receive, send)
            return
        body = self._refusal(401, "missing or wrong bearer token", scope["path"])
        await _refuse(send, 401, body, [(b"www-authenticate", b"Bearer")])

    def _allowed(self, scope: Scope) -> bool:
        value = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
        scheme, _, credential = value.partition(b" ")
        return scheme.lower() == b"bearer" and hmac.compare_digest(credential.strip(), self._token)


class BodyLimit:
    """413 for bodies over the limit: a declared length is checked before anything is read, and the bytes
    of every body are counted as they arrive, so a chunked upload (no length) is cut off at the limit too.

    Plain ASGI rather than Starlette's ``BaseHTTPMiddleware``, which re-wraps every request and response
    in memory streams.
    """

    def __init__(self, app: ASGIApp, max_bytes: int, refusal: Refusal = detail_body) -> None:
        self.app, self.max_bytes, self.refusal = app, max_bytes, refusal

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_bytes):
            detail = f"body of {length.decode(errors='replace')} bytes is over the {self.max_bytes}-byte limit"
            await _refuse(send, 413, self.refusal(413, detail, scope["path"]))
            return
        received, started = 0, False

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise BodyTooLargeError(self.max_bytes)
            return message

        async def tracked(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, tracked)
        except BodyTooLargeError as exc:  # raised by a read inside the app, whatever catches errors there
            if not started:
                await _refuse(send, 413, self.refusal(413, str(exc), scope["path"]))


class BodyTooLargeError(HTTPException):
    """A streamed body passed the limit while it was read (an ``HTTPException``, so FastAPI answers 413 too)."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(413, f"body over the {max_bytes}-byte limit")

    def __str__(self) -> str:
        return str(self.detail)


def host_name(header: str) -> str:
    """The name part of a Host header: ``[::1]:8600`` -> ``::1``, ``localhost:8600`` -> ``localhost``."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:].split("]", 1)[0]
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


class HostCheck:
    """Plain ASGI middleware: 421 for a request whose Host is not in ``hosts``."""

    def __init__(self, app: ASGIApp, hosts: Collection[str]) -> None:
        self.app = app
        self.hosts = frozenset(h.lower() for h in hosts)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            raw = dict(scope["headers"]).get(b"host", b"").decode("latin-1")
            if host_name(raw) not in self.hosts:
                logger.info("refused a request for Host %r (serving %s)", raw, sorted(self.hosts))
                await PlainTextResponse(f"unknown Host {raw!r}: this server answers only for "
                                        f"{', '.join(sorted(self.hosts))}", 421)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def add_guards(app: Any, *, hosts: Collection[str] | None, token: str | None, max_body_bytes: int | None,
               refusal: Refusal = detail_body, public: Collection[str] = ()) -> None:
    """Put the guards around ``app`` in their order (Starlette wraps the last one added outermost)."""
    if max_body_bytes is not None:
        app.add_middleware(BodyLimit, max_bytes=max_body_bytes, refusal=refusal)
    if token is not None:
        app.add_middleware(BearerToken, token=token, refusal=refusal, public=public)
    if hosts is not None:
        app.add_middleware(HostCheck, hosts=hosts)


class PolicyRequest(Request):
    """A request whose JSON body is decoded by the policy (FastAPI answers its refusals 422)."""

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = jsonpolicy.decode(await self.body())
        return self._json


class PolicyRoute(APIRoute):
    """FastAPI's route, decoding bodies with :class:`PolicyRequest` (FastAPI's documented way to change how a
    body is read); set it as ``app.router.route_class`` before routes are added."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def policy_handler(request: Request) -> Response:
            return await handler(PolicyRequest(request.scope, request.receive))

        return policy_handler


def policy_app(**kwargs: Any) -> FastAPI:
    """A FastAPI app whose every route follows the JSON policy."""
    app = FastAPI(**kwargs)
    app.router.route_class = PolicyRoute
    return app
