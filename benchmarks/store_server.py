"""Store server throughput: LLM-call spans/s over HTTP from several client processes, and queue rollouts/s.

Starts `spanlab store serve` on a fresh file, then C client processes each send B batches of S spans
(2,000 prompt + 500 response token IDs and 500 logprobs per span, NumPy arrays) through StoreClient
(Arrow IPC). Reports spans/s over the wall time of all clients, then rollouts/s through
enqueue -> dequeue -> finish from the same number of clients, then heartbeats/s (each client beating for
8 live attempts). Median of --reps runs.

Run: .venv/bin/python benchmarks/store_server.py [--clients 4] [--spans 16384] [--batch 2048] [--reps 3] [--no-compress]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

from spanlab.store.client import StoreClient
from spanlab.store.spans import spans_to_arrow
from spanlab.store.wire import table_to_bytes
from spanlab.types import LLMCall, Rollout, Span


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_server(db: Path, port: int, compress: bool = True) -> subprocess.Popen:
    spanlab = str(Path(sys.executable).with_name("spanlab"))
    flags = [] if compress else ["--no-compress"]
    proc = subprocess.Popen([spanlab, "store", "serve", "--db", str(db), "--port", str(port), *flags])
    for _ in range(300):
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health").is_success:
                return proc
        except httpx.TransportError:
            time.sleep(0.1)
    raise RuntimeError("store server did not start")


def _span_writer(url: str, rollout_id: str, attempt_id: str, n: int, batch: int, seed: int, ready, go) -> None:
    rng = np.random.default_rng(seed)
    spans = [
        Span(rollout_id=rollout_id, attempt_id=attempt_id, name="chat", kind="llm_call",
             llm=LLMCall(model="bench", prompt_token_ids=rng.integers(0, 150_000, 2000, dtype=np.int32),
                         response_token_ids=rng.integers(0, 150_000, 500, dtype=np.int32),
                         response_logprobs=-rng.random(500, dtype=np.float32)))
        for _ in range(n)
    ]
    client = StoreClient(url)
    _warm_up(client, spans[:1], rollout_id)
    ready.set()
    go.wait()
    for i in range(0, n, batch):
        client.add_spans(spans[i : i + batch])
    client.close()


def _warm_up(client: StoreClient, spans: list[Span], rollout_id: str) -> None:
    """What a long-lived worker has done before its first batch: the HTTP connection is open and the
    lazy imports of the first Arrow conversion (pyarrow pulls in pandas, ~0.4 s, ~1 s with 4 processes
    starting at once on 2 cores) are paid. Measured without this, the first batch of every client carried
    that start-up cost inside the timed window."""
    table_to_bytes(spans_to_arrow(spans))
    client.get_rollout(rollout_id)


def _queue_worker(url: str, n: int, ready, go) -> None:
    client = StoreClient(url)
    client.list_rollouts(limit=1)  # connection open before the clock starts
    ready.set()
    go.wait()
    done = 0
    while done < n and (got := client.dequeue(worker_id="bench")) is not None:
        client.finish_attempt(got[1].attempt_id, "succeeded")
        done += 1
    client.close()


def _beat_worker(url: str, attempt_ids: list[str], beats: int, ready, go) -> None:
    """A worker's heartbeat loop over its live attempts, as fast as the server answers."""
    client = StoreClient(url)
    client.heartbeat(attempt_ids[0])  # connection open, and each attempt past its first (committed) beat
    for a in attempt_ids[1:]:
        client.heartbeat(a)
    ready.set()
    go.wait()
    for i in range(beats):
        client.heartbeat(attempt_ids[i % len(attempt_ids)])
    client.close()


def _run_clients(target, args_per_client: list[tuple]) -> float:
    ctx = mp.get_context("spawn")
    go = ctx.Event()
    readies = [ctx.Event() for _ in args_per_client]
    procs = [ctx.Process(target=target, args=(*a, r, go)) for a, r in zip(args_per_client, readies, strict=True)]
    for p in procs:
        p.start()
    for r in readies:
        r.wait()
    t0 = time.perf_counter()
    go.set()
    for p in procs:
        p.join()
        assert p.exitcode == 0, p.exitcode
    return time.perf_counter() - t0


def run_once(clients: int, n_spans: int, batch: int, n_rollouts: int, seed: int,
             compress: bool = True) -> tuple[float, float, float]:
    with tempfile.TemporaryDirectory() as tmp:
        port = _free_port()
        server = _start_server(Path(tmp) / "bench.duckdb", port, compress)
        url = f"http://127.0.0.1:{port}"
        try:
            client = StoreClient(url)
            client.enqueue_one({})
            rollout, attempt = client.dequeue()
            per = n_spans // clients
            wall = _run_clients(_span_writer, [(url, rollout.rollout_id, attempt.attempt_id, per, batch, seed * 100 + c)
                                               for c in range(clients)])
            stored = client.query("SELECT count(*) AS n FROM llm_calls").to_pylist()[0]["n"]
            assert stored == per * clients, stored
            spans_per_s = stored / wall
            client.enqueue([Rollout(input={"i": i}) for i in range(n_rollouts)])
            wall_q = _run_clients(_queue_worker, [(url, n_rollouts // clients) for _ in range(clients)])
            rollouts_per_s = (n_rollouts // clients * clients) / wall_q
            client.enqueue([Rollout(input={"live": i}) for i in range(8 * clients)])
            live = [client.dequeue(worker_id="bench")[1].attempt_id for _ in range(8 * clients)]
            beats = 500
            wall_b = _run_clients(_beat_worker, [(url, live[c::clients], beats) for c in range(clients)])
            beats_per_s = beats * clients / wall_b
            client.close()
        finally:
            server.terminate()
            server.wait()
    return spans_per_s, rollouts_per_s, beats_per_s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--spans", type=int, default=16_384)
    ap.add_argument("--batch", type=int, default=2048)
    ap.add_argument("--rollouts", type=int, default=1000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--no-compress", action="store_true", help="serve with `spanlab store serve --no-compress`")
    args = ap.parse_args()
    results = [run_once(args.clients, args.spans, args.batch, args.rollouts, seed, not args.no_compress)
               for seed in range(args.reps)]
    spans = statistics.median(r[0] for r in results)
    rollouts = statistics.median(r[1] for r in results)
    beats = statistics.median(r[2] for r in results)
    print(f"spans over HTTP: {spans:.0f} spans/s ({args.clients} client processes, batches of {args.batch}, "
          f"{'uncompressed store, ' if args.no_compress else ''}"
          f"2,500 token IDs each; median of {args.reps}; runs: {[round(r[0]) for r in results]})")
    print(f"queue: {rollouts:.0f} rollouts/s through dequeue+finish ({args.clients} clients; median of {args.reps}; "
          f"runs: {[round(r[1]) for r in results]})")
    print(f"heartbeats: {beats:.0f} beats/s ({args.clients} clients, 8 live attempts each; median of {args.reps}; "
          f"runs: {[round(r[2]) for r in results]})")


if __name__ == "__main__":
    main()
