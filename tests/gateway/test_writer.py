"""The span writer against the real DuckDB store: order, batching, retries, nothing lost."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from spanlab.errors import StoreError
from spanlab.gateway.writer import SpanWriter
from spanlab.store import SpanStore
from spanlab.types import LLMCall, Span
from tests.stores import wait_until


class FlakyStore(SpanStore):
    """A real in-memory store whose ``add_spans`` fails the first ``failures`` times (a busy disk)."""

    def __init__(self, failures: int) -> None:
        super().__init__(":memory:")
        self.failures = failures
        self.calls: list[int] = []

    def add_spans(self, spans: Sequence[Span]) -> int:
        self.calls.append(len(spans))
        if self.failures > 0:
            self.failures -= 1
            raise StoreError("disk full (injected)")
        return super().add_spans(spans)


def _span(rollout_id: str | None, attempt_id: str | None, i: int) -> Span:
    return Span(
        rollout_id=rollout_id,
        attempt_id=attempt_id,
        name="chat.completions",
        kind="llm_call",
        attributes={"i": i},
        llm=LLMCall(model="m", prompt_token_ids=[1, 2], response_token_ids=[3, i]),
    )


def _stored(store: SpanStore, **filters: Any) -> list[Span]:
    return list(store.iter_spans(**filters))


def test_spans_arrive_in_submission_order_in_batches() -> None:
    store = SpanStore(":memory:")
    store.enqueue_one("task")
    _, attempt = store.dequeue()
    writer = SpanWriter(store, flush_interval_s=0.02).start()
    spans = [_span(attempt.rollout_id, attempt.attempt_id, i) for i in range(50)]
    for s in spans:
        writer.submit([s])
    assert writer.flush(timeout=10)
    got = _stored(store, attempt_ids=[attempt.attempt_id])
    assert [s.attributes["i"] for s in got] == list(range(50))
    assert [s.sequence_id for s in got] == list(range(50))
    assert writer.written == 50 and writer.pending == 0
    writer.close()


def test_transient_store_failures_are_retried_without_loss() -> None:
    store = FlakyStore(failures=3)
    writer = SpanWriter(store, flush_interval_s=0, retry_initial_s=0.01).start()
    writer.submit([_span(None, None, i) for i in range(5)])
    assert writer.flush(timeout=10)
    assert len(_stored(store)) == 5 and writer.write_failures == 3 and writer.given_up == 0
    writer.close()


def test_one_invalid_span_does_not_block_the_batch_and_goes_to_the_fallback(tmp_path: Path) -> None:
    store = SpanStore(":memory:")
    fallback = tmp_path / "rejected.jsonl"
    writer = SpanWriter(store, flush_interval_s=0.05, fallback_path=fallback).start()
    bad = _span("ro-nope", "at-nope", 99)  # the store rejects an unknown attempt
    writer.submit([_span(None, None, 0), bad, _span(None, None, 1)])
    assert writer.flush(timeout=10)
    assert [s.attributes["i"] for s in _stored(store)] == [0, 1]
    assert writer.given_up == 1
    (line,) = fallback.read_text().splitlines()
    assert json.loads(line)["span_id"] == bad.span_id
    writer.close()


def test_close_writes_everything_queued() -> None:
    store = SpanStore(":memory:")
    writer = SpanWriter(store, flush_interval_s=0.5).start()  # long gather: close must not wait it out
    writer.submit([_span(None, None, i) for i in range(20)])
    writer.close(timeout=5)
    assert len(_stored(store)) == 20


def test_close_gives_up_after_its_timeout_when_the_store_stays_down(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = FlakyStore(failures=10**9)
    fallback = tmp_path / "rejected.jsonl"
    writer = SpanWriter(
        store, flush_interval_s=0, retry_initial_s=0.01, retry_max_s=0.02, fallback_path=fallback
    ).start()
    writer.submit([_span(None, None, 0)])
    writer.close(timeout=0.3)
    assert writer.given_up == 1 and len(fallback.read_text().splitlines()) == 1
    assert any(r.levelname == "CRITICAL" for r in caplog.records)


EXIT_CHILD = """
import sys
import numpy as np
sys.path.insert(0, sys.argv[2])
from spanlab.gateway.writer import SpanWriter
from spanlab.store import SpanStore
from spanlab.types import LLMCall, Span
store = SpanStore(sys.argv[1])
writer = SpanWriter(store, flush_interval_s=0.0).start()
ids = np.arange(2500, dtype=np.int32)
for _ in range(40):
    writer.submit([Span(name="c", kind="llm_call", llm=LLMCall(model="m", prompt_token_ids=ids[:2000],
                                                                response_token_ids=ids[:500])) for _ in range(100)])
