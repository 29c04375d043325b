"""Which engine serves a call when the gateway fronts several replicas of one model.

Each attempt is pinned to one engine: its calls share a prompt prefix, so the engine that served the
first call has it in its prefix cache, and what a rollout ran on (``attributes.replica``, the weights
version) stays one answer per attempt. The first call of an attempt picks by rendezvous (highest random
weight) hashing of the attempt over the healthy engines: attempts spread evenly, the choice needs no
shared state, and an engine going away moves only the attempts that would have gone to it. The pick is
then remembered (a bounded LRU), so an attempt does not follow the hash when health changes later.

Health comes from two places (:mod:`.upstream`): a call that cannot connect marks its engine down at once,
and a periodic ``/health`` probe marks engines down (after a few failures in a row) and up again. A new
attempt never goes to an engine that is down; an attempt pinned to one gets a 502 naming it (the rollout's
retry is a new attempt, and goes elsewhere). When every engine is down the call is sent anyway, to the pinned
or hashed engine, so that one engine restarted on its port is found again by the next call.

Calls without an attempt (unattributed) go round-robin over the healthy engines.
"""

from __future__ import annotations

import hashlib
import itertools
from collections import OrderedDict
from collections.abc import Sequence

from spanlab.gateway.upstream import UpstreamClient, UpstreamError


def hrw_score(key: str, node: str) -> int:
    """Rendezvous weight of ``node`` for ``key``: a 64-bit hash of both (blake2b is stable across processes)."""
    return int.from_bytes(hashlib.blake2b(f"{node}\x00{key}".encode(), digest_size=8).digest(), "big")


def rendezvous(key: str, nodes: Sequence[str]) -> str:
    """The node with the highest rendezvous weight for ``key``."""
    if not nodes:
        raise ValueError("rendezvous needs at least one node")
    return max(nodes, key=lambda node: hrw_score(key, node))


class Router:
    """Picks the engine client for each call; remembers each attempt's engine and what weights it serves."""

    def __init__(self, clients: Sequence[UpstreamClient], *, max_pins: int = 65_536) -> None:
        if not clients:
            raise ValueError("a router needs at least one engine")
        self.clients = list(clients)
        self._by_url = {c.base_url: c for c in self.clients}
        self._pins: OrderedDict[str, UpstreamClient] = OrderedDict()
        self._max_pins = max_pins
        self._next = itertools.count()
        self.versions: dict[str, str | None] = {c.base_url: None for c in self.clients}

    def pick(self, attempt_key: str | None) -> UpstreamClient:
        """The engine for a call of ``attempt_key`` (None: unattributed); raises a 502 UpstreamError when the
        attempt's engine is down and another one is up."""
        if len(self.clients) == 1:
            return self.clients[0]
        healthy = [c for c in self.clients if c.healthy]
        if attempt_key is None:
            pool = healthy or self.clients
            return pool[next(self._next) % len(pool)]
        pinned = self._pins.get(attempt_key)
        if pinned is not None:
            self._pins.move_to_end(attempt_key)
            if pinned.healthy or not healthy:
                return pinned
            raise UpstreamError(
                "upstream_unreachable",
                f"the engine {pinned.base_url} this attempt runs on stopped answering ({pinned.down_reason}); "
                "an attempt does not change engines midway (one engine, one weights version per attempt): "
                "retry the rollout",
            )
        pool = healthy or self.clients
        url = rendezvous(attempt_key, [c.base_url for c in pool])
        chosen = self._by_url[url]
        self._pins[attempt_key] = chosen
        if len(self._pins) > self._max_pins:
            self._pins.popitem(last=False)
        return chosen

    def pinned(self, attempt_key: str) -> UpstreamClient | None:
        """The engine ``attempt_key`` is pinned to, if any."""
        return self._pins.get(attempt_key)

    def set_version(self, url: str, version: str | None) -> None:
        """Record the weights version ``url`` serves now (weight sync calls this after each push)."""
        url = url.rstrip("/").removesuffix("/v1")
        if url not in self.versions:
            raise KeyError(f"{url} is not one of the gateway's engines: {sorted(self.versions)}")
        self.versions[url] = version

    async def probe(self) -> None:
        """One ``/health`` round over every engine."""
        for client in self.clients:
            await client.probe()

    def state(self) -> list[dict[str, object]]:
        """Per engine: URL, health, why it is down, the weights version it serves (for ``/health``)."""
        return [{"url": c.base_url, "healthy": c.healthy, "down_reason": c.down_reason,
                 "policy_version": self.versions[c.base_url]} for c in self.clients]
