"""Side by side: Agent Lightning's LightningStore vs spanlab's span store, in-process and over HTTP (issue #10).

The same work for each system: enqueue R rollouts; for each, dequeue it, add K LLM-call spans of P prompt +
Q response token IDs and finish the attempt ("ingest"); then read every span's token IDs back for training
("read-back"). Token IDs are random (fixed seeds), made fresh for every span (Python lists for Agent Lightning,
which stores OpenTelemetry attributes; NumPy arrays or Python lists for spanlab) outside the timed calls.

Each system stores token IDs its own way:

* Agent Lightning 0.3.0 (``agentlightning==0.3.0``, run in ./.venv-bench, set up by ``scripts/bench_env.sh``):
  ``InMemoryLightningStore`` in-process, ``agl store`` (LightningStoreServer over the same in-memory store) +
  ``LightningStoreClient`` over HTTP. Two span formats, both read back with AGL's own adapter code
  (``LlmProxyTraceToTriplet._extract_tokens_from_*``):
    - ``proxy``: what AGL's LLM proxy records (LiteLLM's OpenTelemetry callback): a ``raw_gen_ai_request`` span
      whose ``llm.hosted_vllm.prompt_token_ids`` / ``llm.hosted_vllm.choices`` attributes are the token lists
      as *strings* (``str(list)``; read back with ``ast.literal_eval``). AGL's training path.
    - ``list``: what its AgentOps tracer records for an in-process vLLM: ``prompt_token_ids`` /
      ``response_token_ids`` attributes as integer sequences.
* spanlab (./.venv): ``SpanStore`` in-process, ``spanlab store serve`` + ``StoreClient`` over HTTP (Arrow IPC),
  each on ``--storage``: ``memory`` (``:memory:``, nothing durable) and/or ``file`` (a fresh DuckDB file: every
  write is committed and fsynced to the store's hot SQLite file before it returns). The read-back first copies
  what DuckDB lacks into DuckDB, inside the timed read. Token IDs are ``INTEGER[]`` columns, read back as Arrow
  with ``spans_reader``.

Like with like: a ratio is printed only between stores that keep spans the same way, memory with memory (AGL
0.3.0's ``InMemoryLightningStore``, in-process or behind ``agl store``). AGL 0.3.0's only durable store is
``MongoLightningStore``, which needs a MongoDB server (none here; its ``store/sqlite.py`` is a TODO stub):
spanlab's file rows are printed with no AGL row to divide by. Row names say transport, storage and input:
``spanlab-inproc-file-numpy`` is spanlab in this process, on a DuckDB file, given NumPy token IDs.

Each rep of a row repeats the whole work (ingest then read-back, fresh rollouts each time) until it has taken
``--min-rep-s`` (2 s) and reports the mean per round, so a fast row is not a ~0.1 s sample of a noisy machine.

Spans are added through each system's batch call, by default one rollout's K spans at a time as it ends
(``--batch-rollouts B``: the spans of B rollouts per call, as a gateway's span writer batches them): AGL
``add_many_spans`` (whose HTTP client sends one request per span), spanlab ``add_spans`` (one request per call).
Rollouts are dequeued one at a time and each attempt is finished (AGL ``update_attempt(status="succeeded")``,
spanlab ``finish_attempt``); with one rollout per call spanlab sends the spans with the finish
(``finish_attempt(id, "succeeded", spans)``, one request and one transaction), as its runner does. One
warm-up rollout per system first, written and read back, not timed (one-time costs such as imports stay out of
the reps). Every process is its
own subprocess (its peak RSS is its own: /proc VmHWM); the systems run in alternating order within each
repetition so that all see the same machine load. Prints medians over --reps, ratios spanlab/AGL, and
checks that every system read back the same token IDs (sum and count).

Run: bash scripts/bench_env.sh   (once)
     .venv/bin/python benchmarks/vs_agentlightning_store.py [--rollouts 20] [--spans 10] [--prompt 2000]
         [--response 500] [--batch-rollouts 1] [--reps 3] [--transports inproc http] [--storage memory file]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SPANLAB_PY = Path(sys.executable)  # run with spanlab's .venv
BENCH_PY = ROOT / ".venv-bench" / "bin" / "python"
HOST = "127.0.0.1"


# --- shared helpers (both venvs) -------------------------------------------------------------------------
def _status_kb(pid: int | str, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


class Memory:
    """A process's memory over one piece of work: peak RSS (VmHWM) and growth (peak minus RSS before the work).

    The peak is reset before the work (``echo 5 > /proc/PID/clear_refs``), so a process that runs several
    variants one after the other reports each variant's own peak; growth is what the work itself added."""

    def __init__(self, pid: int | str = "self") -> None:
        self.pid = pid

    def start(self) -> None:
        gc.collect()
        Path(f"/proc/{self.pid}/clear_refs").write_text("5")
        self.rss0 = _status_kb(self.pid, "VmRSS") / 1024

    def stop(self) -> dict[str, float]:
        peak = _status_kb(self.pid, "VmHWM") / 1024
        return {"peak_mb": peak, "growth_mb": peak - self.rss0}


