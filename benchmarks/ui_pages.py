"""Response times of the web UI's API pages on a 100,000-span store (issue #11: stays fast, no full-table loads).

Writes a store of R rollouts x (C TITO LLM calls + 1 tool call + 1 reward) spans (default 10,000 x 10 = 100,000
spans; call k's prompt is the session so far, 4,160 token IDs per rollout, ~42M in all), ingested as Arrow
tables through ``SpanStore.add_span_table`` (rollouts through the queue API), plus one training run of 1,000
steps. Then serves the UI on loopback (real HTTP, uvicorn in a thread) and times each page: median and max of
--reps requests. For comparison it also times the naive ``SELECT * FROM rollout_summary LIMIT 50`` through the
SQL box, which aggregates every span. Not a test: the machine is shared and noisy.

Run: .venv/bin/python benchmarks/ui_pages.py [--rollouts 10000] [--calls 8] [--reps 5] [--db PATH --keep]
     [--tokenizer DIR]   (default tokenizer: the default model's folder, converted once)
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
import pyarrow as pa

from spanlab.store import SpanStore
from spanlab.store.schema import SPAN_ARROW_SCHEMA
from spanlab.threaded_server import ThreadedServer
from spanlab.types import Rollout, RolloutConfig
from spanlab.ui import create_app
from spanlab.ui.tokens import default_loader
from spanlab.vectors import list_column

logger = logging.getLogger("ui_pages")
VOCAB = 49_152


def _span_table(rows: list[dict], ids: dict[str, list]) -> pa.Table:
    """One ingest batch as Arrow: scalar columns from dicts, token columns via one NumPy concatenate each."""
    cols: dict[str, pa.Array] = {}
    for f in SPAN_ARROW_SCHEMA:
        if f.name in ids:
            cols[f.name] = list_column(ids[f.name], f.type.value_type.to_pandas_dtype(), f.type)
        else:
            cols[f.name] = pa.array([r.get(f.name) for r in rows], type=f.type)
    return pa.table(cols, schema=SPAN_ARROW_SCHEMA)


def write_store(path: Path, n_rollouts: int, n_calls: int, seed: int = 0) -> tuple[float, int]:
    """Returns (seconds, spans written)."""
    rng = np.random.default_rng(seed)
    t0 = time.perf_counter()
    n_spans = 0
    with SpanStore(path) as store:
        cfg = RolloutConfig(max_attempts=1)
        store.enqueue([Rollout(input={"question": f"task {i}", "i": i}, mode="val" if i % 10 == 0 else "train",
                               config=cfg) for i in range(n_rollouts)])
        batch_rows: list[dict] = []
        batch_ids: dict[str, list] = {k: [] for k in ("prompt_token_ids", "response_token_ids", "response_logprobs",
                                                      "loss_mask")}
        now = time.time()
        for i in range(n_rollouts):
            rollout, attempt = store.dequeue(worker_id=f"w{i % 4}")
            rid, aid = rollout.rollout_id, attempt.attempt_id
            session = rng.integers(0, VOCAB, 200, dtype=np.int32)
            mask = np.zeros(200, dtype=np.uint8)
            for k in range(n_calls):
                resp = rng.integers(0, VOCAB, 40, dtype=np.int32)
                base = {"span_id": f"sp-{i}-{k}", "rollout_id": rid, "attempt_id": aid, "sequence_id": k + (k > 0),
                        "name": "chat.completions", "kind": "llm_call", "start_time": now + k, "end_time": now + k + .5,
                        "status": "ok", "model": "bench", "finish_reason": "stop",
                        "attributes": json.dumps({"tito": {"mode": "tito", "call": k, "segment": 0, "offset": 0}}),
                        "response_message": json.dumps({"role": "assistant", "content": f"step {k}"})}
                batch_rows.append(base)
                batch_ids["prompt_token_ids"].append(session)
                batch_ids["response_token_ids"].append(resp)
                batch_ids["response_logprobs"].append(-rng.random(40, dtype=np.float32))
                batch_ids["loss_mask"].append(np.concatenate([mask, np.ones(40, dtype=np.uint8)]))
                delta = rng.integers(0, VOCAB, 40, dtype=np.int32)
                session = np.concatenate([session, resp, delta])
                mask = np.concatenate([mask, np.ones(40, dtype=np.uint8), np.zeros(40, dtype=np.uint8)])
            reward = float(rng.random() < 0.4)
            for extra in ({"span_id": f"sp-{i}-tool", "sequence_id": 1, "name": "calc", "kind": "tool_call"},
                          {"span_id": f"sp-{i}-reward", "sequence_id": n_calls + 1, "name": "reward", "kind": "reward",
                           "reward_name": "reward", "reward_value": reward}):
                batch_rows.append({"rollout_id": rid, "attempt_id": aid, "start_time": now, "status": "ok", **extra})
                for v in batch_ids.values():
                    v.append(None)
            if len(batch_rows) >= 4096 or i == n_rollouts - 1:
                n_spans += store.add_span_table(_span_table(batch_rows, batch_ids))
                batch_rows = []
                batch_ids = {k: [] for k in batch_ids}
            store.finish_attempt(aid, "succeeded" if rng.random() < 0.9 else "failed")
        for step in range(1000):
            store.add_metrics("bench-run", "grpo", step, {"reward_mean": min(1.0, step / 800), "loss": 1 / (1 + step)})
    return time.perf_counter() - t0, n_spans


def time_pages(db: Path, reps: int, tokenizer: Path | None) -> list[tuple[str, float, float, int]]:
    app = create_app(db, default_loader(tokenizer))
    out: list[tuple[str, float, float, int]] = []
    with ThreadedServer(app, name="ui") as srv, httpx.Client(base_url=srv.url, timeout=300) as http:
        first = http.get("/api/rollouts", params={"limit": 1}).json()["rows"][0]
        total = http.get("/api/info").json()["rollouts"]
        http.get(f"/api/calls/sp-{0}-0/tokens")  # loads the tokenizer once (seconds), not timed
        pages = [
            ("info (counts, filter values)", "GET", "/api/info", None),
            ("rollouts page 1 (50 rows)", "GET", "/api/rollouts?limit=50", None),
            ("rollouts last page (offset R-50)", "GET", f"/api/rollouts?limit=50&offset={total - 50}", None),
            ("rollouts status=failed", "GET", "/api/rollouts?status=failed&limit=50", None),
            ("rollouts search 'task 777'", "GET", "/api/rollouts?search=task%20777&limit=50", None),
            ("rollouts reward >= 1 and mode=val", "GET", "/api/rollouts?min_reward=1&mode=val&limit=50", None),
            ("rollout view (10 spans)", "GET", f"/api/rollouts/{first['rollout_id']}", None),
            ("token view, last call (800 tokens)", "GET", f"/api/calls/{_last_call(http, first)}/tokens", None),
            ("token view, TITO session (800 tokens)", "GET", f"/api/sessions/{first['last_attempt_id']}/tokens", None),
            ("runs", "GET", "/api/runs", None),
            ("curves (2 metrics x 1,000 steps)", "GET", "/api/runs/bench-run/metrics?names=reward_mean,loss", None),
            ("per-role table of a run (role_summary)", "GET", "/api/runs/bench-run/roles", None),
            ("SQL box: count(*) FROM llm_calls", "POST", "/api/sql", {"query": "SELECT count(*) FROM llm_calls"}),
            ("SQL box: rollout_summary LIMIT 50 (naive)", "POST", "/api/sql",
             {"query": "SELECT * EXCLUDE (input, metadata) FROM rollout_summary LIMIT 50"}),
        ]
        for label, method, url, body in pages:
            times, size = [], 0
            for _ in range(reps):
                t0 = time.perf_counter()
                res = http.request(method, url, json=body)
                times.append(time.perf_counter() - t0)
                res.raise_for_status()
                size = len(res.content)
            out.append((label, statistics.median(times), max(times), size))
    return out


def _last_call(http: httpx.Client, rollout: dict) -> str:
    spans = http.get(f"/api/rollouts/{rollout['rollout_id']}").json()["spans"]
    return [s for s in spans if s["kind"] == "llm_call"][-1]["span_id"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rollouts", type=int, default=10_000)
    ap.add_argument("--calls", type=int, default=8)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--db", type=Path, help="write (or, with --keep and an existing file, reuse) this store")
    ap.add_argument("--keep", action="store_true", help="reuse --db if it exists; do not delete it")
    ap.add_argument("--tokenizer", type=Path)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    with tempfile.TemporaryDirectory() as tmp:
        db = args.db or Path(tmp) / "ui-bench.duckdb"
        if not (args.keep and db.exists()):
            db.unlink(missing_ok=True)
            seconds, n = write_store(db, args.rollouts, args.calls)
            logger.info("wrote %d spans (%d rollouts) in %.0f s; file %.0f MB", n, args.rollouts, seconds,
                        db.stat().st_size / 2**20)
        logger.info("%-44s %10s %10s %10s", "page", "median ms", "max ms", "bytes")
        for label, med, worst, size in time_pages(db, args.reps, args.tokenizer):
            logger.info("%-44s %10.1f %10.1f %10d", label, 1000 * med, 1000 * worst, size)


if __name__ == "__main__":
    main()
