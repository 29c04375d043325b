"""OTLP/HTTP ingest: GenAI spans/s from the OpenTelemetry SDK exporter into `spanlab store serve`.

Makes N GenAI chat spans with the real SDK (model, one input and one output message, usage, and
2,000 prompt + 500 response token IDs as ``spanlab.*`` integer-array attributes), then times
``OTLPSpanExporter.export`` (protobuf over HTTP, batches of --batch, one client) into a fresh store
server: encode, send, decode, map to store spans, commit. Median of --reps runs, each on a fresh file.
Then, in-process, where one span's time goes: the SDK's protobuf encoding (client side) and the server's
decoding + GenAI mapping (``spanlab.otel.read_request``) + Arrow conversion.

Run: .venv/bin/python benchmarks/otlp_ingest.py [--spans 2048] [--batch 512] [--reps 3]
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.stores import free_port

logger = logging.getLogger("otlp_ingest")
MESSAGES_IN = json.dumps([{"role": "user", "parts": [{"type": "text", "content": "What is 12 + 30?"}]}])
MESSAGES_OUT = json.dumps([{"role": "assistant", "parts": [{"type": "text", "content": "42"}],
                            "finish_reason": "stop"}])


def make_spans(n: int) -> tuple[ReadableSpan, ...]:
    rng = np.random.default_rng(0)
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("bench")
    for _ in range(n):
        with tracer.start_as_current_span("chat bench", attributes={
            "gen_ai.operation.name": "chat", "gen_ai.request.model": "bench", "gen_ai.usage.input_tokens": 2000,
            "gen_ai.usage.output_tokens": 500, "gen_ai.input.messages": MESSAGES_IN,
            "gen_ai.output.messages": MESSAGES_OUT,
            "spanlab.prompt_token_ids": rng.integers(0, 150_000, 2000).tolist(),
            "spanlab.response_token_ids": rng.integers(0, 150_000, 500).tolist()}):
            pass
    provider.shutdown()
    return memory.get_finished_spans()


def run_once(spans: tuple[ReadableSpan, ...], batch: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        port = free_port()
        cmd = [str(Path(sys.executable).with_name("spanlab")), "store", "serve", "--db", f"{tmp}/otlp.duckdb",
               "--port", str(port)]
        proc = subprocess.Popen(cmd)
        try:
            for _ in range(300):
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/health").is_success:
                        break
                except httpx.TransportError:
                    time.sleep(0.1)
            exporter = OTLPSpanExporter(endpoint=f"http://127.0.0.1:{port}/v1/traces", timeout=120)
            assert exporter.export(spans[:1]) is SpanExportResult.SUCCESS  # warm: connection, lazy imports
            t0 = time.perf_counter()
            for i in range(1, len(spans), batch):
                assert exporter.export(spans[i : i + batch]) is SpanExportResult.SUCCESS
            elapsed = time.perf_counter() - t0
            exporter.shutdown()
            return (len(spans) - 1) / elapsed
        finally:
            proc.terminate()
            proc.wait(timeout=60)


def split_costs(spans: tuple[ReadableSpan, ...]) -> tuple[float, float, float]:
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    from spanlab.otel import read_request
    from spanlab.store.spans import spans_to_arrow

    t0 = time.perf_counter()
    body = encode_spans(spans).SerializeToString()
    t1 = time.perf_counter()
    _, mapped = read_request(body, "application/x-protobuf", None, 1 << 30)
    t2 = time.perf_counter()
    spans_to_arrow(mapped)
    t3 = time.perf_counter()
    n = len(spans) / 1000
    return (t1 - t0) / n, (t2 - t1) / n, (t3 - t2) / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spans", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    spans = make_spans(args.spans + 1)
    rates = [run_once(spans, args.batch) for _ in range(args.reps)]
    parts = split_costs(spans[: args.batch])
    logger.info("per span: SDK encode %.2f ms (client), decode + map %.2f ms, to Arrow %.2f ms (server)", *parts)
    logger.info("OTLP/HTTP protobuf, %d GenAI spans of 2,000 + 500 token IDs, batches of %d: %.0f spans/s "
                "(median of %d: %s)", args.spans, args.batch, statistics.median(rates), args.reps,
                ", ".join(f"{r:.0f}" for r in rates))


if __name__ == "__main__":
    main()
