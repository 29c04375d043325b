"""A rollout with a sampling seed gets the same samples each time it runs; the seed of each call is recorded.

Real vLLM behind a real gateway, sampling at temperature 1: two rollouts that carry the same seed (as two runs
of one config queue them) must sample the same token IDs call for call, a third with another seed other ones.
"""

from __future__ import annotations

from typing import Any

import pytest
from openai import OpenAI

from spanlab.gateway import GatewayServer
from spanlab.gateway.seeding import SAMPLING_SEED, call_seed
from spanlab.store import SpanStore
from spanlab.types import Span
from tests.gateway.helpers import Upstream

pytestmark = pytest.mark.vllm

QUESTIONS = ("Write one sentence about the sea.", "Now one about the mountains.")


def _run_rollout(gw: GatewayServer, store: SpanStore, upstream: Upstream, metadata: dict[str, Any],
                 **sampling: Any) -> list[Span]:
    """One rollout of two sequential calls at temperature 1; its spans in call order."""
    store.enqueue_one({"q": "seeds"}, metadata=metadata)
    got = store.dequeue(worker_id="w0")
    assert got is not None
    rollout, attempt = got
    client = OpenAI(base_url=gw.base_url(rollout.rollout_id, attempt.attempt_id), api_key="unused", max_retries=0)
    for question in QUESTIONS:
        client.chat.completions.create(model=upstream.model, messages=[{"role": "user", "content": question}],
                                       temperature=1.0, max_tokens=24, **sampling)
    assert gw.flush(10)
    spans = [s for s in store.iter_spans(attempt_ids=[attempt.attempt_id]) if s.llm is not None]
    return sorted(spans, key=lambda s: s.start_time)


def _tokens(spans: list[Span]) -> list[list[int]]:
    return [list(s.llm.response_token_ids) for s in spans]


def test_the_same_seed_samples_the_same_tokens_call_for_call(
    gateway: GatewayServer, store: SpanStore, upstream: Upstream
) -> None:
    first = _run_rollout(gateway, store, upstream, {SAMPLING_SEED: 7})
    again = _run_rollout(gateway, store, upstream, {SAMPLING_SEED: 7})
    other = _run_rollout(gateway, store, upstream, {SAMPLING_SEED: 8})
    assert [s.attributes["request_params"]["seed"] for s in first] == [call_seed(7, 0), call_seed(7, 1)]
    assert _tokens(first) == _tokens(again)
    assert _tokens(first) != _tokens(other)


def test_a_rollout_without_a_seed_is_not_seeded_and_an_agents_own_seed_is_kept(
    gateway: GatewayServer, store: SpanStore, upstream: Upstream
) -> None:
    plain = _run_rollout(gateway, store, upstream, {})
    assert all("seed" not in s.attributes["request_params"] for s in plain)
    own = _run_rollout(gateway, store, upstream, {SAMPLING_SEED: 7}, seed=123)
    assert [s.attributes["request_params"]["seed"] for s in own] == [123, 123]
