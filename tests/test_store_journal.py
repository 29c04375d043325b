"""The queue journal: transitions acknowledged before a SIGKILL are all there after reopening, none twice."""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys
import textwrap
import zlib
from pathlib import Path

import pytest

from spanlab.errors import StoreError
from spanlab.store import SpanStore
from spanlab.store.append_file import count_records, framed, scan_frames
from spanlab.types import Rollout, RolloutConfig

# A worker's life in a child process that kills itself (SIGKILL: no close, no flush) once every call
# below has returned. queue_flush_s is huge, so the tables see nothing: only the journal holds the queue,
# from the enqueue on.
CHILD = textwrap.dedent(
    """
    import os, signal, sys
    from spanlab.store import SpanStore
    from spanlab.types import Rollout, RolloutConfig, reward_span

    store = SpanStore(sys.argv[1], queue_flush_s=3600)
    cfg = RolloutConfig(max_attempts=2)
    store.enqueue([Rollout(rollout_id=f"r{i}", input={"i": i}, config=cfg) for i in range(4)])
    (r0, a0), (r1, a1), (r2, a2) = store.dequeue("w"), store.dequeue("w"), store.dequeue("w")
    store.finish_attempt(a0.attempt_id, "succeeded", [reward_span(r0.rollout_id, a0.attempt_id, 1.0)])
    store.finish_attempt(a1.attempt_id, "failed")
    store.heartbeat(a2.attempt_id)
    store.heartbeat(a2.attempt_id)
    if sys.argv[2] == "crash-inside-finish":  # killed mid-append: the finish's record written, its spans' cut short
        from spanlab.store.span_journal import SpanJournal

        def torn(self, tbl, before=()):
            self.file._file.write(b"".join(bytes(part) for part in before) + b"\\x10\\x00")
            self.file._file.flush()
            os.kill(os.getpid(), signal.SIGKILL)

        SpanJournal.append = torn
        store.finish_attempt(a2.attempt_id, "succeeded", [reward_span(r2.rollout_id, a2.attempt_id, 1.0)])
    print("ACK", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


def _run_child(path: Path, mode: str) -> None:
    proc = subprocess.run([sys.executable, "-c", CHILD, str(path), mode], capture_output=True, text=True, timeout=120)
    assert proc.returncode == -9, proc.stderr
    assert ("ACK" in proc.stdout) == (mode == "plain"), proc.stdout
    assert count_records(Path(f"{path}.journal")) > 0  # the queue lived in the journal only


def _states(store: SpanStore) -> dict[str, tuple[str, int, list[str]]]:
    return {r.rollout_id: (r.status, r.num_attempts, [a.status for a in store.list_attempts(r.rollout_id)])
            for r in store.list_rollouts()}


def test_sigkill_loses_no_acknowledged_queue_transition(tmp_path: Path) -> None:
    path = tmp_path / "s.duckdb"
    _run_child(path, "plain")
    with SpanStore(path) as store:
        assert _states(store) == {
            "r0": ("succeeded", 1, ["succeeded"]),
            "r1": ("requeuing", 1, ["failed"]),
            "r2": ("running", 1, ["running"]),
            "r3": ("queuing", 0, []),
        }
        assert store.query("SELECT reward_value FROM spans WHERE rollout_id = 'r0'").to_pylist() == [
            {"reward_value": 1.0}]
        assert count_records(Path(f"{path}.journal")) == 0  # written to the tables on open
        rollout, attempt = store.dequeue()
        assert (rollout.rollout_id, attempt.sequence_id) == ("r1", 2)  # the retry, in enqueue order


def test_a_finish_cut_off_before_its_spans_never_counts(tmp_path: Path) -> None:
    path = tmp_path / "s.duckdb"
    _run_child(path, "crash-inside-finish")
    with SpanStore(path) as store:
        assert _states(store)["r2"] == ("running", 1, ["running"])  # not succeeded without its reward
        assert store.query("SELECT count(*) AS n FROM spans WHERE rollout_id = 'r2'").to_pylist() == [{"n": 0}]


def test_replaying_lines_already_written_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "s.duckdb"
    journal = Path(f"{path}.journal")
    with SpanStore(path, queue_flush_s=3600) as store:
        store.enqueue([Rollout(input={"i": i}, config=RolloutConfig(max_attempts=3)) for i in range(3)])
        for _ in range(2):
            _, attempt = store.dequeue()
            store.finish_attempt(attempt.attempt_id, "failed")
        lines = journal.read_bytes()
        before = _states(store)  # reading writes the tables; the journal is emptied
    assert not journal.exists()  # a clean close leaves no journal
    end = scan_frames(lines).end
    seed = zlib.crc32(lines[8:16])  # the generation's: a record that only its cut makes bad
    torn = b"".join(framed(b'{"rollout": {"rollout_id": "ro-torn"}}', seed))[:-5]
    # as if a crash came after the write, and cut the next append short
    journal.write_bytes(lines[:end] + torn + lines[end + len(torn):])
    with SpanStore(path) as store:
        assert _states(store) == before


def test_a_corrupt_line_in_an_old_queue_journal_is_an_error_that_changes_nothing(tmp_path: Path) -> None:
    """A ``<db>.queue-journal`` (JSON lines, what versions before the shared journal file wrote)."""
    path = tmp_path / "s.duckdb"
    with SpanStore(path) as store:
        store.enqueue_one({"q": 1})
    journal = Path(f"{path}.queue-journal")
    journal.write_bytes(b"not json\n" + b'{"rollout": {}, "attempt": {}}\n' * 2)
    with pytest.raises(StoreError, match="line 1 is corrupt"):
        SpanStore(path)
    assert journal.read_bytes().startswith(b"not json")  # left as it was, for a person to look at
    journal.unlink()
    with SpanStore(path) as store:  # the failed open let go of the file
        assert store.list_rollouts()[0].input == {"q": 1}


def test_journals_of_earlier_versions_are_replayed(tmp_path: Path) -> None:
    """``<db>.span-journal`` (framed Arrow IPC) and ``<db>.queue-journal`` (JSON lines), as versions before the
    shared journal file left them after a crash, reach the tables at the next open and are then removed."""
    from spanlab.store.append_file import read_frames
    from spanlab.types import reward_span

    before_crash, old = tmp_path / "a.duckdb", tmp_path / "b.duckdb"
    SpanStore(before_crash).close()
    shutil.copy(before_crash, old)  # the same empty store, for the old journals to be replayed into
    with SpanStore(before_crash, queue_flush_s=3600, span_flush_s=3600) as store:
        store.enqueue([Rollout(rollout_id=f"r{i}", input={"i": i}) for i in range(2)])
        rollout, attempt = store.dequeue("w")
        reward = reward_span(rollout.rollout_id, attempt.attempt_id, 1.0)
        store.finish_attempt(attempt.attempt_id, "succeeded", [reward])
        store.dequeue("w")
        bodies, complete = read_frames(Path(f"{before_crash}.journal"))
        expected = _states(store)
    assert complete
    Path(f"{old}.queue-journal").write_bytes(b"".join(b + b"\n" for b in bodies if b[:1] == b"{"))
    Path(f"{old}.span-journal").write_bytes(b"".join(b"".join(framed(b)) for b in bodies if b[:1] != b"{"))
    with SpanStore(old) as store:
        assert _states(store) == expected
        assert store.query("SELECT reward_value FROM spans").to_pylist() == [{"reward_value": 1.0}]
    assert not Path(f"{old}.queue-journal").exists() and not Path(f"{old}.span-journal").exists()


def test_a_failed_periodic_write_of_the_tables_is_logged_not_raised(tmp_path: Path, monkeypatch, caplog) -> None:
    """The dequeue's change is durable in the journal before the due write of the tables runs: that write
    failing must not make the dequeue look failed (the caller would lose the attempt it was handed)."""
    import spanlab.store.queue as queue_module

    real = queue_module.write_states

    def broken(*args, **kwargs):
        raise StoreError("disk on fire")

    with SpanStore(tmp_path / "s.duckdb", queue_flush_s=0) as store:
        store.enqueue([Rollout(rollout_id="r0", input={})])
        monkeypatch.setattr(queue_module, "write_states", broken)
        with caplog.at_level(logging.ERROR, logger="spanlab.store.duckdb_store"):
            rollout, attempt = store.dequeue(worker_id="w")
        assert "disk on fire" in caplog.text
        monkeypatch.setattr(queue_module, "write_states", real)
        assert store.get_attempt(attempt.attempt_id).status == "preparing"  # the next write wrote it
        assert store.get_rollout(rollout.rollout_id).status == "preparing"
