"""The span journal: small batches wait in an fsync'd journal, reads see them, a SIGKILL loses none."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from spanlab.errors import InvalidSpanError
from spanlab.store import SpanStore
from spanlab.store.append_file import count_records, scan_frames
from spanlab.store.arrow import spans_to_arrow
from spanlab.types import LLMCall, Rollout, Span, reward_span

COLUMNS = ["span_id", "rollout_id", "attempt_id", "sequence_id", "kind", "attributes", "prompt_token_ids",
           "response_token_ids", "reward_value"]


def _calls(rollout_id: str, attempt_id: str, n: int, seed: int, prompt: int = 30) -> list[Span]:
    rng = np.random.default_rng(seed)
    return [Span(rollout_id=rollout_id, attempt_id=attempt_id, name="chat", kind="llm_call", attributes={"k": k},
                 llm=LLMCall(model="m", prompt_token_ids=rng.integers(0, 1000, prompt).tolist(),
                             response_token_ids=rng.integers(0, 1000, 5).tolist()))
            for k in range(n)]


def _journal(path: Path) -> Path:
    return Path(f"{path}.journal")


def _fill(store: SpanStore, n_rollouts: int = 4) -> list[str]:
    """n rollouts, each finished with 3 LLM calls and a reward (one call each)."""
    store.enqueue([Rollout(rollout_id=f"r{i}", input={"i": i}) for i in range(n_rollouts)])
    for i in range(n_rollouts):
        rollout, attempt = store.dequeue("w")
        spans = _calls(rollout.rollout_id, attempt.attempt_id, 3, i)
        store.finish_attempt(attempt.attempt_id, "succeeded", [*spans, reward_span(rollout.rollout_id,
                                                                                    attempt.attempt_id, 1.0)])
    return [f"r{i}" for i in range(n_rollouts)]


def _reads(store: SpanStore, ids: list[str]) -> list[pa.Table]:
    return [store.spans_reader(columns=COLUMNS).read_all(),
            store.spans_reader(rollout_ids=ids[1:3], columns=COLUMNS).read_all(),
            store.spans_reader(rollout_ids=ids, kinds=["reward"], columns=COLUMNS).read_all(),
            store.spans_reader(attempt_ids=[], columns=COLUMNS).read_all(),
            store.spans_table()]


def test_buffered_spans_read_the_same_as_inserted_ones(tmp_path: Path) -> None:
    path = tmp_path / "s.duckdb"
    with SpanStore(path, span_flush_s=3600, queue_flush_s=3600) as store:
        ids = _fill(store)
        assert count_records(_journal(path)) > 0
        buffered = _reads(store, ids)  # every span still in the journal: read from memory
        store.query("SELECT 1")  # SQL inserts them first
        assert count_records(_journal(path)) == 0
        inserted = _reads(store, ids)
        for got, want in zip(buffered, inserted, strict=True):
            assert got.schema == want.schema
            assert got.to_pylist() == want.to_pylist()
        assert [t.num_rows for t in inserted] == [16, 8, 4, 0, 16]
        # some in the table, some buffered: one read, still in order
        rollout_ids = _fill_more(store)
        mixed = store.spans_reader(rollout_ids=[ids[0], rollout_ids[0]], columns=COLUMNS).read_all()
        assert mixed.num_rows == 8
        assert mixed["rollout_id"].to_pylist() == ["q0"] * 4 + ["r0"] * 4  # q0 buffered, r0 in the table
        assert mixed.schema == inserted[0].schema
        # one batch whose spans alternate between two attempts: scattered rows, still read in order
        store.enqueue([Rollout(rollout_id=f"z{i}", input={}) for i in range(2)])
        (_, a0), (_, a1) = store.dequeue("w"), store.dequeue("w")
        calls = [c for pair in zip(_calls("z0", a0.attempt_id, 8, 3), _calls("z1", a1.attempt_id, 8, 4), strict=True)
                 for c in pair]
        store.add_spans(calls)
        got = store.spans_reader(rollout_ids=["z0", "z1"], columns=COLUMNS).read_all()
        store.query("SELECT 1")
        want = store.spans_reader(rollout_ids=["z0", "z1"], columns=COLUMNS).read_all()
        assert got.to_pylist() == want.to_pylist() and got["rollout_id"].to_pylist() == ["z0"] * 8 + ["z1"] * 8
    assert not _journal(path).exists()  # close inserts and removes it


def _fill_more(store: SpanStore) -> list[str]:
    store.enqueue([Rollout(rollout_id="q0", input={})])
    _, attempt = store.dequeue("w")
    store.finish_attempt(attempt.attempt_id, "succeeded", [*_calls("q0", attempt.attempt_id, 3, 9),
                                                           reward_span("q0", attempt.attempt_id, 0.0)])
    return ["q0"]


def test_spans_reach_the_table_when_due_or_a_row_group_is_full(tmp_path: Path) -> None:
    path = tmp_path / "s.duckdb"
    with SpanStore(path, span_flush_s=0) as store:  # due at once: every write inserts what waits
        _fill(store, 2)
        assert count_records(_journal(path)) == 0
    with SpanStore(path, span_flush_s=3600, queue_flush_s=3600) as store:  # (a queue write inserts spans too)
        store.enqueue([Rollout(rollout_id="big", input={})])
        _, attempt = store.dequeue("w")

        def in_table() -> int:
            return store._cursor().execute("SELECT count(*) FROM spans WHERE rollout_id = 'big'").fetchall()[0][0]

        store.add_spans(_calls("big", attempt.attempt_id, 5, 0))
        assert count_records(_journal(path)) > 0 and in_table() == 0
        assert store.add_spans(_calls("big", attempt.attempt_id, 2048, 1)) == 2048  # a row group: straight in
        assert in_table() == 2048
        assert store.add_spans(_calls("big", attempt.attempt_id, 450, 9, prompt=2500)) == 450  # > 4 MB: straight in
        assert in_table() == 2498
        for seed in range(2, 7):  # 5 + 4 x 500 wait; the fifth 500 would make a row group: what waits goes in
            store.add_spans(_calls("big", attempt.attempt_id, 500, seed))
        assert in_table() == 2498 + 2005 and count_records(_journal(path)) > 0
        assert store.spans_reader(rollout_ids=["big"], columns=["span_id"]).read_all().num_rows == 5003


def test_a_bad_batch_is_refused_and_loses_nothing_buffered(tmp_path: Path) -> None:
    path = tmp_path / "s.duckdb"
    with SpanStore(path, span_flush_s=3600, queue_flush_s=3600) as store:
        ids = _fill(store, 2)
        store.enqueue([Rollout(rollout_id="x", input={})])
        _, attempt = store.dequeue("w")
        # the buffered path (checked by spanlab: NaN is not JSON), the row-group path (checked by DuckDB)
        for n, bad, message in ((3, '{"x": NaN}', "span #2 .*not valid JSON"), (2048, "{oops", "rejected by DuckDB")):
            tbl = spans_to_arrow(_calls("x", attempt.attempt_id, n, 2))
            tbl = tbl.set_column(tbl.schema.get_field_index("attributes"), "attributes",
                                 pa.array(['{"ok": 1}'] * (n - 1) + [bad], pa.string()))
            with pytest.raises(InvalidSpanError, match=message):
                store.add_span_table(tbl)
        assert store.spans_table(rollout_ids=["x"]).num_rows == 0
        assert store.spans_table(rollout_ids=ids).num_rows == 8
    with SpanStore(path) as store:
        assert store.spans_table().num_rows == 8


def test_unattributed_spans_are_deduplicated_while_buffered(tmp_path: Path) -> None:
    path = tmp_path / "s.duckdb"
    with SpanStore(path, span_flush_s=3600, queue_flush_s=3600) as store:
        span = Span(span_id="gw-1", name="chat", kind="llm_call", llm=LLMCall(model="m"))
        assert store.add_spans([span]) == 1
        assert store.add_spans([span]) == 0  # a retried gateway write
        assert store.query("SELECT count(*) AS n FROM spans").to_pylist() == [{"n": 1}]
        assert store.add_spans([span]) == 0  # and once inserted


CHILD = textwrap.dedent(
    """
    import os, signal, sys
    sys.path.insert(0, sys.argv[2])
    from test_store_span_journal import _fill
    from spanlab.store import SpanStore

    store = SpanStore(sys.argv[1], span_flush_s=3600, queue_flush_s=3600)
    _fill(store, 5)
    print("ACK", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


def test_sigkill_loses_no_acknowledged_span_and_replays_none_twice(tmp_path: Path) -> None:
    path = tmp_path / "s.duckdb"
    proc = subprocess.run([sys.executable, "-c", CHILD, str(path), str(Path(__file__).parent)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == -9 and "ACK" in proc.stdout, proc.stderr
    journal = _journal(path)
    assert count_records(journal) > 0
    saved = tmp_path / "journal-copy"
    shutil.copy(journal, saved)
    with SpanStore(path) as store:
        assert count_records(journal) == 0  # inserted on open
        counts = store.query("SELECT rollout_id, count(*) AS n, sum(reward_value) AS r FROM spans "
                             "GROUP BY rollout_id ORDER BY rollout_id").to_pylist()
        assert counts == [{"rollout_id": f"r{i}", "n": 4, "r": 1.0} for i in range(5)]
        assert {r.status for r in store.list_rollouts()} == {"succeeded"}  # finishes needed their spans
    # a crash between an insert's commit and the journal's truncation: the same records again
    shutil.copy(saved, journal)
    with SpanStore(path) as store:
        assert store.query("SELECT count(*) AS n FROM spans").to_pylist() == [{"n": 20}]


def test_a_torn_last_record_is_dropped_and_a_corrupt_one_kept_aside(tmp_path: Path) -> None:
    path = tmp_path / "s.duckdb"
    proc = subprocess.run([sys.executable, "-c", CHILD, str(path), str(Path(__file__).parent)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == -9, proc.stderr
    journal = _journal(path)
    data = journal.read_bytes()
    end = scan_frames(data).end  # after the records: preallocated zeros
    assert end < len(data) and not data[end:].strip(b"\0")
    # the last finish's record cut short (never acknowledged), in front of the zeros as on disk
    journal.write_bytes(data[:end - 100] + bytes(len(data) - end + 100))
    with SpanStore(path) as store:
        assert store.query("SELECT count(*) AS n FROM spans").to_pylist() == [{"n": 16}]
        assert store.get_rollout("r4").status == "preparing"  # its finish needed the lost spans
        assert not list(tmp_path.glob("*.unreadable-*"))
    path.unlink()
    bad = bytearray(data)
    bad[40] ^= 0xFF  # inside the first record, with more records after it
    journal.write_bytes(bytes(bad))
    with SpanStore(path) as store:
        assert store.query("SELECT count(*) AS n FROM spans").to_pylist() == [{"n": 0}]
    (kept,) = tmp_path.glob("*.journal.unreadable-*")
    assert kept.read_bytes() == bytes(bad)  # nothing deleted


def test_a_failed_journal_write_stores_nothing_and_leaves_no_partial_record(tmp_path: Path, monkeypatch) -> None:
    import spanlab.store.append_file as append_file
    from spanlab.errors import StoreError
    from spanlab.store.journal_file import read_leftovers

    path = tmp_path / "s.duckdb"
    with SpanStore(path, span_flush_s=3600, queue_flush_s=3600) as store:
        store.enqueue([Rollout(rollout_id="r", input={})])
        _, attempt = store.dequeue("w")
        assert store.add_spans(_calls("r", attempt.attempt_id, 2, 0)) == 2

        def disk_full(fd: int) -> None:
            raise OSError(28, "No space left on device")

        spans = _calls("r", attempt.attempt_id, 2, 1)
        monkeypatch.setattr(append_file.os, "fdatasync", disk_full)
        with pytest.raises(StoreError, match="No space left on device"):
            store.add_spans(spans)
        monkeypatch.undo()
        assert store.spans_table(rollout_ids=["r"]).num_rows == 2
        assert store.add_spans(spans) == 2  # not taken for stored: the retry counts
        left = read_leftovers(str(path))
        assert not left.unreadable and left.spans.num_rows == 4  # the failed record was cut off the file


def test_a_flush_duckdb_refuses_keeps_the_spans_journaled(tmp_path: Path, monkeypatch) -> None:
    from spanlab.errors import StoreError

    path = tmp_path / "s.duckdb"
    with SpanStore(path, span_flush_s=3600, queue_flush_s=3600) as store:
        ids = _fill(store, 2)

        def refused(self: SpanStore, tbl: pa.Table) -> None:
            raise InvalidSpanError("rejected by DuckDB: (simulated)")

        monkeypatch.setattr(SpanStore, "_insert_into_table", refused)
        with pytest.raises(StoreError, match=r"stay in .*\.journal"):
            store.query("SELECT count(*) FROM spans")
        assert store.spans_table(rollout_ids=ids).num_rows == 8  # still readable where they wait
        monkeypatch.undo()
        assert store.query("SELECT count(*) AS n FROM spans").to_pylist() == [{"n": 8}]


def test_reads_skip_duckdb_only_for_rollouts_the_table_cannot_have(tmp_path: Path, monkeypatch) -> None:
    """A rollout whose first attempt opened in this session has no row in the table until one is inserted; a
    read of such rollouts whose spans all wait in the journal asks DuckDB nothing. Once a row is in the table
    (a flush, or anything written through ``query``), reads ask it again."""
    from spanlab.types import RolloutConfig

    with SpanStore(tmp_path / "s.duckdb", span_flush_s=3600, queue_flush_s=3600) as store:
        store.enqueue([Rollout(rollout_id="r", input={}, config=RolloutConfig(max_attempts=2)),
                       Rollout(rollout_id="s", input={}), Rollout(rollout_id="u", input={})])
        (_, a1), (_, b1), (_, c1) = store.dequeue("w"), store.dequeue("w"), store.dequeue("w")
        store.finish_attempt(a1.attempt_id, "failed", _calls("r", a1.attempt_id, 2, 0))  # r waits for a retry
        store.add_spans(_calls("s", b1.attempt_id, 2, 1))
        cursors: list[int] = []
        real_cursor = store._cursor
        monkeypatch.setattr(store, "_cursor", lambda: cursors.append(1) or real_cursor())

        assert store.spans_reader(rollout_ids=["r", "s"], columns=COLUMNS).read_all().num_rows == 4
        assert cursors == []  # all waiting, and none can be in the table

        store.list_rollouts()  # writes the journal to the tables (not through query())
        _, a2 = store.dequeue("w")  # r's retry: its spans wait, its first attempt's are in the table
        assert (a2.rollout_id, a2.sequence_id) == ("r", 2)
        store.add_spans(_calls("r", a2.attempt_id, 3, 2))
        got = store.spans_reader(rollout_ids=["r"], columns=COLUMNS).read_all()
        assert sorted(got["attempt_id"].to_pylist()) == sorted([a1.attempt_id] * 2 + [a2.attempt_id] * 3)
        assert cursors  # the table was asked

        # u: first attempt open, nothing stored yet; a row written through SQL
        store.query(f"INSERT INTO spans SELECT * REPLACE ('by-sql' AS span_id, 'u' AS rollout_id, "
                    f"'{c1.attempt_id}' AS attempt_id) FROM spans LIMIT 1")
        store.add_spans(_calls("u", c1.attempt_id, 2, 3))
        got = store.spans_reader(rollout_ids=["u"], columns=COLUMNS).read_all()
        assert sorted(got["span_id"].to_pylist())[0] == "by-sql" and got.num_rows == 3
