"""The hot write store: a SQLite file in WAL mode takes every write (:class:`Writer`); DuckDB gets a copy
in the background (``copier.py``) and before each read.

Why: a DuckDB COMMIT costs ~1.5-2.5 ms here (it writes the changed columns to its WAL) and a rollout makes
two, while SQLite in WAL mode commits, fsync included (``synchronous=FULL``), in ~0.1-0.5 ms. DuckDB stays
what users and algorithms read (views, ``spanlab sql``, Arrow token columns): a copy (:meth:`SpanStore._sync`)
calls :func:`read_changes`, which takes every row stamped (``seq``) after the last copy and :func:`apply_changes` writes
them into DuckDB in one transaction with the stamp it reached, so a copy cut short by a crash is made again.

SQLite keeps the queue, resources, metrics and each span's key (deduplication and numbering need them);
span batches (Arrow IPC) stay only until DuckDB holds them. The file is the DuckDB file's name plus
``.hot.sqlite``; one that is missing (a copied DuckDB file) or made for another DuckDB file (``store_id``
differs) is rebuilt from DuckDB.

Writes run one at a time (a lock: two dequeues never take the same rollout), each in a savepoint of its own,
COMMITted before the call returns; writes that queue up meanwhile share one COMMIT (:class:`Writer`). Each
write stamps the rows it changes with a number of its own (``seq = stamp()`` in SQL).
"""

from __future__ import annotations

import contextlib
import logging
import re
import sqlite3
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar, cast

import duckdb
import pyarrow as pa

from spanlab.errors import InvalidSpanError, StoreError
from spanlab.store.schema import ATTEMPT_COLUMNS, MEMORY, METRIC_COLUMNS, RESOURCE_COLUMNS, ROLLOUT_COLUMNS

logger = logging.getLogger(__name__)
T = TypeVar("T")
# table -> (columns, primary key: its rows replaced in DuckDB, None: appended)
TABLES = {"rollouts": (ROLLOUT_COLUMNS, "rollout_id"), "attempts": (ATTEMPT_COLUMNS, "attempt_id"),
          "resources": (RESOURCE_COLUMNS, "name, version"),
          "train_metrics": (METRIC_COLUMNS | {"value": "TEXT"}, None)}  # text: SQLite stores a NaN REAL as NULL
_DDL = """
CREATE TABLE IF NOT EXISTS hot_meta (key TEXT PRIMARY KEY, value TEXT);
CREATE INDEX IF NOT EXISTS rollouts_waiting ON rollouts (status, enqueue_time);
CREATE INDEX IF NOT EXISTS attempts_rollout ON attempts (rollout_id);
CREATE TABLE IF NOT EXISTS span_keys (span_id TEXT NOT NULL, attempt_id TEXT, sequence_id INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS span_keys_attempt ON span_keys (attempt_id, span_id);
-- an attempt's next sequence_id (max + 1) without a scan: the unattributed spans are one ever-growing "attempt"
CREATE INDEX IF NOT EXISTS span_keys_sequence ON span_keys (attempt_id, sequence_id);
CREATE TABLE IF NOT EXISTS span_batches (seq INTEGER PRIMARY KEY, ipc BLOB NOT NULL);
"""
_LITE_TYPES = re.compile(r"VARCHAR\[\]|JSON|PRIMARY KEY")
IN_JSON = "IN (SELECT value FROM json_each(?))"  # SQLite: a whole list of strings as one JSON parameter


