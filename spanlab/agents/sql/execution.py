"""Running model-written SQL safely against a task's SQLite database, and judging it by its result.

Model output is untrusted code, so a query runs under three independent guards: the file is opened
read-only (``file:...?mode=ro``), an authorizer allows only reads (no ATTACH, PRAGMA, writes, DDL),
and ``sqlite3`` refuses more than one statement per call. A progress handler aborts a query after
``timeout_s`` (a recursive CTE can otherwise run forever), and at most ``max_rows`` rows are fetched.
Every failure comes back as an :class:`ExecResult` with a readable ``error``, because the checker
and rewriter read that text: an exception would end the rollout instead of letting the agent fix it.

``execution_match`` is the reward: the predicted and gold results are compared as multisets of rows
(as lists when the gold query has an ORDER BY), values compared numerically with a float tolerance,
column names ignored (Spider's execution accuracy, minus its value-permutation search).
"""

from __future__ import annotations

import math
import re
import sqlite3
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spanlab.agents.sql.databases import db_path

Row = tuple[Any, ...]

_FENCE = re.compile(r"```[ \t]*(?:sql|sqlite)?[ \t]*\n?(.*?)(?:```|$)", re.IGNORECASE | re.DOTALL)
_START = re.compile(r"\b(?:SELECT\b|WITH\s+(?:RECURSIVE\s+)?\w+\s*(?:\([^()]*\)\s*)?AS\s*\()", re.IGNORECASE)
_BLANK_LINE = re.compile(r"\n[ \t]*\n")
_ORDER_BY = re.compile(r"\border\s+by\b", re.IGNORECASE)
_ALLOWED_ACTIONS = frozenset({sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION,
                              sqlite3.SQLITE_RECURSIVE})  # fmt: skip
_PROGRESS_EVERY = 1000  # SQLite VM instructions between deadline checks (~tens of microseconds)


@dataclass(frozen=True)
class ExecResult:
    """Rows of a query, or why there are none. ``truncated``: more than ``max_rows`` rows existed.

    ``row_count``: how many rows the query returned when ``rows`` holds only the first few, as a recorded
    ``sql.exec`` span does (None: ``len(rows)``), so a result read back from the store previews as it did live.
    """

    sql: str
    rows: list[Row] = field(default_factory=list)
    columns: list[str] = field(default_factory=list)
    error: str | None = None
    truncated: bool = False
    row_count: int | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def preview(self, n: int = 5) -> str:
        """A short text of the result for a prompt: the error, or the first ``n`` rows."""
        if self.error is not None:
            return f"Error: {self.error}"
        total = len(self.rows) if self.row_count is None else self.row_count
        if not total:
            return "No rows."
        lines = [", ".join(_show(v) for v in row) for row in self.rows[:n]]
        if total > n or self.truncated:
            lines.append(f"... ({'more than ' if self.truncated else ''}{total} rows)")
        return "\n".join(lines)


def _show(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return "NULL" if value is None else str(value)


def _strip_strings(sql: str) -> str:
    """``sql`` with quoted literals and identifiers blanked, so ';' or keywords inside them are ignored."""
    return re.sub(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"", lambda m: " " * len(m.group()), sql)


def extract_sql(text: str | None) -> str | None:
    """The one SELECT/WITH statement in model output, or None when there is none.

    Looks in each ```sql fence (an unclosed one runs to the end: the reply may have hit ``max_tokens``),
    then in the whole text, for a ``SELECT`` or ``WITH name AS (``; one at a line start or in upper case
    wins over a "select" inside prose. Cuts at the first ``;`` or blank line: what follows is prose or a
    second statement, which is never run.
    """
    if not text:
        return None
    for body in [*(m.group(1) for m in _FENCE.finditer(text)), text]:
        starts = list(_START.finditer(body))
        strong = [m for m in starts if m.group().startswith(("SELECT", "WITH")) or _at_line_start(body, m.start())]
        start = (strong or starts or [None])[0]
        if start is None:
            continue
        rest = body[start.start() :]
        masked = _strip_strings(rest)
        cut = min((i for i in (masked.find(";"), _first(_BLANK_LINE, masked)) if i >= 0), default=len(rest))
        return rest[:cut].strip()
    return None


def _at_line_start(text: str, i: int) -> bool:
    return not text[text.rfind("\n", 0, i) + 1 : i].strip()


def _first(pattern: re.Pattern[str], text: str) -> int:
    match = pattern.search(text)
    return match.start() if match else -1


def _authorize(action: int, *args: Any) -> int:
    return sqlite3.SQLITE_OK if action in _ALLOWED_ACTIONS else sqlite3.SQLITE_DENY


def connect_readonly(path: Path) -> sqlite3.Connection:
    """A connection that can only read: read-only file mode plus an authorizer that denies the rest."""
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, check_same_thread=False)
    conn.set_authorizer(_authorize)
    return conn


