"""Acknowledged = durable: a process SIGKILLed right after its store calls returned loses none of them.

The child process kills itself (no close, no checkpoint) once every call below has returned; the parent
reopens the file and finds each acknowledged change exactly once. Ingest under SIGKILL at a random moment
is in tests/test_store_faults.py, the store server's in tests/test_store_server.py, the gateway's in
tests/gateway/test_gateway_kill.py.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from spanlab.errors import InvalidSpanError
from spanlab.store import SpanStore
from spanlab.types import Rollout
from tests.stores import wait_until

CHILD = textwrap.dedent(
    """
    import os, signal, sys
    import numpy as np
    from spanlab.store import SpanStore
    from spanlab.types import LLMCall, Rollout, RolloutConfig, Span, reward_span

    store = SpanStore(sys.argv[1])
    cfg = RolloutConfig(max_attempts=2)
    store.enqueue([Rollout(rollout_id=f"r{i}", input={"i": i}, config=cfg) for i in range(4)])
    (r0, a0), (r1, a1), (r2, a2) = store.dequeue("w"), store.dequeue("w"), store.dequeue("w")
    rng = np.random.default_rng(0)
    calls = [Span(rollout_id="r0", attempt_id=a0.attempt_id, name="chat", kind="llm_call", span_id=f"c{k}",
                  llm=LLMCall(model="m", prompt_token_ids=rng.integers(0, 1000, 30).tolist(),
                              response_token_ids=[k, k + 1])) for k in range(3)]
    store.add_spans(calls[:2])
    store.finish_attempt(a0.attempt_id, "succeeded", [calls[2], reward_span("r0", a0.attempt_id, 1.0)])
    store.finish_attempt(a1.attempt_id, "failed")
    store.heartbeat(a2.attempt_id)
    store.add_resource("prompt", {"t": "x"})
    store.add_metrics("run", "grpo", 1, {"loss": 0.5})
    print("ACK", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


def test_sigkill_loses_no_acknowledged_write(tmp_path: Path) -> None:
    path = tmp_path / "s.duckdb"
    proc = subprocess.run([sys.executable, "-c", CHILD, str(path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == -9 and "ACK" in proc.stdout, proc.stderr
    with SpanStore(path) as store:
        states = {r.rollout_id: (r.status, r.num_attempts, [a.status for a in store.list_attempts(r.rollout_id)])
                  for r in store.list_rollouts()}
        assert states == {
            "r0": ("succeeded", 1, ["succeeded"]),
            "r1": ("requeuing", 1, ["failed"]),
            "r2": ("running", 1, ["running"]),
            "r3": ("queuing", 0, []),
        }
        spans = store.spans_table(rollout_ids=["r0"], columns=["span_id", "sequence_id", "response_token_ids"])
        assert spans["span_id"].to_pylist()[:3] == ["c0", "c1", "c2"] and spans.num_rows == 4
        assert spans["response_token_ids"].to_pylist()[:3] == [[0, 1], [1, 2], [2, 3]]
        assert store.get_resource("prompt").version == 1
        assert [m.value for m in store.metrics("run")] == [0.5]
        rollout, attempt = store.dequeue()
        assert (rollout.rollout_id, attempt.sequence_id) == ("r1", 2)  # the retry, in enqueue order


COPY_KILLED = textwrap.dedent(
    """
    import os, signal, sys
    from spanlab.store import SpanStore
    from spanlab.types import LLMCall, Rollout, Span

    class KilledAtCommit:  # DuckDB's connection, killed at the COMMIT of the copy from the hot store
        def __init__(self, conn):
            self.conn = conn
        def execute(self, sql, *args):
            if sql == "COMMIT":
                print("COPYING", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            return self.conn.execute(sql, *args)
        def __getattr__(self, name):
            return getattr(self.conn, name)

    store = SpanStore(sys.argv[1])
    store.enqueue([Rollout(rollout_id="r0", input={}), Rollout(rollout_id="r1", input={})])
    rollout, attempt = store.dequeue("w")
    spans = [Span(rollout_id="r0", attempt_id=attempt.attempt_id, name="chat", kind="llm_call", span_id=f"c{k}",
                  llm=LLMCall(model="m", prompt_token_ids=[k, 1, 2], response_token_ids=[k])) for k in range(3)]
    store.finish_attempt(attempt.attempt_id, "succeeded", spans)
    store._conn = KilledAtCommit(store._conn)
    store.count_rollouts()  # a read: copies into DuckDB first, and dies before that copy commits
    """
)


def test_a_copy_into_duckdb_cut_short_is_made_again_once(tmp_path: Path) -> None:
    """Writes live in the hot store (SQLite) until a read copies them into DuckDB, in one transaction with
    the stamp it reached: a process killed inside that copy loses nothing and duplicates nothing."""
    path = tmp_path / "s.duckdb"
    proc = subprocess.run([sys.executable, "-c", COPY_KILLED, str(path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == -9 and "COPYING" in proc.stdout, proc.stderr
    with SpanStore(path) as store:
        assert {r.rollout_id: r.status for r in store.list_rollouts()} == {"r0": "succeeded", "r1": "queuing"}
        assert store.spans_table(columns=["span_id"])["span_id"].to_pylist() == ["c0", "c1", "c2"]
        assert store.dequeue()[0].rollout_id == "r1"
    with SpanStore(path) as store:  # reopened after a clean close: still once
        assert store.query("SELECT count(*) AS n FROM spans")["n"].to_pylist() == [3]
        assert store.count_rollouts(["running", "preparing"]) == 1


def test_a_copied_duckdb_file_keeps_its_queue_and_a_replaced_one_drops_the_old(tmp_path: Path) -> None:
    """The hot store sits beside the DuckDB file (``<db>.hot.sqlite``). A DuckDB file copied without it
    rebuilds it (the queue goes on where it was); a DuckDB file replaced under an old one gets a new one."""
    import shutil

    src, copy = tmp_path / "a.duckdb", tmp_path / "copy.duckdb"
    with SpanStore(src) as store:
        store.enqueue([Rollout(rollout_id=f"r{i}", input={"i": i}) for i in range(3)])
        store.dequeue("w")
    assert (tmp_path / "a.duckdb.hot.sqlite").exists()
    shutil.copy(src, copy)
    with SpanStore(copy) as store:
        assert store.dequeue()[0].rollout_id == "r1"  # r0 was taken before the copy
        with pytest.raises(InvalidSpanError, match="already exists"):
            store.enqueue([Rollout(rollout_id="r0", input={})])
    src.unlink()  # a fresh DuckDB file where the old one was; the old hot store is still there
    with SpanStore(src) as store:
        assert store.list_rollouts() == [] and store.dequeue() is None
        store.enqueue([Rollout(rollout_id="r0", input={})])
    with SpanStore(src) as store:
        assert [r.rollout_id for r in store.list_rollouts()] == ["r0"]


class CountedCommits:
    """DuckDB's connection, counting the copies from the hot store (their COMMITs); ``hold`` keeps a copy at
    its COMMIT until it is set."""

    def __init__(self, conn: object) -> None:
        self.conn, self.copies, self.hold = conn, 0, threading.Event()
        self.hold.set()

    def execute(self, sql: str, *args: object) -> object:
        if sql == "COMMIT":
            self.copies += 1
            assert self.hold.wait(60), "the copy was held for a minute"
        return self.conn.execute(sql, *args)

    def __getattr__(self, name: str) -> object:
        return getattr(self.conn, name)



def test_a_write_never_waits_for_a_copy_into_duckdb(tmp_path: Path) -> None:
    """Copies into DuckDB run on the store's copier thread: writes return while one is stuck, and a read
    waits for it and then sees every write (acknowledged = readable)."""
    from spanlab.store import duckdb_store

    with SpanStore(tmp_path / "s.duckdb", copy_interval_s=60) as store:
        store.enqueue([Rollout(rollout_id="r", input={})])
        _, attempt = store.dequeue("w")
        store._conn = duck = CountedCommits(store._conn)
        duck.hold.clear()  # the next copy sticks at its COMMIT
        n = 2 * duckdb_store._COPY_EVERY + 10
        writes = threading.Thread(target=lambda: [store.add_metrics("run", "grpo", i, {"x": i}) for i in range(n)])
        writes.start()
        writes.join(60)
        assert not writes.is_alive(), "a write waited for the copy into DuckDB"
        assert duck.copies == 1  # the copier took the first _COPY_EVERY writes, and is stuck there
        got: list[int] = []
        reader = threading.Thread(target=lambda: got.append(len(store.metrics("run"))))
        reader.start()
        reader.join(0.2)
        assert reader.is_alive() and not got  # the read waits for the copy: it must see every write
        duck.hold.set()
        reader.join(60)
        assert got == [n]
        assert store.heartbeat(attempt.attempt_id).status == "running"


def test_writes_without_reads_reach_duckdb_by_size_and_by_age(tmp_path: Path) -> None:
    """A process that only writes (a gateway's store) still gets its writes into DuckDB: a copy every
    ``_COPY_EVERY`` writes, one copy at a time however many threads write, and one ``copy_interval_s``
    after fewer writes, so the hot store never holds a large backlog for the next read."""
    from spanlab.store import duckdb_store

    with SpanStore(tmp_path / "s.duckdb", copy_interval_s=3600) as store:
        store._conn = duck = CountedCommits(store._conn)
        threads, each = 16, 4 * duckdb_store._COPY_EVERY // 16
        workers = [threading.Thread(target=lambda t=t: [store.add_metrics(f"run{t}", "grpo", i, {"x": i})
                                                        for i in range(each)]) for t in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        assert wait_until(lambda: store._synced >= 3 * duckdb_store._COPY_EVERY)  # no read asked for it
        assert 1 <= duck.copies <= 4  # at most one per _COPY_EVERY writes: none made twice
        with store._lock:  # the background copier may be copying the last writes on this connection right now
            copied = store._conn.execute("SELECT count(*) FROM train_metrics").fetchall()[0][0]
        assert copied >= 3 * duckdb_store._COPY_EVERY
    with SpanStore(tmp_path / "s.duckdb", copy_interval_s=0.05) as store:
        store.add_metrics("run", "grpo", 0, {"late": 1.0})  # one write: copied by age
        assert wait_until(lambda: store._synced == store._writer.last_stamp)


def test_writes_that_queue_up_share_one_commit_and_fail_alone(tmp_path: Path) -> None:
    """Writes waiting while another holds the hot store commit together (one fsync for all), each in a
    savepoint of its own: the one that fails is rolled back alone, the others are stored."""
    with SpanStore(tmp_path / "s.duckdb") as store:
        store.enqueue([Rollout(rollout_id="taken", input={})])
        writer = store._writer
        writer._conn = lite = CountedCommits(writer._conn)
        outcomes: dict[str, object] = {}

        def enqueue(rollout_id: str) -> None:
            try:
                outcomes[rollout_id] = store.enqueue([Rollout(rollout_id=rollout_id, input={})])[0].status
            except InvalidSpanError as exc:
                outcomes[rollout_id] = exc

        with writer._lock:  # a write under way: the next four queue up behind it
            threads = [threading.Thread(target=enqueue, args=(r,)) for r in ("a", "b", "taken", "c")]
            for t in threads:
                t.start()
            assert wait_until(lambda: len(writer._queue) == 4)
        for t in threads:
            t.join(30)
        assert lite.copies == 1  # one COMMIT for the four
        assert {r: outcomes[r] for r in "abc"} == {"a": "queuing", "b": "queuing", "c": "queuing"}
        assert isinstance(outcomes["taken"], InvalidSpanError)
        assert sorted(r.rollout_id for r in store.list_rollouts()) == ["a", "b", "c", "taken"]
