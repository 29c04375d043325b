"""Why a copy into DuckDB gets slower until DuckDB checkpoints: its COMMIT re-logs list columns.

Each round inserts R rows of L random token IDs in one transaction and commits, the way the store copies a
step's spans out of its hot store. For an ``INTEGER[]`` column (how spans keep token IDs) the WAL grows by
every list row written since the last checkpoint, so commit k writes ~k times the data; a ``BLOB`` column
holding the same bytes, and a plain ``INTEGER`` column, grow by what each round adds. Prints, per column
type, each commit's time and the WAL size after it.

Run: .venv/bin/python benchmarks/duckdb_list_wal.py [--rounds 6] [--rows 200] [--length 2500]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa


def batch(kind: str, rows: int, length: int, rng: np.random.Generator) -> pa.Table:
    ids = rng.integers(0, 150_000, rows * length, dtype=np.int32)
    if kind == "INTEGER":
        return pa.table({"x": ids})
    if kind == "BLOB":
        return pa.table({"x": pa.array([ids[i * length:(i + 1) * length].tobytes() for i in range(rows)])})
    offsets = pa.array(np.arange(0, rows * length + 1, length, dtype=np.int32))
    return pa.table({"x": pa.ListArray.from_arrays(offsets, pa.array(ids))})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--rows", type=int, default=200)
    ap.add_argument("--length", type=int, default=2500, help="token IDs per row")
    args = ap.parse_args()
    print(f"duckdb {duckdb.__version__}; {args.rows} rows x {args.length} int32 per commit; "
          "each cell: commit ms / WAL MB after it (0: checkpointed)")
    for kind in ("INTEGER[]", "BLOB", "INTEGER"):
        rng = np.random.default_rng(0)
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "t.duckdb"
            con = duckdb.connect(str(path))
            con.execute(f"CREATE TABLE t (x {kind})")
            cells = []
            for _ in range(args.rounds):
                tbl = batch(kind, args.rows, args.length, rng)
                con.execute("BEGIN TRANSACTION")
                con.from_arrow(tbl).insert_into("t")
                t0 = time.perf_counter()
                con.execute("COMMIT")
                wal = Path(f"{path}.wal")
                size = wal.stat().st_size / 1e6 if wal.exists() else 0.0
                cells.append(f"{(time.perf_counter() - t0) * 1e3:6.1f} / {size:5.1f}")
            con.close()
        print(f"{kind:10s} " + " | ".join(cells))


if __name__ == "__main__":
    main()
