"""Accept only requests addressed to the host names the UI was bound to (a guard against DNS rebinding).

The UI has no login, so what protects it is that only this machine can reach a loopback port. A page on
another site can still get the browser to send it requests: it points its own domain's DNS at 127.0.0.1
(DNS rebinding), and the browser then treats the UI as that site, same-origin. The one thing such a request
cannot fake is its ``Host`` header, which names the attacker's domain; so any Host that is not a name the
server was bound to is answered 421 before a route runs.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Collection

from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from spanlab.serving import LOOPBACK_NAMES

logger = logging.getLogger(__name__)
WILDCARD_BINDS = frozenset({"0.0.0.0", "::", ""})


def allowed_hosts(bind: str, extra: Collection[str] = ()) -> frozenset[str]:
    """The Host names to accept for a server bound to ``bind``: that name, the loopback names for a loopback
    bind, and this machine's names for a wildcard bind (plus ``extra``, e.g. a DNS name in front of it)."""
    names = {bind.lower(), *(e.lower() for e in extra)}
    if bind in LOOPBACK_NAMES or bind in WILDCARD_BINDS:
        names |= LOOPBACK_NAMES
    if bind in WILDCARD_BINDS:
        names |= {socket.gethostname().lower(), socket.getfqdn().lower()}
    return frozenset(names - WILDCARD_BINDS)


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
