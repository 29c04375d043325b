"""User SQL cannot write, on every surface (issue 20, item 1), and is bounded in time and size (item 4).

Every probe below is sent to each surface: ``fetch_user_query`` on a cursor of a *writable* store (what
``StoreAPI.query`` and the server's ``/sql`` get), ``spanlab sql`` (``run_query`` on the file, read-only), the
UI's ``POST /api/sql`` and the store server's ``POST /sql``. Each must be refused with a message, and the
store must be unchanged afterwards (same tables, same rows, no file written).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from spanlab.errors import QueryError
from spanlab.store import SpanStore
from spanlab.store.file_query import run_query
from spanlab.store.server import create_store_app
from spanlab.store.sql import fetch_user_query
from spanlab.threaded_server import ThreadedServer
from spanlab.types import Rollout
from spanlab.ui import create_app

OUT = "/tmp/spanlab-probe-out"  # no probe may create this (COPY/EXPORT targets)
PROBES = [
    "EXPLAIN ANALYZE DELETE FROM rollouts",
    "EXPLAIN ANALYZE DROP TABLE spans",
    "EXPLAIN ANALYZE CREATE TABLE pwned AS SELECT 1",
    "EXPLAIN ANALYZE INSERT INTO resources VALUES ('x', 1, 'other', NULL, 0)",
    "WITH d AS (DELETE FROM rollouts RETURNING *) SELECT * FROM d",
    "WITH u AS (UPDATE rollouts SET status = 'failed' RETURNING *) SELECT count(*) FROM u",
    "WITH i AS (INSERT INTO resources VALUES ('x', 1, 'other', NULL, 0) RETURNING *) SELECT * FROM i",
    "DELETE FROM rollouts",
    "DROP TABLE spans",
    "DROP VIEW llm_calls",
    "CREATE TABLE pwned(a INT)",
    "CREATE MACRO pwned(x) AS x",
    "UPDATE rollouts SET status = 'failed'",
    "INSERT INTO resources VALUES ('x', 1, 'other', NULL, 0)",
    "ALTER TABLE rollouts ADD COLUMN pwned INT",
    "TRUNCATE spans",
    f"COPY rollouts TO '{OUT}.csv'",
    f"COPY (SELECT 1) TO '{OUT}.parquet' (FORMAT parquet)",
    f"EXPORT DATABASE '{OUT}'",
    f"ATTACH '{OUT}.duckdb' AS other",
    "DETACH spanlab",
    "SET threads = 1",
    "SET enable_external_access = true",
    "RESET enable_external_access",
    "PRAGMA enable_profiling",
    "CHECKPOINT",
    "FORCE CHECKPOINT",
    "SELECT * FROM checkpoint()",
    "SELECT * FROM force_checkpoint()",
    "VACUUM",
    "INSTALL httpfs",
    "LOAD httpfs",
    "CALL pragma_version()",
    "USE memory",
    "BEGIN",
    "COMMIT",
    "SELECT 1; DELETE FROM rollouts",
    "SELECT 1; SELECT 2",
    "SELECT * FROM read_csv('/etc/passwd')",
    "SELECT * FROM read_text('/etc/passwd')",
    "SELECT * FROM query('DELETE FROM rollouts')",
    "SELECT * FROM glob('/etc/*')",
    "CREATE SECRET s (TYPE s3, KEY_ID 'a', SECRET 'b')",
    "",
    "   ;  ",
]


def _fingerprint(db: Path) -> list:
    """What the store holds: tables, views, and the rows of every table (small test store)."""
    rows = [run_query(db, "SELECT table_name FROM duckdb_tables() ORDER BY 1").to_pylist(),
            run_query(db, "SELECT view_name FROM duckdb_views() WHERE NOT internal ORDER BY 1").to_pylist()]
    for table in ("rollouts", "attempts", "spans", "resources"):
        rows.append(run_query(db, f"SELECT * FROM {table} ORDER BY ALL").to_pylist())
    return rows


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "store.duckdb"
    with SpanStore(path) as store:
        store.enqueue([Rollout(input={"i": i}) for i in range(3)])
        store.dequeue(worker_id="w")
        store.add_resource("prompt", {"text": "hi"})
    return path


def _assert_no_files() -> None:
    assert not list(Path("/tmp").glob("spanlab-probe-out*"))


def test_probes_refused_on_a_writable_store_cursor(db: Path) -> None:
    """The in-process path (``StoreAPI.query``, the server's ``/sql``): a cursor of the read-write store."""
    with SpanStore(db) as store:
        store.restrict_to_store()
        cur = store._cursor()
        for probe in PROBES:
            with pytest.raises(QueryError) as err:
                fetch_user_query(cur, probe, 10)
            assert str(err.value), probe
        with pytest.raises(QueryError, match="only SELECT"):
            store.query("EXPLAIN ANALYZE DELETE FROM rollouts")
        assert fetch_user_query(cur, "SELECT count(*) AS n FROM rollouts").to_pylist() == [{"n": 3}]
        cur.execute("BEGIN")  # a caller's open transaction is neither needed nor touched
        assert fetch_user_query(cur, "SELECT 1 AS x").to_pylist() == [{"x": 1}]
        cur.execute("ROLLBACK")
    assert _fingerprint(db)[2] and len(_fingerprint(db)[2]) == 3
    _assert_no_files()


def test_probes_change_nothing_on_any_surface(db: Path) -> None:
    before = _fingerprint(db)
    for probe in PROBES:  # spanlab sql
        with pytest.raises(QueryError):
            run_query(db, probe)
    ui = TestClient(create_app(db))
    for probe in PROBES:
        got = ui.post("/api/sql", json={"query": probe})
        assert got.status_code in (400, 422) and got.json(), (probe, got.text)
    assert _fingerprint(db) == before
    with SpanStore(db) as store, ThreadedServer(create_store_app(store), name="store") as srv:
        for probe in PROBES:
            got = httpx.post(f"{srv.url}/sql", json={"query": probe}, timeout=30)
            assert got.status_code in (400, 422) and got.json()["detail"], (probe, got.text)
        assert httpx.post(f"{srv.url}/sql", json={"query": "SELECT count(*) AS n FROM rollouts"}).json() == [{"n": 3}]
    assert _fingerprint(db) == before
    _assert_no_files()


NEVER_ENDS = "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT count(*) FROM r"
CROSS_JOIN = "SELECT count(*) FROM range(100000000) a, range(100000000) b"


def test_never_ending_queries_are_stopped_in_time(db: Path) -> None:
    for sql in (NEVER_ENDS, CROSS_JOIN):
        start = time.monotonic()
        with pytest.raises(QueryError, match=r"ran over 0\.5 s"):
            run_query(db, sql, timeout_s=0.5)
        assert time.monotonic() - start < 3


def test_result_bytes_are_bounded(db: Path) -> None:
    """10 rows of 30 MB: refused with a message, not a 300 MB answer."""
    big = "SELECT repeat('x', 30000000) AS s FROM range(10)"
    with pytest.raises(QueryError, match="MB limit"):
        run_query(db, big, max_bytes=32 * 1024 * 1024)
    with SpanStore(db) as store, ThreadedServer(create_store_app(store, sql_timeout_s=2), name="store") as srv:
        got = httpx.post(f"{srv.url}/sql", json={"query": big, "max_rows": 10}, timeout=60)
        assert got.status_code == 400 and "MB limit" in got.json()["detail"]
        start = time.monotonic()
        got = httpx.post(f"{srv.url}/sql", json={"query": NEVER_ENDS}, timeout=30)
        assert got.status_code == 400 and "ran over 2 s" in got.json()["detail"]
        assert time.monotonic() - start < 5


@contextlib.contextmanager
def runaway_queries(url: str, n: int) -> Iterator[list[int | str]]:
    """``n`` never-ending queries to ``url`` from clients that give up after 1 s; yields their status codes
    (or "gave up") once every client is done."""
    codes: list[int | str] = []

    def runaway() -> None:
        try:
            codes.append(httpx.post(url, json={"query": NEVER_ENDS}, timeout=1).status_code)
        except httpx.TimeoutException:
            codes.append("gave up")

    threads = [threading.Thread(target=runaway) for _ in range(n)]
    for t in threads:
        t.start()
    time.sleep(0.3)
    try:
        yield codes
    finally:
        for t in threads:
            t.join()


def answers_within(seconds: float, *calls: Callable[[], httpx.Response]) -> None:
    """Each round of ``calls`` answers 200 within ``seconds``. Before the SQL pool they did not answer at all
    (every thread held by a query); the bound is loose because the runaway queries still use the CPU, and
    this machine's 2 cores are shared with other test runs."""
    for _ in range(5):
        start = time.monotonic()
        for call in calls:
            assert call().status_code == 200
        assert time.monotonic() - start < seconds


def first_free(post: Callable[[], httpx.Response], deadline: float) -> httpx.Response:
    """The first answer that is not 503 (the SQL pool busy), before ``deadline``."""
    while (got := post()).status_code == 503:
        assert time.monotonic() < deadline, "the SQL pool stayed busy after its clients left"
        time.sleep(0.2)
    return got


def test_runaway_sql_never_starves_the_queue(db: Path) -> None:
    """Eight never-ending /sql queries whose clients give up after 1 s: the queue routes keep answering at
    once, the SQL pool answers 503 when full, and the queries are interrupted when their clients leave (well
    before their 30 s time limit)."""
    with SpanStore(db) as store, ThreadedServer(create_store_app(store, sql_timeout_s=30), name="store") as srv:
        begun = time.monotonic()
        with runaway_queries(f"{srv.url}/sql", 8) as codes:
            answers_within(3.0, lambda: httpx.get(f"{srv.url}/rollouts", timeout=5),
                           lambda: httpx.post(f"{srv.url}/dequeue", json={}, timeout=5))
        assert codes.count(503) >= 6 and "gave up" in codes  # 2 workers: the others are refused at once
        got = first_free(lambda: httpx.post(f"{srv.url}/sql", json={"query": "SELECT 42 AS x"}, timeout=5),
                         begun + 10)
        assert got.json() == [{"x": 42}]


def test_runaway_sql_in_the_ui_never_stalls_its_pages(db: Path) -> None:
    with ThreadedServer(create_app(db, sql_timeout_s=2), name="ui") as srv:
        with runaway_queries(f"{srv.url}/api/sql", 6):
            answers_within(3.0, lambda: httpx.get(f"{srv.url}/api/rollouts", timeout=5))
        got = first_free(lambda: httpx.post(f"{srv.url}/api/sql", json={"query": NEVER_ENDS}, timeout=30),
                         time.monotonic() + 5)
        assert got.status_code == 400 and "ran over 2 s" in got.json()["error"]