def token_ids(args: argparse.Namespace, rollout: int) -> tuple[np.ndarray, np.ndarray]:
    """The K spans' prompt and response token IDs of rollout number ``rollout`` (deterministic)."""
    rng = np.random.default_rng(1_000 + rollout)
    return (rng.integers(0, 150_000, (args.spans, args.prompt), dtype=np.int32),
            rng.integers(0, 150_000, (args.spans, args.response), dtype=np.int32))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def _wait_http(url: str, proc: subprocess.Popen, timeout: float = 300) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server for {url} exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"{url} did not come up")


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    proc.wait(30)


class Timer:
    """Accumulates only the store calls' wall time (not making the token IDs)."""

    def __init__(self) -> None:
        self.s = 0.0

    def __enter__(self) -> Timer:
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.s += time.perf_counter() - self._t0


def _rounds(work: Callable[[bool], dict[str, Any]], warm_up: bool, min_s: float) -> dict[str, Any]:
    """``work(warm_up)`` repeated (fresh rollouts each round) until its timed parts add up to ``min_s``; the
    mean time per round."""
    rounds = [work(warm_up)]
    while sum(r["ingest_s"] + r["read_s"] for r in rounds) < min_s:
        rounds.append(work(False))
    return rounds[0] | {k: statistics.mean(r[k] for r in rounds) for k in ("ingest_s", "read_s")} | {
        "rounds": len(rounds)}


def _measured(work, server_pid: int | None) -> dict[str, Any]:
    """Run ``work()`` (returns a result dict) with this process's and the server's memory measured."""
    mems = {"client": Memory()} | ({"server": Memory(server_pid)} if server_pid else {})
    for m in mems.values():
        m.start()
    res = work()
    for name, m in mems.items():
        res |= {f"{name}_{k}": v for k, v in m.stop().items()}
    return res


# --- Agent Lightning side (runs in .venv-bench) ------------------------------------------------------------
def _agl_span(rollout_id: str, attempt_id: str, seq: int, prompt: list[int], response: list[int], fmt: str):
    from agentlightning.types import OtelResource, Span, SpanContext, TraceStatus

    trace_id, span_id = f"{rollout_id[-16:]:0>32}", f"{seq:016x}"
    if fmt == "proxy":  # LiteLLM's OpenTelemetry callback stringifies non-primitive values (safe_set_attribute)
        name = "raw_gen_ai_request"
        attrs: dict[str, Any] = {
            "llm.hosted_vllm.model": "bench",
            "llm.hosted_vllm.prompt_token_ids": str(prompt),
            "llm.hosted_vllm.choices": str([{"index": 0, "finish_reason": "stop", "token_ids": response}]),
        }
    else:  # the AgentOps tracer's vLLM instrumentation: integer sequences
        name = "openai.chat.completion"
        attrs = {"gen_ai.request.model": "bench", "prompt_token_ids": prompt, "response_token_ids": response}
    return Span(
        rollout_id=rollout_id, attempt_id=attempt_id, sequence_id=seq, trace_id=trace_id, span_id=span_id,
        parent_id=None, name=name, status=TraceStatus(status_code="OK"), attributes=attrs, events=[], links=[],
        start_time=time.time(), end_time=time.time(),
        context=SpanContext(trace_id=trace_id, span_id=span_id, is_remote=False, trace_state={}),
        parent=None, resource=OtelResource(attributes={"service.name": "bench"}, schema_url=""),
    )


