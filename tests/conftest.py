"""Shared fixtures: real DuckDB stores (in memory and on disk), a started rollout to attach spans to."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from spanlab.store import SpanStore
from spanlab.types import Attempt, LLMCall, Rollout, Span
from tests.engine_fixtures import *  # noqa: F403  (one real vLLM server per session: vllm_server)
from tests.stores import any_store  # noqa: F401  (SpanStore and StoreClient: tests/stores.py)

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED = REPO_ROOT.parent / "shared"


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
