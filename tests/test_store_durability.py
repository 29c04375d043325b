"""Acknowledged = durable: a process SIGKILLed right after its store calls returned loses none of them.

The child process kills itself (no close, no checkpoint) once every call below has returned; the parent
reopens the file and finds each acknowledged change exactly once. Ingest under SIGKILL at a random moment
is in tests/test_store_faults.py, the store server's in tests/test_store_server.py, the gateway's in
tests/gateway/test_gateway_kill.py.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from spanlab.store import SpanStore

CHILD = textwrap.dedent(
    """
    import os, signal, sys
    import numpy as np
    from spanlab.store import SpanStore
    from spanlab.types import LLMCall, Rollout, RolloutConfig, Span, reward_span

    store = SpanStore(sys.argv[1])
    cfg = RolloutConfig(max_attempts=2)
    store.enqueue([Rollout(rollout_id=f"r{i}", input={"i": i}, config=cfg) for i in range(4)])
    (r0, a0), (r1, a1), (r2, a2) = store.dequeue("w"), store.dequeue("w"), store.dequeue("w")
    rng = np.random.default_rng(0)
    calls = [Span(rollout_id="r0", attempt_id=a0.attempt_id, name="chat", kind="llm_call", span_id=f"c{k}",
                  llm=LLMCall(model="m", prompt_token_ids=rng.integers(0, 1000, 30).tolist(),
                              response_token_ids=[k, k + 1])) for k in range(3)]
    store.add_spans(calls[:2])
    store.finish_attempt(a0.attempt_id, "succeeded", [calls[2], reward_span("r0", a0.attempt_id, 1.0)])
    store.finish_attempt(a1.attempt_id, "failed")
    store.heartbeat(a2.attempt_id)
    store.add_resource("prompt", {"t": "x"})
    store.add_metrics("run", "grpo", 1, {"loss": 0.5})
    print("ACK", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


def test_sigkill_loses_no_acknowledged_write(tmp_path: Path) -> None:
    path = tmp_path / "s.duckdb"
    proc = subprocess.run([sys.executable, "-c", CHILD, str(path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == -9 and "ACK" in proc.stdout, proc.stderr
    with SpanStore(path) as store:
        states = {r.rollout_id: (r.status, r.num_attempts, [a.status for a in store.list_attempts(r.rollout_id)])
                  for r in store.list_rollouts()}
        assert states == {
            "r0": ("succeeded", 1, ["succeeded"]),
            "r1": ("requeuing", 1, ["failed"]),
            "r2": ("running", 1, ["running"]),
            "r3": ("queuing", 0, []),
        }
        spans = store.spans_table(rollout_ids=["r0"], columns=["span_id", "sequence_id", "response_token_ids"])
        assert spans["span_id"].to_pylist()[:3] == ["c0", "c1", "c2"] and spans.num_rows == 4
        assert spans["response_token_ids"].to_pylist()[:3] == [[0, 1], [1, 2], [2, 3]]
        assert store.get_resource("prompt").version == 1
        assert [m.value for m in store.metrics("run")] == [0.5]
        rollout, attempt = store.dequeue()
        assert (rollout.rollout_id, attempt.sequence_id) == ("r1", 2)  # the retry, in enqueue order
