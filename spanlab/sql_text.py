"""How ``spanlab sql`` prints a result and finds its file: table cells, CSV, JSON, the ``--db`` default.

Terminal output of the CLI, not the store's: the store answers queries as Arrow (:mod:`spanlab.store.sql`),
and these turn its JSON-safe rows (:func:`~spanlab.sql_surface.rows`) into text.
"""

from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa

from spanlab.sql_surface import rows

DEFAULT_DB = "spanlab.duckdb"
OutputFormat = Literal["table", "csv", "json"]


def resolve_db(db: str | Path | None) -> Path:
    """``--db`` wins, then ``$SPANLAB_DB``, then ``./spanlab.duckdb``."""
    return Path(db or os.environ.get("SPANLAB_DB") or DEFAULT_DB)


def to_csv(table: pa.Table) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(table.column_names)
    for row in rows(table):
        writer.writerow(json.dumps(v) if isinstance(v, (list, dict)) else v for v in row.values())
    return buf.getvalue()


def to_json(table: pa.Table) -> str:
    return json.dumps(list(rows(table)), ensure_ascii=False, indent=1)


def cell_text(value: Any, width: int = 60) -> str:
    text = "NULL" if value is None else json.dumps(value) if isinstance(value, (list, dict)) else str(value)
    return text if len(text) <= width else text[: width - 1] + "…"
