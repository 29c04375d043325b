"""How ``spanlab sql`` prints a result and finds its file: a table (one block per record when too wide), CSV,
JSON, the ``--db`` default.

Terminal output of the CLI, not the store's: a file's query answers as Arrow (:mod:`spanlab.store.sql`), a store
server as JSON rows (:mod:`spanlab.store.sql_answer`); both print from the JSON values (:class:`SqlRows`,
:func:`json_rows` over :func:`~spanlab.sql_surface.rows`), so a file and its server print the same text, NaN and
-Infinity included. A result wider than the
terminal (``SELECT * FROM rollout_summary``: 19 columns) would be squeezed into cells of "…"; it is printed one
record per block instead, each value on its own line, as psql's expanded mode does.
"""

from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
from rich.console import RenderableType
from rich.rule import Rule
from rich.table import Table
from rich.text import Text

from spanlab.sql_surface import rows
from spanlab.store.sql_answer import SqlRows

DEFAULT_DB = "spanlab.duckdb"
OutputFormat = Literal["table", "csv", "json"]


def resolve_db(db: str | Path | None) -> Path:
    """``--db`` wins, then ``$SPANLAB_DB``, then ``./spanlab.duckdb``."""
    return Path(db or os.environ.get("SPANLAB_DB") or DEFAULT_DB)


def json_rows(table: pa.Table) -> SqlRows:
    """A file's result as the JSON values a store server would send for it, so both print the same text."""
    return SqlRows(table.column_names, [list(row.values()) for row in rows(table)])


def to_csv(result: SqlRows) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(result.columns)
    for row in result.rows:
        writer.writerow(json.dumps(v) if isinstance(v, (list, dict)) else v for v in row)
    return buf.getvalue()


def to_json(result: SqlRows) -> str:
    return json.dumps([dict(zip(result.columns, row, strict=True)) for row in result.rows], ensure_ascii=False,
                      indent=1)


def cell_text(value: Any, width: int = 60) -> str:
    text = "NULL" if value is None else json.dumps(value) if isinstance(value, (list, dict)) else str(value)
    return text if len(text) <= width else text[: width - 1] + "…"


CELL_WIDTH = 60  # a grid cell's longest text; longer values end in "…" (-f csv / -f json print them whole)


def table_view(result: SqlRows, max_rows: int, width: int) -> tuple[list[RenderableType], str]:
    """What ``spanlab sql`` prints for ``result`` on a terminal ``width`` columns wide: a grid when its columns
    fit, else one block per record; and the line that ends it (row count, and how to see more)."""
    names = result.columns
    values = result.rows[:max_rows]
    more = " (more rows: raise --max-rows or use --format csv)" if len(result.rows) > max_rows else ""
    if not values:  # the same line for a file's and a server's empty result, however wide
        return [], f"0 rows (columns: {', '.join(names)})" if names else "0 rows"
    cells = [[cell_text(v, CELL_WIDTH) for v in row] for row in values]
    # a rich grid's width: each column's widest text plus 2 of padding and 1 of border, and the last border
    if sum(max(len(n), *(len(r[i]) for r in cells)) + 3 for i, n in enumerate(names)) + 1 <= width:
        grid = Table()
        for name in names:
            grid.add_column(Text(name))
        for row in cells:
            grid.add_row(*map(Text, row))  # Text: a value is never read as rich markup
        return [grid], f"{len(values)} rows{more}"
    key_width = max(map(len, names))
    out: list[RenderableType] = []
    for i, row in enumerate(values, 1):
        block = Table.grid(padding=(0, 2))
        block.add_column(style="bold", no_wrap=True)
        block.add_column(overflow="fold")
        for name, value in zip(names, row, strict=True):
            block.add_row(Text(name), Text(cell_text(value, max(width - key_width - 2, CELL_WIDTH) * 4)))
        out += [Rule(f"record {i}", align="left", style="dim"), block]
    return out, (f"{len(values)} rows{more}, one block per record: {len(names)} columns do not fit {width} "
                 "(-f csv or -f json for a file)")
