"""The sample rule on spans written the real way: runner Worker -> recording gateway -> real vLLM, on both stores.

Three rollouts of one task, each a real agent run: one abandons a stream after three chunks and retries (the
gateway records the cut stream as a ``client_disconnected`` error span), one fails after a call, one records an
intermediate reward (``ctx.add_reward``) after a call and times out. GRPO's read and SFT's filtering give exactly
the retry's call with the agent's reward; the drops are counted; the timed-out attempt's verdict is never read as
its final reward. The same cases written through the store API are in test_trainable.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import httpx
import pytest
from openai import AsyncOpenAI

from spanlab.adapters.filtered_dataset import FilterConfig, build_sft_dataset
from spanlab.adapters.sample_reader import iter_samples
from spanlab.adapters.trainable import Dropped, KeepFailed
from spanlab.gateway import GatewayServer
from spanlab.runner import Agent, RolloutContext, Worker
from spanlab.store import StoreAPI
from spanlab.types import Rollout, RolloutConfig
from tests.stores import wait_until

pytestmark = pytest.mark.vllm

MESSAGES = [{"role": "user", "content": "Name three colors."}]
# The timed-out case's limit (the others get 300 s). Its call and reward must come before it: the other cases
# wait for its reward (CasesAgent.verdict_recorded), so its one short call has vLLM to itself. A 15 s limit with
# three calls at once was missed once on a loaded CI machine (no verdict stored).
TIMEOUT_S = 30.0


class CasesAgent(Agent):
    """``task["case"]``: ``retry`` (a cut stream, then a call; reward 1), ``fail`` (a call, then an exception),
    ``timeout`` (a call, an intermediate reward, then waits past the attempt's limit)."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.verdict_recorded = asyncio.Event()  # the worker runs the three attempts in one event loop

    async def run(self, task: Any, ctx: RolloutContext) -> float | None:
        assert ctx.llm_base_url is not None
        client = AsyncOpenAI(base_url=ctx.llm_base_url, api_key=ctx.llm_api_key, max_retries=0)
        if task["case"] != "timeout":  # bounded: a missed verdict fails the assertions below, not a 300 s hang
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.verdict_recorded.wait(), TIMEOUT_S)
        if task["case"] == "retry":
            body = {"model": self.model, "messages": MESSAGES, "max_tokens": 200, "temperature": 1.0,
                    "stream": True, "ignore_eos": True}
            async with httpx.AsyncClient(timeout=120) as http, \
                    http.stream("POST", f"{ctx.llm_base_url}/chat/completions", json=body) as resp:
                chunks = 0
                async for line in resp.aiter_lines():
                    chunks += line.startswith("data: ")
                    if chunks == 3:
                        break  # leaving the block closes the connection mid-stream
        await client.chat.completions.create(model=self.model, messages=MESSAGES, max_tokens=4)  # type: ignore[arg-type]
        if task["case"] == "fail":
            raise RuntimeError("scripted failure after one call")
        if task["case"] == "timeout":
            await asyncio.to_thread(ctx.add_reward, 1.0, name="check.verdict")
            self.verdict_recorded.set()
            await asyncio.Event().wait()  # until the runner's timeout cancels it
        return 1.0


def _calls(store: StoreAPI, attempt_id: str) -> list[tuple[str, str]]:
    return [(s.span_id, s.status) for s in store.iter_spans(attempt_ids=[attempt_id], kinds=["llm_call"])]


def test_a_cut_stream_a_failed_and_a_timed_out_attempt_train_exactly_the_retry(
        any_store: StoreAPI, vllm_server: Any, caplog: pytest.LogCaptureFixture) -> None:
    cases = ("retry", "fail", "timeout")
    rollouts = [Rollout(input={"task_id": "t", "case": c},
                        config=RolloutConfig(timeout_s=TIMEOUT_S if c == "timeout" else 300.0)) for c in cases]
    ids = {c: r.rollout_id for c, r in zip(cases, any_store.enqueue(rollouts), strict=True)}
    with GatewayServer(any_store, vllm_server.base_url) as gateway:
        stats = asyncio.run(Worker(any_store, CasesAgent(vllm_server.model), gateway_url=gateway.url,
                                   concurrency=3, heartbeat_s=0.5).run())
        attempts = {c: any_store.last_attempts([rid])[0][1] for c, rid in ids.items()}
        retry = attempts["retry"].attempt_id
        # the cut stream's span is written when the gateway sees the agent leave: after the retry's, maybe later
        assert wait_until(lambda: gateway.flush(1) and len(_calls(any_store, retry)) == 2, 30)
    assert (stats.succeeded, stats.failed) == (1, 1)  # the timeout: the worker's or the store's, whichever is first
    assert {c: a.status for c, a in attempts.items()} == {"retry": "succeeded", "fail": "failed", "timeout": "timeout"}
    cut, ok = sorted(_calls(any_store, retry), key=lambda c: c[1])  # "error" < "ok"
    assert cut[1] == "error" and ok[1] == "ok"
    (cut_span,) = any_store.iter_spans(span_ids=[cut[0]])
    assert cut_span.attributes["error"]["type"] == "client_disconnected" and cut_span.llm.response_token_ids
    verdicts = [s for s in any_store.iter_spans(attempt_ids=[attempts["timeout"].attempt_id], kinds=["reward"])]
    assert [(s.name, s.attributes) for s in verdicts] == [("check.verdict", {"final": False})]

    dropped = Dropped()
    with caplog.at_level(logging.WARNING, logger="spanlab.adapters.trainable"):
        samples = list(iter_samples(any_store, list(ids.values()), dropped=dropped))
    assert [(s.rollout_id, s.span_ids, s.reward) for s in samples] == [(ids["retry"], [ok[0]], 1.0)]
    assert (dropped.error_spans, dropped.failed_attempts, dropped.unrewarded_attempts) == (1, 2, 0)
    assert "group t: 2 of its 3 rollouts give no sample (failed attempt: 2)" in caplog.text
    assert {s.rollout_id: s.final_reward for s in any_store.rollout_summaries(list(ids.values()))} == {
        ids["retry"]: 1.0, ids["fail"]: None, ids["timeout"]: None}

    kept = {s.rollout_id: (len(s.span_ids), s.reward)
            for s in iter_samples(any_store, list(ids.values()), failed_attempts=KeepFailed(reward=0.0))}
    assert kept == {ids["retry"]: (1, 1.0), ids["fail"]: (1, 0.0), ids["timeout"]: (1, 0.0)}

    sft_dropped = Dropped()
    table, stats_sft = build_sft_dataset(any_store, list(ids.values()), FilterConfig(min_reward=1.0),
                                         dropped=sft_dropped)
    assert table["span_ids"].to_pylist() == [[ok[0]]] and stats_sft.seen == 1
    assert sft_dropped == dropped
