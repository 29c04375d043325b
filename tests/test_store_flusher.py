"""The store's background flusher and its fsync policy: journals reach the tables with nobody calling,
handing work out skips the fsync that results get, and the thread ends with its store."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path

import pytest

from spanlab.store import SpanStore
from spanlab.store.append_file import count_records
from tests.conftest import llm_span


def _wait_for(condition, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


def _size(path: str) -> int:
    """Records in the journal file (its size in bytes says nothing: the file is reused and preallocated)."""
    return count_records(Path(path))


def test_an_idle_store_writes_its_journals_to_the_tables(tmp_path: Path) -> None:
    """No call after the writes: the background thread inserts the spans and writes the queue states."""
    db = str(tmp_path / "s.duckdb")
    with SpanStore(db, span_flush_s=0.2, queue_flush_s=0.2) as store:
        store.enqueue_one({"q": 1})
        rollout, attempt = store.dequeue(worker_id="w")
        store.finish_attempt(attempt.attempt_id, "succeeded", [llm_span(rollout, attempt, seed=i) for i in range(3)])
        assert _size(db + ".journal") > 0  # durable there first
        assert _wait_for(lambda: _size(db + ".journal") == 0)
        assert store._spans.rows == 0  # inserted, not only truncated
        assert store.query("SELECT count(*) AS n FROM spans")["n"][0].as_py() == 3
        assert store.get_rollout(rollout.rollout_id).status == "succeeded"


def test_handing_work_out_is_not_fsynced_and_results_are(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A dequeue is written (a killed process keeps it) but not fsync'd; a finish is fsync'd, and so is the
    dequeue before it. The background thread syncs a dequeue nobody followed up."""
    synced: list[int] = []
    real = os.fdatasync
    monkeypatch.setattr(os, "fdatasync", lambda fd: (synced.append(fd), real(fd))[1])
    db = str(tmp_path / "s.duckdb")
    with SpanStore(db, queue_flush_s=3600, span_flush_s=3600) as store:  # the thread ticks every second
        store.enqueue([{"input": {"q": i}} for i in range(3)])
        journal = store._journal_file
        synced.clear()
        rollout, attempt = store.dequeue(worker_id="w")
        assert synced == [] and journal.dirty and _size(db + ".journal") > 0
        store.finish_attempt(attempt.attempt_id, "succeeded", [llm_span(rollout, attempt)])
        assert len(synced) == 1 and not journal.dirty  # the finish and its spans: one append (and the dequeue's)
        store.dequeue(worker_id="w")
        assert journal.dirty
        assert _wait_for(lambda: not journal.dirty, timeout_s=5)

        store.dequeue(worker_id="w")
        assert journal.dirty
        synced.clear()
        store._write_journals()  # the tables never get ahead of what the journal on disk holds
        assert synced and not journal.dirty


def test_the_thread_ends_with_its_store(tmp_path: Path) -> None:
    def new_thread(make):
        before = set(threading.enumerate())
        made = make()
        (thread,) = [t for t in threading.enumerate() if t not in before and t.name.startswith("spanlab-flush")]
        return made, thread

    store, thread = new_thread(lambda: SpanStore(tmp_path / "closed.duckdb"))
    store.close()
    assert not thread.is_alive()

    unclosed, thread = new_thread(lambda: SpanStore(":memory:", span_flush_s=0.2, queue_flush_s=0.2))
    ref = weakref.ref(unclosed)
    del unclosed
    gc.collect()
    assert ref() is None  # the thread does not keep a forgotten store alive
    assert _wait_for(lambda: not thread.is_alive(), timeout_s=5)


EXIT_CHILD = """
import sys, time
import numpy as np
sys.path.insert(0, sys.argv[2])
from spanlab.store import SpanStore
from spanlab.types import LLMCall, Rollout, Span
store = SpanStore(sys.argv[1], span_flush_s=0.05, queue_flush_s=3600)
store.enqueue([Rollout(rollout_id="r", input={})])
_, attempt = store.dequeue(worker_id="w")
ids = np.arange(2500, dtype=np.int32)
for _ in range(6):
    store.add_spans([Span(rollout_id="r", attempt_id=attempt.attempt_id, name="c", kind="llm_call",
                          llm=LLMCall(model="m", prompt_token_ids=ids[:2000], response_token_ids=ids[:500]))
                     for _ in range(300)])
time.sleep(float(sys.argv[3]))  # the background thread is inside DuckDB's insert of the 1,800 spans now
sys.exit(0)  # without closing the store
"""


@pytest.mark.parametrize("delay_s", [0.08, 0.15])
def test_exiting_without_closing_the_store_mid_flush_is_a_clean_exit(tmp_path: Path, delay_s: float) -> None:
    """Without the exit hook, Python finalizing under a thread inside DuckDB aborted the process (status 134)
    in 2 of 4 runs here."""
    path = tmp_path / "s.duckdb"
    proc = subprocess.run([sys.executable, "-c", EXIT_CHILD, str(path), str(Path(__file__).parent.parent),
                           str(delay_s)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    with SpanStore(path) as store:
        assert store.query("SELECT count(*) AS n FROM spans").to_pylist() == [{"n": 1800}]