async def _agl_rollouts(store: Any, args: argparse.Namespace, fmt: str, n: int, first: int,
                        ingest: Timer) -> list[str]:
    from agentlightning.store.base import EnqueueRolloutRequest

    with ingest:
        await store.enqueue_many_rollouts([EnqueueRolloutRequest(input={"task": first + i}) for i in range(n)])
    rollout_ids = []
    for start in range(0, n, args.batch_rollouts):
        group, spans = [], []
        for i in range(start, min(n, start + args.batch_rollouts)):
            with ingest:
                got = await store.dequeue_rollout(worker_id="bench")
            assert got is not None
            group.append(got)
            prompts, responses = token_ids(args, first + i)
            spans += [_agl_span(got.rollout_id, got.attempt.attempt_id, k + 1, prompts[k].tolist(),
                                responses[k].tolist(), fmt) for k in range(args.spans)]
        with ingest:
            added = await store.add_many_spans(spans)
            for got in group:
                await store.update_attempt(got.rollout_id, got.attempt.attempt_id, status="succeeded")
        assert len(added) == len(spans), len(added)
        rollout_ids += [got.rollout_id for got in group]
        del spans, added
    return rollout_ids


async def _agl_work(store: Any, args: argparse.Namespace, fmt: str, warm_up: bool) -> dict[str, Any]:
    from agentlightning.adapter.triplet import LlmProxyTraceToTriplet

    if warm_up:  # one rollout written and read back, not timed: one-time costs (imports) out of the reps
        for rid in await _agl_rollouts(store, args, fmt, 1, -1, Timer()):
            await store.query_spans(rid)
    ingest = Timer()
    rollout_ids = await _agl_rollouts(store, args, fmt, args.rollouts, 0, ingest)
    # read back for training: every rollout's spans, token IDs through AGL's adapter code
    adapter = LlmProxyTraceToTriplet()
    extract = adapter._extract_tokens_from_raw if fmt == "proxy" else adapter._extract_tokens_from_openai
    out: list[tuple[list[int], list[int]]] = []
    t0 = time.perf_counter()
    for rid in rollout_ids:
        for span in (await store.query_spans(rid)).items:
            out.append(extract(span.attributes))
    read_s = time.perf_counter() - t0
    total = sum(sum(p) + sum(r) for p, r in out)
    count = sum(len(p) + len(r) for p, r in out)
    return {"ingest_s": ingest.s, "read_s": read_s, "checksum": [total, count], "spans": len(out)}


class AglSession:
    """Agent Lightning's stores, one per span format, kept for all reps (an in-memory store in this process,
    or one ``agl store`` server and a LightningStoreClient)."""

    def __init__(self, transport: str, storage: str, variants: list[str], args: argparse.Namespace) -> None:
        from agentlightning.store import InMemoryLightningStore, LightningStoreClient

        assert storage == "memory", storage
        self.args, self.loop, self.server, self.warm = args, asyncio.new_event_loop(), None, set()
        if transport == "inproc":
            self.stores = {fmt: InMemoryLightningStore() for fmt in variants}
            return
        port = _free_port()
        agl = str(Path(sys.executable).with_name("agl"))
        self.server = subprocess.Popen([agl, "store", "--host", HOST, "--port", str(port), "--log-level", "WARNING"],
                                       stdout=subprocess.DEVNULL)
        _wait_http(f"http://{HOST}:{port}/v1/agl/health", self.server)
        self.client = LightningStoreClient(f"http://{HOST}:{port}")
        self.stores = dict.fromkeys(variants, self.client)

    def run(self, fmt: str) -> dict[str, Any]:
        def once(warm_up: bool) -> dict[str, Any]:
            return self.loop.run_until_complete(_agl_work(self.stores[fmt], self.args, fmt, warm_up))

        work = partial(_rounds, once, fmt not in self.warm, self.args.min_rep_s)
        res = _measured(work, self.server.pid if self.server else None)
        self.warm.add(fmt)
        return res

    def close(self) -> None:
        if self.server:
            self.loop.run_until_complete(self.client.close())
            _stop(self.server)


