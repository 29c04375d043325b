"""Training metrics land in ``train_metrics`` (long format) and survive a reopen of the file."""

from __future__ import annotations

import math
from pathlib import Path

from spanlab.store.duckdb_store import SpanStore


def test_metrics_are_rows_queryable_with_sql(tmp_path: Path) -> None:
    db = tmp_path / "m.duckdb"
    with SpanStore(db) as store:
        store.add_metrics("run-1", "grpo", 0, {"reward_mean": 0.25, "loss": 1.5})
        store.add_metrics("run-1", "grpo", 1, {"reward_mean": 0.5, "loss": float("nan")})
    with SpanStore(db) as store:
        rows = store.query(
            "SELECT step, value FROM train_metrics WHERE run_id = 'run-1' AND name = 'reward_mean' ORDER BY step"
        ).to_pylist()
        assert rows == [{"step": 0, "value": 0.25}, {"step": 1, "value": 0.5}]
        (n,) = store.query("SELECT count(*) AS n FROM train_metrics WHERE algorithm = 'grpo'").column("n").to_pylist()
        assert n == 4
        (loss,) = store.query("SELECT value FROM train_metrics WHERE step = 1 AND name = 'loss'")["value"].to_pylist()
        assert math.isnan(loss)  # a diverged loss stays NaN (not NULL) through the hot store
