"""The long runner reliability check: 4 worker processes x 250 rollouts, 10% crashes, 5% hangs per attempt.

Same scenario and checks as tests/test_runner.py::test_worker_processes_with_crashes_and_hangs_lose_nothing,
at full size: every rollout ends succeeded or failed after max attempts, each attempt's spans are
stored exactly once, no rollout runs twice at once. Prints outcome counts and wall time.

Run from the repo root: .venv/bin/python benchmarks/runner_reliability.py [--workers 4] [--per-worker 250]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from spanlab.store import SpanStore  # noqa: E402
from spanlab.types import Rollout, RolloutConfig  # noqa: E402
from tests.test_runner import check_run_integrity  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--per-worker", type=int, default=250)
    args = ap.parse_args()
    n = args.workers * args.per_worker
    with tempfile.TemporaryDirectory() as tmp:
        db, config = Path(tmp) / "runs.duckdb", Path(tmp) / "run.yaml"
        cfg = RolloutConfig(max_attempts=3, timeout_s=1.0, retry_on=("failed", "timeout", "unresponsive"))
        with SpanStore(db) as store:
            store.enqueue([Rollout(input={"seed": i}, config=cfg) for i in range(n)])
        config.write_text(yaml.safe_dump({
            "store": {"path": str(db)},
            "agent": {"name": "tests.agents_for_tests:FlakyAgent", "kwargs": {"p_crash": 0.1, "p_hang": 0.05}},
            "runner": {"workers": args.workers, "concurrency": 8, "heartbeat_s": 0.5, "poll_s": 0.1},
        }))
        t0 = time.perf_counter()
        out = subprocess.run([str(Path(sys.executable).with_name("spanlab")), "run", "--config", str(config)],
                             env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if out.returncode != 0:
            sys.exit(f"spanlab run failed:\n{out.stderr[-3000:]}")
        check_run_integrity(db, n, max_attempts=3)
        with SpanStore(db) as store:
            count = "SELECT status, count(*) AS n FROM {} GROUP BY status ORDER BY status"
            rows = store.query(count.format("rollouts")).to_pylist()
            attempts = store.query(count.format("attempts")).to_pylist()
    print(f"{n} rollouts by {args.workers} worker processes in {wall:.1f} s ({n / wall:.1f} rollouts/s): "
          "all checks passed")
    print("rollouts:", {r["status"]: r["n"] for r in rows})
    print("attempts:", {r["status"]: r["n"] for r in attempts})
    print(out.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    main()
