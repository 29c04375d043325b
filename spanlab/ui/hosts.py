"""Accept only requests addressed to the host names the UI was bound to (a guard against DNS rebinding).

The UI has no login, so what protects it is that only this machine can reach a loopback port. A page on
another site can still get the browser to send it requests: it points its own domain's DNS at 127.0.0.1
(DNS rebinding), and the browser then treats the UI as that site, same-origin. The one thing such a request
cannot fake is its ``Host`` header, which names the attacker's domain; so any Host that is not a name the
server was bound to is answered 421 before a route runs (:class:`spanlab.guards.HostCheck`).
"""

from __future__ import annotations

import socket
from collections.abc import Collection

from spanlab.threaded_server import LOOPBACK_NAMES

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
