"""Shared fixtures: real DuckDB stores (in memory and on disk), a started rollout to attach spans to."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from spanlab.store import SpanStore
from spanlab.types import Attempt, LLMCall, Rollout, Span, reward_span
from tests.engine_fixtures import *  # noqa: F403  (one real vLLM server per session: vllm_server)
from tests.stores import any_store  # noqa: F401  (SpanStore and StoreClient: tests/stores.py)

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED = REPO_ROOT.parent / "shared"


def scripted_spans(rollout: Rollout, attempt: Attempt, steps: list[tuple[str, Any]], *, seed: int = 0,
                   **span_kw: Any) -> tuple[list[Span], dict[str | None, list[str]]]:
    """A multi-agent attempt's spans written as steps: ``("call", role)``, ``("call", (role, policy))`` or
    ``("call", (role, policy, policy_version))`` an LLM call, ``("reward", v)`` or ``("final", v)`` a reward span,
    ``("tied", v)`` a reward tied to the last call. Returns the spans in order and each role's call span IDs."""
    spans: list[Span] = []
    calls: dict[str | None, list[str]] = {}
    last = None
    for kind, arg in steps:
        if kind == "call":
            role, policy, version = (*arg, None)[:3] if isinstance(arg, tuple) else (arg, None, None)
            attributes = {k: v for k, v in (("agent", role), ("policy", policy), ("policy_version", version))
                          if v is not None}
            span = llm_span(rollout, attempt, seed=seed + len(spans), attributes=attributes, **span_kw)
            calls.setdefault(role, []).append(span.span_id)
            last = span.span_id
        else:
            span = reward_span(rollout.rollout_id, attempt.attempt_id, float(arg),
                               call_span_id=last if kind == "tied" else None)
        spans.append(span)
    return spans, calls


@pytest.fixture
def one_thread() -> Iterator[None]:
    """One torch thread: the same sums in the same order (equal runs are bit-equal), and on a shared 2-core
    machine two threads contend and run several times slower."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def store() -> Iterator[SpanStore]:
    with SpanStore(":memory:") as s:
        yield s


@pytest.fixture
def file_store(tmp_path: Path) -> Iterator[SpanStore]:
    with SpanStore(tmp_path / "spans.duckdb") as s:
        yield s


@pytest.fixture
def started(store: SpanStore) -> tuple[Rollout, Attempt]:
    """One rollout, dequeued: spans can be attached to its attempt."""
    store.enqueue_one({"question": "1+1"})
    got = store.dequeue(worker_id="w0")
    assert got is not None
    return got


def llm_span(rollout: Rollout, attempt: Attempt, n_prompt: int = 20, n_resp: int = 5, seed: int = 0, **kw) -> Span:
    rng = np.random.default_rng(seed)
    return Span(
        rollout_id=rollout.rollout_id,
        attempt_id=attempt.attempt_id,
        name="chat",
        kind="llm_call",
        llm=LLMCall(
            model="m",
            request_messages=[{"role": "user", "content": "hi"}],
            response_message={"role": "assistant", "content": "hello"},
            finish_reason="stop",
            prompt_token_ids=rng.integers(0, 50_000, n_prompt).tolist(),
            response_token_ids=rng.integers(0, 50_000, n_resp).tolist(),
            response_logprobs=(-rng.random(n_resp)).tolist(),
        ),
        **kw,
    )
