"""Faults: SIGKILL during ingest, a locked file, a corrupt file. Nothing acknowledged or stored is lost."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import duckdb
import pytest

from spanlab.errors import StoreError, StoreLockedError
from spanlab.store import SpanStore
from spanlab.store.file_query import run_query

WRITER = textwrap.dedent(
    """
    import sys
    from spanlab.store import SpanStore
    from spanlab.types import LLMCall, Span

    path, batch = sys.argv[1], int(sys.argv[2])
    store = SpanStore(path)
    store.enqueue_one({"kill": True})
    rollout, attempt = store.dequeue()
    print("ATTEMPT", rollout.rollout_id, attempt.attempt_id, flush=True)
    b = 0
    while True:
        spans = [
            Span(rollout_id=rollout.rollout_id, attempt_id=attempt.attempt_id, span_id=f"b{b}-{j}", name="c",
                 kind="llm_call", llm=LLMCall(model="m", prompt_token_ids=list(range(j % 97, j % 97 + 64)),
                                              response_token_ids=[b, j]))
            for j in range(batch)
        ]
        store.add_spans(spans)
        print("ACK", b, flush=True)  # printed only after add_spans returned
        b += 1
    """
)


@pytest.mark.parametrize("batch", [7, 2100], ids=["wal-batches", "row-group-batches"])
def test_sigkill_during_ingest_loses_no_acknowledged_span(tmp_path: Path, batch: int) -> None:
    path = tmp_path / "killed.duckdb"
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path), str(batch)], stdout=subprocess.PIPE, text=True)
    acked = -1
    try:
        assert proc.stdout is not None
        header = proc.stdout.readline().split()
        assert header[0] == "ATTEMPT", header
        for line in proc.stdout:
            acked = int(line.split()[1])
            if acked >= 3:
                break
    finally:
        os.kill(proc.pid, signal.SIGKILL)  # mid-way through the next batch, most likely
        proc.wait()
    assert acked >= 3
    with SpanStore(path) as store:
        ids = set(store.spans_table(columns=["span_id"])["span_id"].to_pylist())
        for b in range(acked + 1):
            missing = [f"b{b}-{j}" for j in range(batch) if f"b{b}-{j}" not in ids]
            assert not missing, f"acknowledged batch {b} lost {len(missing)} spans"
        assert len(ids) % batch == 0, "a batch was stored partially"
        rows = store.query("SELECT response_token_ids FROM llm_calls WHERE span_id = 'b1-5'").to_pylist()
        assert rows == [{"response_token_ids": [1, 5]}]
        # the store still works after recovery
        (attempt_id,) = store.query("SELECT attempt_id FROM attempts").to_pylist()[0].values()
        assert store.finish_attempt(attempt_id, "succeeded").status == "succeeded"


HOLDER = (
    "import sys, time\nfrom spanlab.store import SpanStore\n"
    "s = SpanStore(sys.argv[1])\nprint('READY', flush=True)\ntime.sleep(60)\n"
)


def test_locked_file_gives_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "locked.duckdb"
    with SpanStore(path) as store:
        store.enqueue_one({"keep": "me"})
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "READY"
        with pytest.raises(StoreLockedError, match=rf"held read-write by another process \(PID {holder.pid}\)"):
            SpanStore(path)
        with pytest.raises(StoreLockedError, match="store server"):
            run_query(path, "SELECT 1")
    finally:
        holder.kill()
        holder.wait()
    with SpanStore(path) as store:
        assert [r.input for r in store.list_rollouts()] == [{"keep": "me"}]


def test_corrupt_file_is_reported_and_left_untouched(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.duckdb"
    garbage.write_bytes(b"this is not a database\n" * 100)
    before = garbage.read_bytes()
    with pytest.raises(StoreError, match="not a readable DuckDB database"):
        SpanStore(garbage)
    with pytest.raises(StoreError, match="not a readable DuckDB database"):
        run_query(garbage, "SELECT 1")
    assert garbage.read_bytes() == before

    good = tmp_path / "truncated.duckdb"
    with SpanStore(good) as store:
        store.enqueue_one({})
    data = good.read_bytes()
    good.write_bytes(data[: len(data) // 3])
    cut = good.read_bytes()
    with pytest.raises(StoreError):
        SpanStore(good)
    assert good.read_bytes() == cut


def test_a_flipped_block_is_called_corrupt_not_locked_and_left_untouched(tmp_path: Path) -> None:
    """Issue 42, item 6: DuckDB's "checksum ... for block" read as a lock ("block" holds "lock")."""
    path = tmp_path / "flipped.duckdb"
    with SpanStore(path) as store:
        store.enqueue([{"input": i} for i in range(50)])
    data = bytearray(path.read_bytes())
    data[12288:12288 + 64] = bytes(b ^ 0xFF for b in data[12288:12288 + 64])  # the first block after the headers
    path.write_bytes(bytes(data))
    with pytest.raises(StoreError, match=r"not a readable DuckDB database.*checksum") as err:
        SpanStore(path)
    assert not isinstance(err.value, StoreLockedError)
    assert path.read_bytes() == bytes(data)


def test_a_corrupt_hot_file_fails_the_open_and_leaves_both_files_as_they_were(tmp_path: Path) -> None:
    path = tmp_path / "s.duckdb"
    with SpanStore(path) as store:
        store.enqueue_one({"keep": "me"})
    hot = Path(f"{path}.hot.sqlite")
    hot.write_bytes(b"not sqlite at all" * 1000)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    with pytest.raises(StoreError, match=r"hot file .*hot\.sqlite is not a readable SQLite database"):
        SpanStore(path)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    hot.unlink()  # moved aside: rebuilt from DuckDB
    with SpanStore(path) as store:
        assert [r.input for r in store.list_rollouts()] == [{"keep": "me"}]


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "future.duckdb"
    SpanStore(path).close()
    with duckdb.connect(str(path)) as conn:
        conn.execute("UPDATE spanlab_meta SET value = '999' WHERE key = 'schema_version'")
    with pytest.raises(StoreError, match="newer spanlab"):
        SpanStore(path)
