"""``spanlab sql`` reads every acknowledged write of a store server that was stopped by a signal: from the file
(the writes only its hot file holds are copied in first), and through a fresh server with ``--url``.

Real processes for the servers: ``spanlab store serve`` takes the writes over HTTP and is killed (SIGTERM, the
plain ``kill``, and SIGKILL, which skips every goodbye), and a fresh one serves the file. ``spanlab sql`` runs
in this process (typer's runner: the CLI's parsing, exit code, stdout and stderr) where the file or the server it
reads belongs to another process anyway, and as the console command where this process holds the file itself
(a DuckDB reader of the same file in one process is another case than in two).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from spanlab.cli import app
from spanlab.types import reward_span
from tests.conftest import llm_span
from tests.stores import SPANLAB, TOKEN, ServerProcess

COUNT = "SELECT count(*) AS n FROM spans"


def spanlab_sql(*args: str) -> subprocess.CompletedProcess:
    """``spanlab sql ... -f json`` through the CLI's app in this process."""
    env = {"SPANLAB_DB": None, "SPANLAB_STORE_TOKEN": None, "COLUMNS": "1000"}
    result = CliRunner().invoke(app, ["sql", *args, "-f", "json"], env=env)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return subprocess.CompletedProcess(args, result.exit_code, result.stdout, result.stderr)


def spanlab_sql_process(*args: str) -> subprocess.CompletedProcess:
    """``spanlab sql ... -f json`` as the console command."""
    env = {k: v for k, v in os.environ.items() if k not in ("SPANLAB_DB", "SPANLAB_STORE_TOKEN")} | {"COLUMNS": "1000"}
    return subprocess.run([SPANLAB, "sql", *args, "-f", "json"], capture_output=True, text=True, timeout=120,
                          env=env)


def _killed_store(db: Path, sig: int) -> set[str]:
    """A store server that acknowledged a few spans (fewer than a copy into DuckDB waits for), then ``sig``."""
    server = ServerProcess(db).start()
    acked: set[str] = set()
    with server.client() as client:
        for i in range(3):
            client.enqueue_one({"i": i})
            rollout, attempt = client.dequeue()
            spans = [llm_span(rollout, attempt, seed=i, span_id=f"s{i}"), reward_span(rollout.rollout_id,
                                                                                      attempt.attempt_id, 1.0)]
            client.finish_attempt(attempt.attempt_id, "succeeded", spans)
            acked |= {s.span_id for s in spans}
    server.stop(sig)
    return acked


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_a_killed_servers_writes_are_read_from_the_file_and_a_fresh_server(tmp_path: Path, sig: int) -> None:
    db = tmp_path / "spans.duckdb"
    acked = _killed_store(db, sig)
    out = spanlab_sql("SELECT span_id FROM spans", "--db", str(db))
    assert out.returncode == 0, out.stderr
    assert {r["span_id"] for r in json.loads(out.stdout)} == acked
    fresh = ServerProcess(db).start()
    try:
        out = spanlab_sql("SELECT status, count(*) AS n FROM rollouts GROUP BY 1", "--url", fresh.url,
                          "--token", TOKEN)
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout) == [{"status": "succeeded", "n": 3}]
        out = spanlab_sql(COUNT, "--url", fresh.url, "--token", "wrong")
        assert out.returncode == 2 and "token" in out.stderr
        held = spanlab_sql(COUNT, "--db", str(db))  # the file is the fresh server's: the error says --url
        assert held.returncode == 2 and "spanlab sql --url" in held.stderr, held.stderr
    finally:
        fresh.stop()


def test_writes_that_cannot_be_copied_now_are_a_warning(tmp_path: Path) -> None:
    """Another process reading the file keeps it from being opened for writing: the query runs on what DuckDB
    holds and says how many writes it misses."""
    db = tmp_path / "spans.duckdb"
    _killed_store(db, signal.SIGKILL)
    reader = duckdb.connect(str(db), read_only=True)
    try:
        out = spanlab_sql_process(COUNT, "--db", str(db))
    finally:
        reader.close()
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [{"n": 0}]
    assert "writes are only in its hot file" in out.stderr and "misses them" in out.stderr, out.stderr
