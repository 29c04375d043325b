"""Fuzz the store server from its own OpenAPI description and count the answers >= 500, by cause.

Every operation of ``/openapi.json`` gets ``--examples`` generated requests (schemathesis: valid ones, then
invalid ones that break the schema on purpose), seeded, so a run is repeatable; then every operation that takes
a JSON body gets the hostile bodies JSON Schema cannot describe (:data:`HOSTILE_BODIES`: NaN, Infinity, nesting
100,000 deep, a lone surrogate, invalid UTF-8), which the JSON policy must refuse with a 4xx. The server runs in this
process on 127.0.0.1 over a scratch store with a few rollouts, attempts and spans (so IDs in paths can
hit real rows); a 5xx is traced to its cause from the server's own log of the exception (type, message
and the deepest spanlab frame). Leaves out: stateful sequences (links between operations) and Arrow
bodies (the schema describes them as opaque bytes; they are sent as generated).

Run: python benchmarks/fuzz_store_server.py [--examples 200] [--seed 20] [--modes positive,negative]
The CI test (tests/test_store_fuzz.py) runs the same code with few examples per operation.
"""

from __future__ import annotations

import argparse
import collections
import logging
import re
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as fixed_seed
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

from spanlab.store import SpanStore
from spanlab.store.server import create_store_app
from spanlab.store.wire import ARROW_STREAM
from spanlab.threaded_server import ThreadedServer
from spanlab.types import Rollout, reward_span

logger = logging.getLogger("fuzz_store_server")


@schemathesis.serializer(ARROW_STREAM)
def _arrow_body(_: schemathesis.SerializationContext, value: object) -> bytes:
    """Arrow routes take opaque bytes: send the generated value's text, which must be refused with a 4xx."""
    return value if isinstance(value, bytes) else repr(value).encode()


@dataclass
class FuzzReport:
    """What a run sent and what came back."""

    requests: int = 0
    by_status: collections.Counter = field(default_factory=collections.Counter)
    errors: collections.Counter = field(default_factory=collections.Counter)  # cause -> count of 5xx
    examples: dict[str, str] = field(default_factory=dict)  # cause -> one request that hit it

    @property
    def server_errors(self) -> int:
        return sum(n for code, n in self.by_status.items() if isinstance(code, int) and code >= 500)