class Writer:
    """Owns ``conn``: nothing else may use it. ``last_stamp``: the stamp of the last write; stamps count up.

    Group commit: the thread that gets the connection runs every write queued by then, each in a savepoint of
    its own, and COMMITs them together: one fsync for all, which is what bounds concurrent writers (the
    gateway's, one per call). A write alone is a group of one."""

    def __init__(self, conn: sqlite3.Connection, name: str, last_stamp: int) -> None:
        self._conn = conn
        self._name = name
        self._lock = threading.Lock()  # the connection: one group at a time
        self._queue: list[_Job] = []
        self._queue_lock = threading.Lock()
        self._closed = False
        self.last_stamp = last_stamp
        self._stamp: int | None = None
        conn.create_function("stamp", 0, self._next_stamp)

    def _next_stamp(self) -> int:
        """``stamp()`` in SQL: one number per write, taken when it first changes a row."""
        if self._stamp is None:
            self.last_stamp = self._stamp = self.last_stamp + 1
        return self._stamp

    def call(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """``fn(conn)`` in a transaction, COMMITted (with the other writes queued meanwhile) before this
        returns: the write is durable then. An error rolls back this write only; SQLite's errors become
        spanlab errors."""
        job = _Job(fn)
        with self._queue_lock:
            self._queue.append(job)
        with self._lock:
            if not job.done:  # no group took it yet: lead one
                with self._queue_lock:
                    group, self._queue = self._queue, []
                self._run(group)
        if job.error is not None:
            raise job.error
        return cast(T, job.result)

    def _run(self, group: list[_Job]) -> None:
        conn = self._conn
        try:
            if self._closed:
                raise StoreError(f"span store {self._name} is closed")
            conn.execute("BEGIN IMMEDIATE")
            for job in group:
                self._stamp = None
                conn.execute("SAVEPOINT w")
                try:
                    job.result = job.fn(conn)
                except Exception as exc:
                    job.error = self._translated(exc)
                    conn.execute("ROLLBACK TO w")  # fails, and fails the group, if SQLite dropped the transaction
                conn.execute("RELEASE w")
            conn.execute("COMMIT")
        except BaseException as exc:
            with contextlib.suppress(sqlite3.Error):  # a failed BEGIN or COMMIT left no transaction open
                conn.execute("ROLLBACK")
            error = self._translated(exc) if isinstance(exc, Exception) else StoreError(
                f"span store {self._name}: a write was interrupted ({exc!r}); nothing of its group was stored")
            for job in group:  # nothing of the group was stored; each caller raises an exception of its own
                job.result, job.error = None, type(error)(str(error))
            if not isinstance(exc, Exception):
                raise
        finally:
            for job in group:
                job.done = True

    def _translated(self, exc: Exception) -> Exception:
        if isinstance(exc, sqlite3.IntegrityError):
            return InvalidSpanError(f"rejected by the store: {exc}; nothing of this batch was stored")
        if isinstance(exc, sqlite3.Error):
            return StoreError(f"span store {self._name}: {exc}")
        return exc

    def close(self) -> None:
        """Refuse further writes; a write under way finishes first."""
        with self._lock:
            self._closed = True


def check_readable(path: str) -> None:
    """Refuse, before the DuckDB file is opened read-write, a hot store that SQLite cannot read: opening DuckDB
    and closing it after the failure would checkpoint it, and a store whose open fails leaves its files as they
    were. Read-only, and a read of the header and schema only (no scan), so it costs what an open does."""
    target = Path(f"{path}.hot.sqlite")
    if path == MEMORY or not target.exists():
        return
    try:
        with contextlib.closing(sqlite3.connect(f"{target.resolve().as_uri()}?mode=ro", uri=True)) as lite:
            lite.execute("SELECT count(*) FROM sqlite_master").fetchall()
    except sqlite3.Error as exc:
        raise StoreError(f"the span store's hot file {target} is not a readable SQLite database ({exc}); it and "
                         f"{path} were left untouched. Move it aside to rebuild it from {path}, which then loses "
                         "what only it held (writes not yet copied into DuckDB)") from exc


@dataclass(eq=False)
class _Job:
    fn: Callable[[sqlite3.Connection], object]
    result: object = None
    error: Exception | None = None
    done: bool = False


def open_hot(path: str, duck: duckdb.DuckDBPyConnection) -> sqlite3.Connection:
    """Open the hot store of the DuckDB file ``path``; one that is new, or was made for another DuckDB file
    (the file was replaced), is (re)built from what DuckDB holds."""
    target = MEMORY if path == MEMORY else f"{path}.hot.sqlite"
    ((store_id,),) = duck.execute("SELECT value FROM spanlab_meta WHERE key = 'store_id'").fetchall()
    lite = _connect(target)
    found = lite.execute("SELECT value FROM hot_meta WHERE key = 'store_id'").fetchall()
    if found and found[0][0] != store_id:
        logger.warning("%s belongs to another DuckDB file than %s (replaced?): rebuilding it", target, path)
        lite.close()
        for suffix in ("", "-wal", "-shm"):
            Path(target + suffix).unlink(missing_ok=True)
        lite, found = _connect(target), []
    if not found:
        _fill_from(duck, lite, store_id)
    return lite


def _connect(target: str) -> sqlite3.Connection:
    lite = sqlite3.connect(target, isolation_level=None, check_same_thread=False)  # BEGIN/COMMIT are ours
    lite.execute("PRAGMA journal_mode = WAL")
    lite.execute("PRAGMA synchronous = FULL")  # an fsync per COMMIT: acknowledged survives power loss too
    lite.execute("PRAGMA secure_delete = FAST")  # Debian's default (ON) rewrites copied span batches as zeros
    for name, (columns, key) in TABLES.items():
        cols = ", ".join(f"{k} {_LITE_TYPES.sub(_lite_type, v)}" for k, v in columns.items())
        pk = f", PRIMARY KEY ({key})" if key else ""
        lite.execute(f"CREATE TABLE IF NOT EXISTS {name} ({cols}, seq INTEGER NOT NULL{pk})")
        lite.execute(f"CREATE INDEX IF NOT EXISTS {name}_seq ON {name} (seq)")
    lite.executescript(_DDL)
    return lite


def _lite_type(m: re.Match[str]) -> str:
    """SQLite keeps lists and JSON as TEXT (a JSON column would get NUMERIC affinity: '1' stored as 1)."""
    return "" if m.group(0) == "PRIMARY KEY" else "TEXT"


def _fill_from(duck: duckdb.DuckDBPyConnection, lite: sqlite3.Connection, store_id: str) -> None:
    """A new hot store starts as a copy of what DuckDB holds (stamped 0: DuckDB has it already)."""
    lite.execute("BEGIN")
    lite.execute("INSERT INTO hot_meta VALUES ('store_id', ?)", [store_id])
    for name, (columns, _) in TABLES.items():
        cols = ["to_json(retry_on)::VARCHAR" if c == "retry_on" else c for c in columns]
        rows = duck.execute(f"SELECT {', '.join(cols)}, 0 FROM {name}").fetchall()
        lite.executemany(f"INSERT INTO {name} VALUES ({', '.join('?' * (len(cols) + 1))})", rows)
    keys = duck.execute("SELECT span_id, attempt_id, sequence_id FROM spans").fetchall()
    lite.executemany("INSERT INTO span_keys VALUES (?, ?, ?)", keys)
    lite.execute("COMMIT")


def last_stamp(lite: sqlite3.Connection) -> int:
    sql = " UNION ALL ".join(f"SELECT max(seq) AS s FROM {t}" for t in (*TABLES, "span_batches"))
    return lite.execute(f"SELECT coalesce(max(s), 0) FROM ({sql})").fetchone()[0]


@dataclass
class Changes:
    """What changed in the hot store up to stamp ``upto``."""

    upto: int
    tables: dict[str, pa.Table] = field(default_factory=dict)
    spans: list[bytes] = field(default_factory=list)  # Arrow IPC streams, read by apply_changes (not under the
    # writer's lock, which read_changes holds)


def read_changes(lite: sqlite3.Connection, since: int, upto: int) -> Changes:
    """Rows stamped after ``since``; span batches DuckDB already holds (stamped ``since`` or before) are
    deleted. Runs in the writer's transaction, which sees every write up to ``upto``."""
    lite.execute("DELETE FROM span_batches WHERE seq <= ?", [since])
    changes = Changes(upto)
    for name, (columns, _) in TABLES.items():
        cur = lite.execute(f"SELECT {', '.join(columns)} FROM {name} WHERE seq > ?", [since])
        if rows := cur.fetchall():
            changes.tables[name] = pa.table(dict(zip(columns, map(list, zip(*rows, strict=True)), strict=True)))
    changes.spans = [ipc for (ipc,) in lite.execute("SELECT ipc FROM span_batches WHERE seq > ? ORDER BY seq", [since])]
    return changes


def apply_changes(duck: duckdb.DuckDBPyConnection, changes: Changes) -> None:
    """Write ``changes`` into DuckDB, and the stamp they reach, in one transaction."""
    duck.execute("BEGIN TRANSACTION")
    try:
        for name, tbl in changes.tables.items():
            duck.register("_changes", tbl)
            if key := TABLES[name][1]:  # DELETE + INSERT: half the time of INSERT OR REPLACE here
                duck.execute(f"DELETE FROM {name} WHERE ({key}) IN (SELECT ({key}) FROM _changes)")
            cast = " REPLACE (retry_on::JSON::VARCHAR[] AS retry_on)" if name == "rollouts" else ""
            duck.execute(f"INSERT INTO {name} BY NAME SELECT *{cast} FROM _changes")
            duck.unregister("_changes")
        if changes.spans:
            spans = pa.concat_tables(pa.ipc.open_stream(ipc).read_all() for ipc in changes.spans)
            duck.from_arrow(spans.combine_chunks()).insert_into("spans")  # one chunk: faster
        duck.execute("UPDATE spanlab_meta SET value = ? WHERE key = 'hot_seq'", [str(changes.upto)])
        duck.execute("COMMIT")
    except BaseException:
        duck.execute("ROLLBACK")
        raise