sys.exit(0)  # neither the writer nor the store closed; the writer's thread is inside DuckDB
"""


def test_exiting_without_closing_the_writer_writes_what_was_queued(tmp_path: Path) -> None:
    import subprocess
    import sys

    path = tmp_path / "s.duckdb"
    proc = subprocess.run([sys.executable, "-c", EXIT_CHILD, str(path), str(Path(__file__).parents[2])],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    with SpanStore(path) as store:
        assert store.query("SELECT count(*) AS n FROM spans").to_pylist() == [{"n": 4000}]


class GatedStore(SpanStore):
    """A real in-memory store whose ``add_spans`` waits for ``gate`` while ``hold`` is set, recording each batch."""

    def __init__(self) -> None:
        super().__init__(":memory:")
        self.gate, self.batches = threading.Event(), []
        self.gate.set()

    def add_spans(self, spans: Sequence[Span]) -> int:
        self.batches.append([s.attributes["i"] for s in spans])
        assert self.gate.wait(60)
        return super().add_spans(spans)


def test_calls_completed_during_a_write_are_written_together_and_fail_alone() -> None:
    """``write`` (a completed call, before its answer): calls that complete while another's write is under
    way share the next store call; a call with a span the store rejects fails alone."""
    store = GatedStore()
    store.enqueue_one("task")
    _, attempt = store.dequeue()
    writer = SpanWriter(store).start()
    results: dict[int, bool] = {}

    def call(i: int, attempt_id: str) -> None:
        results[i] = writer.write([_span(attempt.rollout_id, attempt_id, i)], timeout_s=10)

    store.gate.clear()
    first = threading.Thread(target=call, args=(0, attempt.attempt_id))
    first.start()
    assert wait_until(lambda: store.batches == [[0]])  # the first call's write is under way, held at the store
    others = [threading.Thread(target=call, args=(i, attempt.attempt_id if i != 3 else "no-such-attempt"))
              for i in range(1, 6)]
    for t in others:
        t.start()
    assert wait_until(lambda: len(writer._calls) == 5)
    store.gate.set()
    for t in [first, *others]:
        t.join(30)
    assert results == {0: True, 1: True, 2: True, 3: False, 4: True, 5: True}
    assert sorted(store.batches[1]) == [1, 2, 3, 4, 5]  # one store call for the five, then one each
    assert sorted(s.attributes["i"] for s in _stored(store)) == [0, 1, 2, 4, 5]



def test_store_call_from_the_event_loop_and_a_cancelled_caller_still_stores() -> None:
    """``store_call`` (the gateway's path): the loop awaits while the writer's thread stores; an agent that went
    away (its handler cancelled mid-write) does not take the call's spans with it."""
    store = GatedStore()
    store.enqueue_one("task")
    _, attempt = store.dequeue()
    writer = SpanWriter(store).start()

    async def main() -> bool:
        store.gate.clear()
        gone = asyncio.create_task(writer.store_call([_span(attempt.rollout_id, attempt.attempt_id, 0)], 10))
        assert await asyncio.to_thread(wait_until, lambda: store.batches == [[0]])  # held at the store
        gone.cancel()
        with pytest.raises(asyncio.CancelledError):
            await gone
        store.gate.set()
        return await writer.store_call([_span(attempt.rollout_id, attempt.attempt_id, 1)], 10)

    try:
        assert asyncio.run(main()) is True
    finally:
        writer.close()
    assert sorted(s.attributes["i"] for s in _stored(store)) == [0, 1]
