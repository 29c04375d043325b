"""Opening DuckDB files with errors a user can act on.

DuckDB lets one process hold a file read-write and refuses every other process meanwhile; a file
that is not a DuckDB database fails to open. Both become spanlab errors that say what to do, and the
file is never touched (nothing stored is lost by a failed open).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import duckdb

from spanlab.errors import StoreError, StoreLockedError

MEMORY = ":memory:"

# Settings of the user-facing query surface (`spanlab sql`, the UI, the store server's /sql): no file,
# network or extension access, so SQL cannot read /etc/passwd or write anywhere.
SAFE_QUERY_CONFIG: dict[str, Any] = {
    "enable_external_access": False,
    "autoinstall_known_extensions": False,
    "autoload_known_extensions": False,
    "allow_community_extensions": False,
    "lock_configuration": True,
}


def connect(path: str | Path, *, read_only: bool = False, safe: bool = False) -> duckdb.DuckDBPyConnection:
    """Open ``path`` (or ``:memory:``); ``safe`` applies :data:`SAFE_QUERY_CONFIG`."""
    target = str(path)
    if target != MEMORY:
        p = Path(target)
        if read_only and not p.exists():
            raise StoreError(f"no span store at {p}: the file does not exist (set --db or SPANLAB_DB)")
        if not read_only:
            p.parent.mkdir(parents=True, exist_ok=True)
    try:
        return duckdb.connect(target, read_only=read_only, config=dict(SAFE_QUERY_CONFIG) if safe else {})
    except duckdb.Error as exc:
        raise translate_open_error(target, exc) from exc


def translate_open_error(path: str, exc: Exception) -> StoreError:
    msg = str(exc)
    low = msg.lower()
    if "lock" in low:
        pid = re.search(r"PID (\d+)", msg)
        holder = f" (PID {pid.group(1)})" if pid else ""
        return StoreLockedError(
            f"span store {path} is held read-write by another process{holder}. Only one process may open "
            "it while it is written: stop that process, or query through its store server "
            f"(spanlab store serve). DuckDB said: {msg}"
        )
    if "not a valid duckdb database" in low or "corrupt" in low or "invalid" in low or "serializ" in low:
        return StoreError(
            f"span store {path} is not a readable DuckDB database (corrupt or another kind of file); "
            f"it was left untouched. DuckDB said: {msg}"
        )
    return StoreError(f"cannot open span store {path}: {msg}")


def dumps(value: Any, *, allow_nan: bool = True) -> str | None:
    """JSON for a JSON column; None stays SQL NULL. ``allow_nan=False``: NaN and Infinity (not JSON, which
    DuckDB refuses) raise ``ValueError``."""
    return None if value is None else json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=allow_nan)


def loads(value: str | None) -> Any:
    return None if value is None else json.loads(value)


def fetch_dicts(cur: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
    """Rows of the last result as dicts (small results only: queue rows, resources)."""
    names = [d[0] for d in cur.description or []]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]