class _Causes(logging.Handler):
    """Collects the server's logged exceptions (uvicorn logs each unhandled one with its traceback)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.seen: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            frames = [f for f in traceback.extract_tb(exc.__traceback__) if "/spanlab/" in f.filename]
            where = f" at {Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else ""
            self.seen.append(f"{type(exc).__name__}: {str(exc)[:120]}{where}")
        else:
            self.seen.append(record.getMessage()[:160])


@contextmanager
def fuzz_server(root: Path) -> Iterator[str]:
    """A store server on 127.0.0.1 over a small store in ``root``; yields its URL, stops it and closes the store."""
    store = SpanStore(root / "fuzz.duckdb")
    try:
        store.enqueue([Rollout(rollout_id=f"ro-{i}", input={"i": i}) for i in range(4)])
        rollout, attempt = store.dequeue(worker_id="fuzz")
        store.add_spans([reward_span(rollout.rollout_id, attempt.attempt_id, 1.0)])
        store.add_resource("prompt", {"text": "hi"})
        with ThreadedServer(create_store_app(store, sql_timeout_s=2.0), name="fuzzed-store") as srv:
            yield srv.url
    finally:
        store.close()


# Bodies no JSON Schema generator sends (issue 42): each must get a 4xx from every JSON route.
HOSTILE_BODIES: dict[str, bytes] = {
    "NaN": b'{"a": NaN, "b": [NaN]}',
    "Infinity": b'[{"a": Infinity, "b": -Infinity, "c": 1e999}]',
    "nested 300 deep": b'{"a": ' + b"[" * 300 + b"]" * 300 + b"}",
    "nested 100,000 deep": b"[" * 100_000 + b"]" * 100_000,
    "lone surrogate": b'{"name": "\ud800", "rollout_id": "\udfff"}',
    "invalid UTF-8": b'{"name": "\xff\xfe"}',
}


def fuzz(url: str, *, examples: int, seed: int, modes: tuple[GenerationMode, ...],
         schema: schemathesis.BaseSchema | None = None, expected: Callable[[Any], bool] = lambda _: False,
         headers: dict[str, str] | None = None) -> FuzzReport:
    """``examples`` requests per operation and mode against the server at ``url`` (``schema``: its OpenAPI, read
    from ``/openapi.json`` unless given), then :data:`HOSTILE_BODIES`; ``expected(response)``: a 5xx that is the
    right answer (the gateway's 502 for an engine it cannot reach), not counted."""
    report = FuzzReport()
    causes = _Causes()
    watched = [logging.getLogger(n) for n in ("uvicorn.error", "spanlab.store.server", "spanlab.ui.app")]
    for log in watched:
        log.addHandler(causes)
    schema = schema or schemathesis.openapi.from_url(f"{url}/openapi.json")
    try:
        for result in schema.get_all_operations():
            operation = result.ok()
            for mode in modes:
                _fuzz_operation(operation, mode, url, examples, seed, report, causes, expected, headers)
            _hostile(operation, url, report, causes, expected, headers)
    finally:
        for log in watched:
            log.removeHandler(causes)
    return report


def _count(report: FuzzReport, causes: _Causes, before: int, response: Any, label: str, example: str,
           expected: Callable[[Any], bool]) -> None:
    report.requests += 1
    report.by_status[response.status_code] += 1
    if response.status_code >= 500 and not expected(response):
        time.sleep(0.05)  # uvicorn may log the exception just after the answer went out
        new = causes.seen[before:] or [f"{response.status_code} without a logged exception: {response.text[:120]}"]
        cause = f"{label}: {new[-1]}"
        report.errors[cause] += 1
        report.examples.setdefault(cause, example)
    elif response.status_code >= 500:
        report.by_status[response.status_code] -= 1
        report.by_status[f"{response.status_code} (expected)"] += 1


def _hostile(operation: schemathesis.APIOperation, url: str, report: FuzzReport, causes: _Causes,
             expected: Callable[[Any], bool], headers: dict[str, str] | None) -> None:
    """Each of :data:`HOSTILE_BODIES` to an operation that takes JSON (path parameters filled with ``x``)."""
    body = operation.definition.raw.get("requestBody", {})
    if "application/json" not in body.get("content", {}):
        return
    path = re.sub(r"\{[^}]+\}", "x", operation.path)
    for name, raw in HOSTILE_BODIES.items():
        before = len(causes.seen)
        response = httpx.request(operation.method.upper(), url + path, content=raw, timeout=30,
                                 headers={"content-type": "application/json", **(headers or {})})
        _count(report, causes, before, response, f"{operation.label} ({name})", f"{name} to {path}", expected)
        if not 400 <= response.status_code < 500 and not expected(response):
            cause = f"{operation.label} ({name}): answered {response.status_code}, not a 4xx"
            report.errors[cause] += 1
            report.examples.setdefault(cause, response.text[:200])


def _fuzz_operation(operation: schemathesis.APIOperation, mode: GenerationMode, url: str, examples: int,
                    seed: int, report: FuzzReport, causes: _Causes, expected: Callable[[Any], bool],
                    headers: dict[str, str] | None) -> None:
    @fixed_seed(seed)
    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(max_examples=examples, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    def one(case: schemathesis.Case) -> None:
        before = len(causes.seen)
        response = case.call(base_url=url, timeout=30, headers=headers)
        _count(report, causes, before, response, operation.label,
               f"{case.method} {case.formatted_path} query={case.query} body={str(case.body)[:200]}", expected)

    try:
        one()
    except Unsatisfiable:  # nothing to break in an operation without parameters or body (negative mode)
        return


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=200, help="requests per operation and generation mode")
    ap.add_argument("--seed", type=int, default=20)
    ap.add_argument("--modes", default="positive,negative", help="schemathesis generation modes")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    modes = tuple(GenerationMode(m) for m in args.modes.split(","))
    with tempfile.TemporaryDirectory(prefix="spanlab-fuzz-") as root, fuzz_server(Path(root)) as url:
        start = time.monotonic()
        report = fuzz(url, examples=args.examples, seed=args.seed, modes=modes)
        took = time.monotonic() - start
    codes = dict(sorted(report.by_status.items()))
    logger.info("%d requests in %.0f s; status codes: %s", report.requests, took, codes)
    logger.info("%d answers >= 500 in %d causes", report.server_errors, len(report.errors))
    for cause, n in report.errors.most_common():
        logger.info("%6d  %s\n        e.g. %s", n, cause, report.examples[cause])


if __name__ == "__main__":
    main()
