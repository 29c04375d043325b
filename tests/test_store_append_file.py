"""The journal's file format: generations, preallocation, and files of earlier versions (real files)."""

from __future__ import annotations

from pathlib import Path

import pytest

from spanlab.errors import StoreError
from spanlab.store.append_file import PREALLOC_MIN, AppendFile, framed, read_frames, scan_frames


def test_a_cleared_file_keeps_its_blocks_and_hides_the_last_generation(tmp_path: Path) -> None:
    path = tmp_path / "j"
    f = AppendFile(path)
    f.append(b"first " * 1000, b"second " * 1000)
    f.append(b"third " * 1000)
    size = path.stat().st_size
    assert size >= PREALLOC_MIN  # zeros written ahead: later fsyncs commit no new file size
    f.clear()
    f.append(b"other " * 1000)  # as long as "first": the last generation's next record starts where it ends
    assert path.stat().st_size == size  # reused, not truncated
    assert read_frames(path) == ([b"other " * 1000], True)
    f.clear()
    assert read_frames(path) == ([], True)
    f.close(remove=False)


def test_a_corrupt_record_with_good_ones_after_it_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "j"
    f = AppendFile(path)
    f.append(b"a" * 100, b"b" * 100, b"c" * 100)
    f.close(remove=False)
    data = bytearray(path.read_bytes())
    data[16 + 12 + 50] ^= 0xFF  # inside the first record's body
    path.write_bytes(bytes(data))
    assert read_frames(path) == ([], False)
    data[16 + 12 + 50] ^= 0xFF
    data[16 + 2 * 112 + 12 + 50] ^= 0xFF  # inside the last: a torn last record, not corruption
    path.write_bytes(bytes(data))
    assert read_frames(path) == ([b"a" * 100, b"b" * 100], True)


def test_files_without_a_header_are_read_as_before(tmp_path: Path) -> None:
    """What versions before generations wrote: plain CRCs, the records run to the end of the file."""
    path = tmp_path / "old"
    records = b"".join(b"".join(framed(body)) for body in (b"x" * 10, b"y" * 20))
    path.write_bytes(records + b"".join(framed(b"z" * 30))[:-3])
    assert read_frames(path) == ([b"x" * 10, b"y" * 20], True)  # the torn last record dropped
    path.write_bytes(records[:20] + b"!" + records[21:])
    assert read_frames(path) == ([], False)
    frames = scan_frames(records)
    assert (frames.end, frames.complete) == (len(records), True)


def test_a_failed_append_leaves_nothing_after_the_records(tmp_path: Path, monkeypatch) -> None:
    import spanlab.store.append_file as append_file

    path = tmp_path / "j"
    f = AppendFile(path)
    f.append(b"kept")

    def disk_full(fd: int) -> None:
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as m:
        m.setattr(append_file.os, "fdatasync", disk_full)
        with pytest.raises(StoreError, match="nothing of this write was stored"):
            f.append(b"lost" * 1000)
    assert path.stat().st_size == scan_frames(path.read_bytes()).end  # the record and the zeros cut off
    f.append(b"next")
    assert read_frames(path) == ([b"kept", b"next"], True)
    f.close(remove=True)
    assert not path.exists()


def test_a_journal_left_on_disk_is_never_overwritten(tmp_path: Path) -> None:
    path = tmp_path / "j"
    path.write_bytes(b"".join(framed(b"not replayed yet")))
    with pytest.raises(StoreError, match="must be replayed"):
        AppendFile(path)
    assert read_frames(path) == ([b"not replayed yet"], True)