# --- spanlab side (runs in .venv) --------------------------------------------------------------------------
def _spanlab_rollouts(store: Any, args: argparse.Namespace, as_lists: bool, n: int, first: int,
                      ingest: Timer) -> list[str]:
    from spanlab.types import LLMCall, Rollout, Span

    with ingest:
        store.enqueue([Rollout(input={"task": first + i}) for i in range(n)])
    rollout_ids = []
    for start in range(0, n, args.batch_rollouts):
        group, spans = [], []
        for i in range(start, min(n, start + args.batch_rollouts)):
            with ingest:
                got = store.dequeue(worker_id="bench")
            assert got is not None
            rollout, attempt = got
            group.append(got)
            prompts, responses = token_ids(args, first + i)
            spans += [Span(rollout_id=rollout.rollout_id, attempt_id=attempt.attempt_id, name="chat",
                           kind="llm_call",
                           llm=LLMCall(model="bench",
                                       prompt_token_ids=prompts[k].tolist() if as_lists else prompts[k],
                                       response_token_ids=responses[k].tolist() if as_lists else responses[k]))
                      for k in range(args.spans)]
        if len(group) == 1:  # a rollout's spans go with its finish: one call, one transaction
            with ingest:
                done = store.finish_attempt(group[0][1].attempt_id, "succeeded", spans)
            assert done.status == "succeeded", done.status
        else:
            with ingest:
                added = store.add_spans(spans)
                for _, attempt in group:
                    store.finish_attempt(attempt.attempt_id, "succeeded")
            assert added == len(spans), added
        rollout_ids += [rollout.rollout_id for rollout, _ in group]
        del spans
    return rollout_ids


def _spanlab_work(store: Any, args: argparse.Namespace, as_lists: bool, warm_up: bool) -> dict[str, Any]:
    import pyarrow.compute as pc

    if warm_up:  # one rollout written and read back, not timed: one-time costs (imports) out of the reps
        store.spans_reader(rollout_ids=_spanlab_rollouts(store, args, as_lists, 1, -1, Timer())).read_all()
    ingest = Timer()
    rollout_ids = _spanlab_rollouts(store, args, as_lists, args.rollouts, 0, ingest)
    # read back for training: the step's rollouts' LLM-call token IDs, streamed as Arrow (NumPy views per batch)
    t0 = time.perf_counter()
    chunks, spans_read = [], 0
    for batch in store.spans_reader(rollout_ids=rollout_ids, kinds=["llm_call"],
                                    columns=["rollout_id", "prompt_token_ids", "response_token_ids"]):
        chunks.append((pc.list_flatten(batch.column("prompt_token_ids")).to_numpy(),
                       pc.list_flatten(batch.column("response_token_ids")).to_numpy()))
        spans_read += batch.num_rows
    read_s = time.perf_counter() - t0
    total = sum(int(p.sum(dtype=np.int64)) + int(r.sum(dtype=np.int64)) for p, r in chunks)  # not timed (AGL's
    count = sum(len(p) + len(r) for p, r in chunks)                                            # is not either)
    return {"ingest_s": ingest.s, "read_s": read_s, "checksum": [total, count], "spans": spans_read}


class SpanlabSession:
    """spanlab stores, one DuckDB file per input variant, kept for all reps (``SpanStore`` in this process, or
    ``spanlab store serve`` on the file and a ``StoreClient``)."""

    def __init__(self, transport: str, storage: str, variants: list[str], args: argparse.Namespace) -> None:
        from spanlab.store import SpanStore
        from spanlab.store.client import StoreClient

        self.args, self.warm, self.servers = args, set(), {}
        self.tmp = tempfile.TemporaryDirectory()
        self.stores: dict[str, Any] = {}
        for v in variants:
            db = ":memory:" if storage == "memory" else Path(self.tmp.name) / f"{v}.duckdb"
            if transport == "inproc":
                self.stores[v] = SpanStore(db)
                continue
            port = _free_port()
            spanlab = str(Path(sys.executable).with_name("spanlab"))
            self.servers[v] = subprocess.Popen([spanlab, "store", "serve", "--db", str(db), "--host", HOST,
                                                "--port", str(port)], stdout=subprocess.DEVNULL)
            _wait_http(f"http://{HOST}:{port}/health", self.servers[v])
            self.stores[v] = StoreClient(f"http://{HOST}:{port}")

    def run(self, v: str) -> dict[str, Any]:
        work = partial(_rounds, partial(_spanlab_work, self.stores[v], self.args, v == "lists"), v not in self.warm,
                       self.args.min_rep_s)
        server = self.servers.get(v)
        res = _measured(work, server.pid if server else None)
        self.warm.add(v)
        return res

    def close(self) -> None:
        for store in self.stores.values():
            store.close()
        for server in self.servers.values():
            _stop(server)
        self.tmp.cleanup()