def _resolve(db: str | Path) -> Path:
    return db if isinstance(db, Path) else db_path(db)


def run_sql(db: str | Path, sql: str, *, timeout_s: float = 2.0, max_rows: int = 200) -> ExecResult:
    """Run one read-only query on ``db`` (a database name or a file); never raises for a bad query."""
    stripped = sql.strip().rstrip(";").strip()
    if not _START.match(stripped):
        return ExecResult(sql, error="only a single SELECT (or WITH ... SELECT) query is allowed")
    conn = connect_readonly(_resolve(db))
    deadline = time.monotonic() + timeout_s
    conn.set_progress_handler(lambda: int(time.monotonic() > deadline), _PROGRESS_EVERY)
    try:
        cursor = conn.execute(stripped)
        rows = cursor.fetchmany(max_rows + 1)
        columns = [d[0] for d in cursor.description or ()]
    except sqlite3.ProgrammingError as exc:  # e.g. "You can only execute one statement at a time."
        return ExecResult(sql, error=f"only one statement is allowed: {exc}")
    except sqlite3.DatabaseError as exc:
        if time.monotonic() > deadline:
            return ExecResult(sql, error=f"timed out after {timeout_s:g} s")
        message = str(exc)
        if "not authorized" in message:
            message = "not allowed: the database is read-only, only SELECT queries may run"
        elif message == "incomplete input":
            message = "syntax error: the query is incomplete"
        return ExecResult(sql, error=message)
    finally:
        conn.close()
    return ExecResult(sql, rows=rows[:max_rows], columns=columns, truncated=len(rows) > max_rows)


def _key(value: Any) -> tuple[int, Any]:
    """A sort key that puts numbers, text and NULLs in separate, comparable groups."""
    if value is None:
        return (0, 0)
    if isinstance(value, int | float):
        return (1, round(float(value), 6))
    return (2, str(value))


def _same_value(a: Any, b: Any) -> bool:
    if isinstance(a, int | float) and isinstance(b, int | float):
        return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-6)
    return a == b


def same_rows(predicted: Sequence[Row], gold: Sequence[Row], ordered: bool) -> bool:
    """Equal results: same rows (as a multiset unless ``ordered``), values equal up to float tolerance."""
    if len(predicted) != len(gold):
        return False
    if not ordered:
        predicted = sorted(predicted, key=lambda r: [_key(v) for v in r])
        gold = sorted(gold, key=lambda r: [_key(v) for v in r])
    return all(
        len(p) == len(g) and all(_same_value(a, b) for a, b in zip(p, g, strict=True))
        for p, g in zip(predicted, gold, strict=True)
    )


def execution_match(db: str | Path, predicted_sql: str | None, gold_sql: str, *, timeout_s: float = 2.0) -> bool:
    """True when ``predicted_sql`` returns the gold query's result (order matters only if the gold sorts)."""
    gold = run_sql(db, gold_sql, timeout_s=timeout_s, max_rows=10_000)
    if not gold.ok or gold.truncated:
        raise ValueError(f"gold query failed on {db}: {gold.error or 'too many rows'} ({gold_sql})")
    if not predicted_sql:
        return False
    predicted = run_sql(db, predicted_sql, timeout_s=timeout_s, max_rows=len(gold.rows))
    return predicted.ok and not predicted.truncated and same_rows(predicted.rows, gold.rows, has_order_by(gold_sql))


def has_order_by(sql: str) -> bool:
    return bool(_ORDER_BY.search(_strip_strings(sql)))
