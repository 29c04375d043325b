"""Watching the engines a process serves: a dead one is restarted on its port, or the process stops, saying why.

``spanlab serve`` runs this until Ctrl-C. Without it a dead engine (its engine core killed out of memory, say)
left the gateway answering 502 until someone noticed. Each engine is asked every ``interval_s`` whether it died
(:meth:`VLLMServer.death <spanlab.engine.server.VLLMServer.death>`: from its processes, no HTTP); the reason is one
line with the engine's exit status and the end of its log. ``restart`` (``spanlab serve --restart-engine``) starts it
again on the same port, so the gateway and the agents keep their URLs; a restart that fails ends the watch too.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

from spanlab.engine.errors import EngineDeadError, ServerStartError
from spanlab.engine.server import VLLMServer

logger = logging.getLogger(__name__)


class EngineDiedError(EngineDeadError):
    """A watched engine died and was not (or could not be) restarted; the message is the one-line reason."""


def watch_engines(servers: Sequence[VLLMServer], stop: threading.Event, *, restart: bool,
                  interval_s: float = 1.0) -> int:
    """Block until ``stop`` is set; returns how many restarts it made. Raises :class:`EngineDiedError` when an
    engine dies and ``restart`` is off, or its restart fails (the caller stops the others)."""
    restarts = 0
    while not stop.wait(interval_s):
        for server in servers:
            if (reason := server.death()) is None:
                continue
            if not restart:
                raise EngineDiedError(f"{reason} (--restart-engine restarts a dead engine)")
            logger.error("%s; restarting it (--restart-engine)", reason)
            try:
                server.restart()
            except ServerStartError as exc:
                first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                raise EngineDiedError(f"{reason}; its restart failed: {first.rstrip(':')}") from exc
            restarts += 1
            logger.warning("vLLM on port %s restarted (%d restart(s) so far)", server.port, restarts)
    return restarts
