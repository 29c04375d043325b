"""Ingest and read-back speed of the DuckDB span store (issue: span store).

Writes N LLM-call spans of 2,000 prompt + 500 response token IDs (plus 500 logprobs) into a fresh
DuckDB file in batches through the public ``SpanStore.add_spans`` API, then reads every span's token
IDs back as Arrow. Token IDs are given two ways: as NumPy arrays (what bulk producers should hand
in) and as Python lists (what a JSON-parsing producer has). Prints spans/s, read seconds and peak RSS;
medians over --reps runs. Not a test: the machine is shared and noisy.

Run: .venv/bin/python benchmarks/store_ingest.py [--spans 10000] [--batch 2048] [--reps 3] [--no-compress]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from spanlab.store import SpanStore
from spanlab.store.spans import spans_to_arrow
from spanlab.types import LLMCall, Span


def make_spans(rollout_id: str, attempt_id: str, n: int, as_lists: bool, seed: int) -> list[Span]:
    rng = np.random.default_rng(seed)
    prompt = rng.integers(0, 150_000, size=(n, 2000), dtype=np.int32)
    response = rng.integers(0, 150_000, size=(n, 500), dtype=np.int32)
    logprobs = -rng.random((n, 500), dtype=np.float32)
    spans = []
    for i in range(n):
        p, r, lp = prompt[i], response[i], logprobs[i]
        if as_lists:
            p, r, lp = p.tolist(), r.tolist(), lp.tolist()
        llm = LLMCall(model="bench", prompt_token_ids=p, response_token_ids=r, response_logprobs=lp)
        spans.append(Span(rollout_id=rollout_id, attempt_id=attempt_id, name="chat", kind="llm_call", llm=llm))
    return spans


def run_arrow_once(n: int, batch: int, seed: int, compress: bool = True) -> float:
    """The columnar path: Arrow batches (as a bulk producer or the store server has them) -> add_span_table."""
    with tempfile.TemporaryDirectory() as tmp:
        store = SpanStore(Path(tmp) / "bench.duckdb", compress=compress)
        store.enqueue_one({"bench": True})
        rollout, attempt = store.dequeue("bench")
        spans = make_spans(rollout.rollout_id, attempt.attempt_id, n, False, seed)
        tables = [spans_to_arrow(spans[i : i + batch]) for i in range(0, n, batch)]
        del spans
        t0 = time.perf_counter()
        for tbl in tables:
            store.add_span_table(tbl)
        ingest_s = time.perf_counter() - t0
        store.close()
    return n / ingest_s


def run_once(n: int, batch: int, as_lists: bool, seed: int, compress: bool = True) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        store = SpanStore(Path(tmp) / "bench.duckdb", compress=compress)
        store.enqueue_one({"bench": True})
        rollout, attempt = store.dequeue("bench")
        t0 = time.perf_counter()
        spans = make_spans(rollout.rollout_id, attempt.attempt_id, n, as_lists, seed)
        build_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        for i in range(0, n, batch):
            store.add_spans(spans[i : i + batch])
        ingest_s = time.perf_counter() - t0
        del spans
        t0 = time.perf_counter()
        table = store.spans_table(kinds=["llm_call"], columns=["prompt_token_ids", "response_token_ids"])
        read_s = time.perf_counter() - t0
        assert table.num_rows == n, table.num_rows
        store.close()
    return {"build_s": build_s, "ingest_spans_s": n / ingest_s, "read_s": read_s}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spans", type=int, default=10_000)
    ap.add_argument("--batch", type=int, default=2048)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--no-compress", action="store_true", help="SpanStore(compress=False)")
    args = ap.parse_args()
    for as_lists in (False, True):
        runs = [run_once(args.spans, args.batch, as_lists, seed, not args.no_compress) for seed in range(args.reps)]
        label = "python lists" if as_lists else "numpy arrays"
        ingest = statistics.median(r["ingest_spans_s"] for r in runs)
        read = statistics.median(r["read_s"] for r in runs)
        build = statistics.median(r["build_s"] for r in runs)
        print(
            f"{label:>12}: ingest {ingest:8.0f} spans/s (median of {args.reps}; batches of {args.batch}; file store"
            f"{', uncompressed' if args.no_compress else ''}) | "
            f"read {args.spans} spans' token IDs as Arrow {read:.3f} s | building the Span objects {build:.2f} s"
        )
    arrow = statistics.median(run_arrow_once(args.spans, args.batch, seed, not args.no_compress)
                              for seed in range(args.reps))
    print(f"{'arrow batches':>12}: ingest {arrow:8.0f} spans/s via add_span_table (checked column-wise; median of "
          f"{args.reps})")
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS of this process: {peak_mb:.0f} MB (includes the {args.spans} spans held in memory before ingest)")


if __name__ == "__main__":
    main()
