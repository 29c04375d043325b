"""Which rollout and attempt a call belongs to, checked against the store before tokens are spent.

A call names its attempt in the URL (``/rollout/{rid}/attempt/{aid}/v1/...``, what an agent gets by
setting its OpenAI ``base_url``) or in the headers ``x-spanlab-rollout-id`` + ``x-spanlab-attempt-id``
(for clients whose base URL is fixed); neither means unattributed. In a multi-agent attempt each role
names itself too (``/rollout/{rid}/attempt/{aid}/agent/{name}/v1/...`` or ``x-spanlab-agent``), so its
calls are spans with ``attributes.agent`` and, in TITO mode, it keeps a token buffer of its own.
An unknown attempt, or one of another rollout, is a 404 now rather than a span the store would reject
later. Known pairs are cached: the store is asked once per attempt, off the event loop (a DuckDB lookup
costs milliseconds). The cache also keeps the rollout's sampling seed and numbers the attempt's calls, so that
each call of a seeded rollout is sampled with its own seed (:mod:`spanlab.gateway.seeding`).
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass

import anyio

from spanlab.errors import StoreError
from spanlab.gateway.protocol import BadRequestError
from spanlab.gateway.seeding import SAMPLING_SEED, call_seed
from spanlab.store.base import StoreAPI

ROLLOUT_HEADER = "x-spanlab-rollout-id"
ATTEMPT_HEADER = "x-spanlab-attempt-id"
AGENT_HEADER = "x-spanlab-agent"
AGENT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def requested_agent(path_params: Mapping[str, str], headers: Mapping[str, str]) -> str | None:
    """The agent role the call names (URL or header), or None; a malformed or contradicting name is a 400."""
    name, header = path_params.get("agent"), headers.get(AGENT_HEADER)
    if name is not None and header is not None and name != header:
        raise BadRequestError(f"the agent in the header ({header!r}) differs from the one in the URL ({name!r})")
    name = name if name is not None else header
    if name is not None and not AGENT_NAME.fullmatch(name):
        raise BadRequestError(f"bad agent name {name!r}: use 1-64 letters, digits, '_', '.', '-'")
    return name


def requested_attribution(path_params: Mapping[str, str], headers: Mapping[str, str]) -> tuple[str | None, str | None]:
    """(rollout_id, attempt_id) the request names, or (None, None); contradictions are a 400."""
    rid, aid = path_params.get("rollout_id"), path_params.get("attempt_id")
    h_rid, h_aid = headers.get(ROLLOUT_HEADER), headers.get(ATTEMPT_HEADER)
    if rid is None:
        if (h_rid is None) != (h_aid is None):
            raise BadRequestError(f"send both {ROLLOUT_HEADER} and {ATTEMPT_HEADER}, or neither")
        return h_rid, h_aid
    if (h_rid is not None and h_rid != rid) or (h_aid is not None and h_aid != aid):
        raise BadRequestError("the rollout/attempt in the headers differ from those in the URL path")
    return rid, aid


@dataclass
class _KnownAttempt:
    rollout_id: str
    seed: int | None  # the rollout's sampling seed (metadata), None when it has none
    calls: int = 0  # model calls seen so far: the next call's index


class AttemptChecker:
    """Confirms (rollout, attempt) pairs exist in the store; remembers the last ``cache_size`` of them, with each
    rollout's sampling seed (:mod:`spanlab.gateway.seeding`) and how many calls its attempt has made."""

    def __init__(self, store: StoreAPI, cache_size: int) -> None:
        self.store = store
        self.cache_size = cache_size
        self._known: OrderedDict[str, _KnownAttempt] = OrderedDict()  # attempt_id -> what the store said

    async def check(self, rollout_id: str, attempt_id: str) -> None:
        known = self._known.get(attempt_id)
        if known is None:
            known = await self._lookup(rollout_id, attempt_id)
        if known.rollout_id != rollout_id:
            raise BadRequestError(
                f"attempt {attempt_id!r} belongs to rollout {known.rollout_id!r}, not {rollout_id!r}", 404,
                "unknown_attempt",
            )

    def next_call_seed(self, attempt_id: str) -> int | None:
        """The seed of this attempt's next model call (and count the call), or None when its rollout has no
        sampling seed. Call after :meth:`check`."""
        known = self._known.get(attempt_id)
        if known is None or known.seed is None:
            return None
        known.calls += 1
        return call_seed(known.seed, known.calls - 1)

    async def _lookup(self, rollout_id: str, attempt_id: str) -> _KnownAttempt:
        try:
            attempt = await anyio.to_thread.run_sync(self.store.get_attempt, attempt_id)
            rollout = None
            if attempt.rollout_id == rollout_id:
                rollout = await anyio.to_thread.run_sync(self.store.get_rollout, rollout_id)
        except KeyError as exc:  # NotFoundError
            raise BadRequestError(
                f"unknown attempt {attempt_id!r} (rollout {rollout_id!r}): open it with store.dequeue() before "
                "calling through the gateway",
                404,
                "unknown_attempt",
            ) from exc
        except StoreError as exc:
            raise BadRequestError(
                f"span store unavailable, cannot check attempt {attempt_id!r}: {exc}", 503, "store_unavailable"
            ) from exc
        seed = None if rollout is None else rollout.metadata.get(SAMPLING_SEED)
        known = _KnownAttempt(attempt.rollout_id, seed if isinstance(seed, int) else None)
        self._known[attempt_id] = known
        if len(self._known) > self.cache_size:
            self._known.popitem(last=False)
        return known
