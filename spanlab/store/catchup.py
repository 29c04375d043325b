"""Before a read-only query of a store file: copy into DuckDB the writes that only its hot file holds.

Why: every acknowledged write is committed to the hot file (``hot.py``) and reaches DuckDB on the writing
process's next read or when it closes. A process killed before that (SIGKILL, a crash, a SIGTERM that skipped
the close) leaves writes that DuckDB lacks, and ``spanlab sql``, which opens DuckDB read-only, would show
none of them, with no warning. Opening the store once (``SpanStore``) copies them, as the next writer would;
that is the store's own recovery, not the user's SQL, which stays read-only. When the file cannot be opened
for writing (another process reads it), the query runs on what DuckDB holds and a warning says how much is
missing.
"""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

import duckdb

from spanlab.errors import StoreError
from spanlab.store.hot import last_stamp
from spanlab.store.schema import MEMORY, connect

logger = logging.getLogger(__name__)


def pending_writes(db: str | Path) -> int:
    """How many write stamps the hot file of ``db`` holds beyond what DuckDB copied (0: none, or no hot file).

    Raises the store's open errors (a file held read-write by a live process: query through its server)."""
    hot_file = Path(f"{db}.hot.sqlite")
    if str(db) == MEMORY or not hot_file.is_file():
        return 0
    conn = connect(db, read_only=True)
    try:
        meta = dict(conn.execute("SELECT key, value FROM spanlab_meta").fetchall())
    except duckdb.Error:
        return 0  # not a spanlab store (yet): nothing of ours to copy
    finally:
        conn.close()
    try:
        lite = sqlite3.connect(f"{hot_file.resolve().as_uri()}?mode=ro", uri=True)
        try:
            found = lite.execute("SELECT value FROM hot_meta WHERE key = 'store_id'").fetchall()
            if not found or found[0][0] != meta.get("store_id"):
                return 0  # made for another DuckDB file: the next writer rebuilds it, nothing to copy
            return max(0, last_stamp(lite) - int(meta.get("hot_seq", 0)))
        finally:
            lite.close()
    except sqlite3.Error as exc:
        logger.warning("cannot read the hot file %s (%s): writes not yet copied into DuckDB may be missing",
                       hot_file, exc)
        return 0


def catch_up(db: str | Path) -> None:
    """Copy the hot file's newer writes into ``db`` (opening the store does it), or warn that the query that
    follows will not see them."""
    n = pending_writes(db)
    if not n:
        return
    from spanlab.store.duckdb_store import SpanStore

    try:
        SpanStore(db).close()
    except StoreError as exc:
        logger.warning("%s: %d writes are only in its hot file (the process that made them stopped before "
                       "copying them) and cannot be copied now, so this result misses them: %s", db, n, exc)
        return
    logger.info("%s: copied %d writes from its hot file into DuckDB (the process that made them stopped "
                "before copying them)", db, n)
