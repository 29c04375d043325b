"""The hot write store: a SQLite file in WAL mode takes every write; DuckDB gets a copy before each read.

Why two databases: a DuckDB COMMIT costs ~1.5-2.5 ms here (it writes the changed columns to its WAL), and
a rollout makes two (its dequeue, its finish with the spans), so a store on DuckDB alone cannot acknowledge
writes as fast as a gateway makes them. SQLite in WAL mode with ``synchronous=FULL`` commits, fsync
included, in ~0.1-0.5 ms, so every write is durable when it returns. DuckDB stays what users and algorithms
read (the views, ``spanlab sql``, the Arrow token columns): before a read, :func:`read_changes` takes from
SQLite every row stamped (``seq``) after the last copy, and :func:`apply_changes` writes them into DuckDB in
one transaction with the stamp it copied up to, so a copy cut short by a crash is simply made again.

SQLite keeps the queue (rollouts, attempts), resources, metrics and each span's key (span_id, attempt,
sequence number: what deduplication and numbering need); span batches, as Arrow IPC, stay only until
DuckDB holds them. The file is the DuckDB file's name plus ``.hot.sqlite``; a store opened without one (a
copied DuckDB file) rebuilds it from DuckDB.
"""

from __future__ import annotations

import re
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import pyarrow as pa

from spanlab.store.schema import ATTEMPT_COLUMNS, MEMORY, METRIC_COLUMNS, RESOURCE_COLUMNS, ROLLOUT_COLUMNS

# table -> (columns, primary key: upserted into DuckDB, None: appended)
TABLES = {"rollouts": (ROLLOUT_COLUMNS, "rollout_id"), "attempts": (ATTEMPT_COLUMNS, "attempt_id"),
          "resources": (RESOURCE_COLUMNS, "name, version"), "train_metrics": (METRIC_COLUMNS, None)}
_DDL = """
CREATE INDEX IF NOT EXISTS rollouts_waiting ON rollouts (status, enqueue_time);
CREATE INDEX IF NOT EXISTS attempts_rollout ON attempts (rollout_id);
CREATE TABLE IF NOT EXISTS span_keys (span_id TEXT NOT NULL, attempt_id TEXT, sequence_id INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS span_keys_attempt ON span_keys (attempt_id, span_id);
CREATE TABLE IF NOT EXISTS span_batches (seq INTEGER PRIMARY KEY, ipc BLOB NOT NULL);
"""
_LITE_TYPES = re.compile(r"VARCHAR\[\]|JSON|PRIMARY KEY")
IN_JSON = "IN (SELECT value FROM json_each(?))"  # SQLite: a whole list of strings as one JSON parameter


def hot_path(path: str) -> str:
    return MEMORY if path == MEMORY else f"{path}.hot.sqlite"


def open_hot(path: str, duck: duckdb.DuckDBPyConnection) -> sqlite3.Connection:
    """Open (or create, and fill from ``duck``) the hot store of the DuckDB file ``path``."""
    target = hot_path(path)
    fresh = target == MEMORY or not Path(target).exists()
    lite = sqlite3.connect(target, isolation_level=None, check_same_thread=False)  # BEGIN/COMMIT are ours
    lite.execute("PRAGMA journal_mode = WAL")
    lite.execute("PRAGMA synchronous = FULL")  # an fsync per COMMIT: acknowledged survives power loss too
    for name, (columns, key) in TABLES.items():
        cols = ", ".join(f"{k} {_LITE_TYPES.sub(_lite_type, v)}" for k, v in columns.items())
        pk = f", PRIMARY KEY ({key})" if key else ""
        lite.execute(f"CREATE TABLE IF NOT EXISTS {name} ({cols}, seq INTEGER NOT NULL{pk})")
        lite.execute(f"CREATE INDEX IF NOT EXISTS {name}_seq ON {name} (seq)")
    lite.executescript(_DDL)
    if fresh:
        _fill_from(duck, lite)
    return lite


def _lite_type(m: re.Match[str]) -> str:
    """SQLite keeps lists and JSON as TEXT (a JSON column would get NUMERIC affinity: '1' stored as 1)."""
    return "" if m.group(0) == "PRIMARY KEY" else "TEXT"


def _fill_from(duck: duckdb.DuckDBPyConnection, lite: sqlite3.Connection) -> None:
    """A new hot store starts as a copy of what DuckDB holds (stamped 0: DuckDB has it already)."""
    lite.execute("BEGIN")
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
    """What changed in the hot store after stamp ``since``, up to stamp ``upto``."""

    since: int
    upto: int
    tables: dict[str, pa.Table] = field(default_factory=dict)
    spans: list[pa.Table] = field(default_factory=list)


def read_changes(lite: sqlite3.Connection, since: int, upto: int) -> Changes:
    """Rows stamped after ``since``; span batches DuckDB already holds (stamped ``since`` or before) are
    deleted. Runs in the writer's transaction, which sees every write up to ``upto``."""
    lite.execute("DELETE FROM span_batches WHERE seq <= ?", [since])
    changes = Changes(since, upto)
    for name, (columns, _) in TABLES.items():
        cur = lite.execute(f"SELECT {', '.join(columns)} FROM {name} WHERE seq > ?", [since])
        if rows := cur.fetchall():
            changes.tables[name] = pa.table(dict(zip(columns, map(list, zip(*rows, strict=True)), strict=True)))
    for (ipc,) in lite.execute("SELECT ipc FROM span_batches WHERE seq > ? ORDER BY seq", [since]):
        changes.spans.append(pa.ipc.open_stream(ipc).read_all())
    return changes


def apply_changes(duck: duckdb.DuckDBPyConnection, changes: Changes) -> None:
    """Write ``changes`` into DuckDB, and the stamp they reach, in one transaction."""
    duck.execute("BEGIN TRANSACTION")
    try:
        for name, tbl in changes.tables.items():
            duck.register("_changes", tbl)
            cast = " REPLACE (retry_on::JSON::VARCHAR[] AS retry_on)" if name == "rollouts" else ""
            verb = "INSERT OR REPLACE" if TABLES[name][1] else "INSERT"
            duck.execute(f"{verb} INTO {name} BY NAME SELECT *{cast} FROM _changes")
            duck.unregister("_changes")
        if changes.spans:
            duck.from_arrow(pa.concat_tables(changes.spans)).insert_into("spans")
        duck.execute("INSERT OR REPLACE INTO spanlab_meta VALUES ('hot_seq', ?)", [str(changes.upto)])
        duck.execute("COMMIT")
    except BaseException:
        duck.execute("ROLLBACK")
        raise