def child_main(spec: str, args: argparse.Namespace) -> None:
    """A long-lived child: sets its system up once (imports, servers), then runs one variant per ``run V``
    line on stdin and answers one ``@@ {json}`` line; ``quit`` ends it."""
    system, transport, storage, variants = spec.split(":")
    session = (AglSession if system == "agl" else SpanlabSession)(transport, storage, variants.split(","), args)
    print("@@ " + json.dumps({"ready": True}), flush=True)
    try:
        for line in sys.stdin:
            cmd = line.split()
            if not cmd or cmd[0] == "quit":
                break
            print("@@ " + json.dumps({"variant": cmd[1], **session.run(cmd[1])}), flush=True)
    finally:
        session.close()


# --- driver ------------------------------------------------------------------------------------------------
class Child:
    """The driver's handle on one long-lived child process (see ``child_main``)."""

    def __init__(self, system: str, transport: str, storage: str, variants: list[str], argv: list[str]) -> None:
        py = BENCH_PY if system == "agl" else SPANLAB_PY
        env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "PYTHONWARNINGS": "ignore"}
        self.spec = f"{system}:{transport}:{storage}:{','.join(variants)}"
        self.system, self.transport, self.storage, self.variants = system, transport, storage, variants
        self.err = tempfile.TemporaryFile("w+")  # noqa: SIM115 - closed with the child
        self.proc = subprocess.Popen([str(py), __file__, *argv, "--child", self.spec], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.err, text=True, env=env)

    def answer(self) -> dict[str, Any]:
        for line in self.proc.stdout:
            if line.startswith("@@ "):
                return json.loads(line[3:])
        self.err.seek(0)
        raise RuntimeError(f"{self.spec} exited ({self.proc.wait()}):\n{self.err.read()[-3000:]}")

    def run(self, variant: str) -> dict[str, Any]:
        self.proc.stdin.write(f"run {variant}\n")
        self.proc.stdin.flush()
        return self.answer()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.write("quit\n")
            self.proc.stdin.close()
            self.proc.wait(60)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rollouts", type=int, default=20)
    ap.add_argument("--spans", type=int, default=10, help="LLM-call spans per rollout")
    ap.add_argument("--prompt", type=int, default=2000, help="prompt token IDs per span")
    ap.add_argument("--response", type=int, default=500, help="response token IDs per span")
    ap.add_argument("--batch-rollouts", type=int, default=1,
                    help="add the spans of this many rollouts in one call (1: each rollout's spans as it ends)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--formats", nargs="+", default=["proxy", "list"], choices=["proxy", "list"],
                    help="Agent Lightning span formats (see the module docstring)")
    ap.add_argument("--spanlab-inputs", nargs="+", default=["numpy", "lists"], choices=["numpy", "lists"],
                    help="token IDs handed to spanlab as NumPy arrays and/or Python lists")
    ap.add_argument("--transports", nargs="+", default=["inproc", "http"], choices=["inproc", "http"],
                    help="inproc: the store in the benchmark's process; http: a store server process and its client")
    ap.add_argument("--storage", nargs="+", default=["memory", "file"], choices=["memory", "file"],
                    help="spanlab's storage: memory (like AGL's in-memory store) and/or a DuckDB file (durable)")
    ap.add_argument("--min-rep-s", type=float, default=2.0, help="each rep repeats the work until it took this long")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child_main(args.child, args)
        return
    if not BENCH_PY.exists():
        sys.exit("no .venv-bench: run `bash scripts/bench_env.sh` first")

    argv = [f"--rollouts={args.rollouts}", f"--spans={args.spans}", f"--prompt={args.prompt}",
            f"--response={args.response}", f"--batch-rollouts={args.batch_rollouts}", f"--min-rep-s={args.min_rep_s}"]
    children: list[Child] = []
    t_start = time.perf_counter()
    try:
        for t in args.transports:
            children.append(Child("agl", t, "memory", args.formats, argv))
            children += [Child("spanlab", t, storage, args.spanlab_inputs, argv) for storage in args.storage]
        for c in children:  # imports and servers: not measured
            c.answer()
        n_spans = args.rollouts * args.spans
        print(f"# {args.rollouts} rollouts x {args.spans} LLM-call spans of {args.prompt}+{args.response} token IDs "
              f"= {n_spans} spans a round, spans of {args.batch_rollouts} rollout(s) per add call; each rep of a row "
              f"repeats rounds for >= {args.min_rep_s:g} s; {args.reps} reps, systems alternating; set-up "
              f"{time.perf_counter() - t_start:.0f} s; load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}",
              flush=True)
        results: dict[str, list[dict[str, Any]]] = {}
        runs = [(c, v) for c in children for v in c.variants]
        for rep in range(args.reps):
            for c, v in runs if rep % 2 == 0 else runs[::-1]:
                r = c.run(v)
                key = f"{c.system}-{c.transport}-{c.storage}-{v}"
                results.setdefault(key, []).append(r)
                srv = (f"  server peak {r['server_peak_mb']:5.0f} MB ({r['server_growth_mb']:+.0f})"
                       if "server_peak_mb" in r else "")
                print(f"  rep {rep}: {key:28} {r['rounds']:4d} rounds, each: ingest {r['ingest_s']:6.3f} s  "
                      f"read {r['read_s']:6.3f} s  client peak {r['client_peak_mb']:5.0f} MB "
                      f"({r['client_growth_mb']:+.0f}){srv}", flush=True)
    finally:
        for c in children:
            c.close()
    checks = {tuple(r["checksum"]) for rs in results.values() for r in rs}
    assert len(checks) == 1, f"systems read back different token IDs: {checks}"
    assert all(r["spans"] == n_spans for rs in results.values() for r in rs)

    def med(key: str, *fields: str) -> float:
        """Median over the reps of the sum of ``fields``."""
        return statistics.median(sum(r.get(f, 0.0) for f in fields) for r in results[key])

    print(f"\n# medians of {args.reps} reps of the time per round; all read back the same {checks.pop()[1]:,} token "
          f"IDs a round; {time.perf_counter() - t_start:.0f} s in all; load average now "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    print(f"{'row (system-transport-storage-input)':36} {'ingest spans/s':>14} {'read-back s':>11} "
          f"{'ingest+read s':>13} {'client MB: growth, peak':>24} {'server MB: growth, peak':>24}")
    for key in results:
        srv = (f"{med(key, 'server_growth_mb'):+6.0f}, {max(r['server_peak_mb'] for r in results[key]):5.0f}"
               if "server_peak_mb" in results[key][0] else "")
        print(f"{key:36} {n_spans / med(key, 'ingest_s'):14.0f} {med(key, 'read_s'):11.3f} "
              f"{med(key, 'ingest_s', 'read_s'):13.3f} "
              f"{'':11}{med(key, 'client_growth_mb'):+6.0f}, {max(r['client_peak_mb'] for r in results[key]):5.0f}"
              f"{'':12}{srv}")
    print("(growth: RSS added while doing one rep's work, median; peak: the highest RSS in any rep, reached in "
          "the last one when a store keeps its spans in memory)")
    print("\n# like with like, both in memory: spanlab faster by (AGL time / spanlab time, medians); memory: client "
          "+ server, spanlab vs AGL")
    for t in args.transports:
        for f in args.formats:
            a = f"agl-{t}-memory-{f}"
            for v in args.spanlab_inputs if "memory" in args.storage else ():
                s = f"spanlab-{t}-memory-{v}"
                ratios = [med(a, *k) / med(s, *k) for k in (["ingest_s"], ["read_s"], ["ingest_s", "read_s"])]
                grow = [med(k, "client_growth_mb", "server_growth_mb") for k in (s, a)]
                peak = [max(r["client_peak_mb"] + r.get("server_peak_mb", 0.0) for r in results[k]) for k in (s, a)]
                print(f"{t:6} spanlab[{v:5}] vs AGL[{f:5}]: ingest {ratios[0]:6.1f}x  read-back {ratios[1]:6.1f}x  "
                      f"ingest+read {ratios[2]:6.1f}x  | growth {grow[0]:.0f} vs {grow[1]:.0f} MB, "
                      f"peak {peak[0]:.0f} vs {peak[1]:.0f} MB")
    if "file" in args.storage:
        print("# spanlab's file rows (every write fsynced) have no AGL counterpart here: AGL 0.3.0's durable store, "
              "MongoLightningStore, needs a MongoDB server")


if __name__ == "__main__":
    main()
