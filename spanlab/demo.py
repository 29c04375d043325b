"""A synthetic run written through the real store API: the first thing to try after installing.

Each rollout is an arithmetic question; a simulated agent makes one or two LLM calls (random token
IDs, no model), a calculator tool call, and records a reward. A few attempts fail and are retried
per the rollout's policy. Then ``spanlab sql`` has something to query.

Run: spanlab demo --db runs/demo.duckdb && spanlab sql "SELECT * FROM rollout_summary" --db runs/demo.duckdb
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np

from spanlab.store import SpanStore
from spanlab.types import LLMCall, RolloutConfig, Span, Usage, reward_span

VOCAB = 49_152  # SmolLM2's vocabulary size, the default model's


def _llm_span(rollout_id: str, attempt_id: str, question: str, answer: str, rng: np.random.Generator) -> Span:
    n_prompt, n_resp = int(rng.integers(40, 120)), int(rng.integers(5, 30))
    return Span(
        rollout_id=rollout_id,
        attempt_id=attempt_id,
        name="chat.completions",
        kind="llm_call",
        llm=LLMCall(
            model="demo-model",
            request_messages=[{"role": "user", "content": question}],
            response_message={"role": "assistant", "content": answer},
            finish_reason="stop",
            prompt_token_ids=rng.integers(0, VOCAB, n_prompt, dtype=np.int32),
            response_token_ids=rng.integers(0, VOCAB, n_resp, dtype=np.int32),
            response_logprobs=-rng.random(n_resp, dtype=np.float32),
            usage=Usage(prompt_tokens=n_prompt, completion_tokens=n_resp, total_tokens=n_prompt + n_resp),
        ),
    )


def run_demo(db: Path, n_rollouts: int = 24, seed: int = 0) -> str:
    """Simulate ``n_rollouts`` rollouts into ``db``; returns a short text summary."""
    rand, rng = random.Random(seed), np.random.default_rng(seed)
    config = RolloutConfig(max_attempts=2, retry_on=("failed",))
    with SpanStore(db) as store:
        for _ in range(n_rollouts):
            a, b = rand.randint(1, 99), rand.randint(1, 99)
            mode = rand.choice(["train", "train", "val"])
            store.enqueue_one({"question": f"What is {a} + {b}?", "answer": a + b}, mode=mode, config=config)
        while (got := store.dequeue(worker_id="demo-worker")) is not None:
            rollout, attempt = got
            store.heartbeat(attempt.attempt_id)
            if rand.random() < 0.15:  # a crashing agent: the store retries it
                store.finish_attempt(attempt.attempt_id, "failed")
                continue
            q, truth = rollout.input["question"], rollout.input["answer"]
            guess = truth if rand.random() < 0.6 else truth + rand.randint(1, 9)
            spans = [_llm_span(rollout.rollout_id, attempt.attempt_id, q, f"calculator({q[8:-1]})", rng)]
            spans.append(
                Span(
                    rollout_id=rollout.rollout_id,
                    attempt_id=attempt.attempt_id,
                    name="calculator",
                    kind="tool_call",
                    attributes={"arguments": q[8:-1], "result": str(guess)},
                )
            )
            spans.append(_llm_span(rollout.rollout_id, attempt.attempt_id, q, f"The answer is {guess}.", rng))
            spans.append(reward_span(rollout.rollout_id, attempt.attempt_id, float(guess == truth), final=True))
            store.add_spans(spans)
            store.finish_attempt(attempt.attempt_id, "succeeded")
        summaries = store.rollout_summaries()
    n_calls = sum(s.llm_calls for s in summaries)
    stats = []
    for status in sorted({s.status for s in summaries}):
        rewards = [s.final_reward for s in summaries if s.status == status and s.final_reward is not None]
        stats.append({"status": status, "n": sum(s.status == status for s in summaries),
                      "reward": sum(rewards) / len(rewards) if rewards else None})
    lines = [f"wrote {n_rollouts} rollouts and {n_calls} LLM calls to {db}"]
    lines += [f"  {s['status']}: {s['n']} rollouts, mean reward {s['reward'] or 0:.2f}" for s in stats]
    lines.append(f'try: spanlab sql "SELECT * FROM rollout_summary LIMIT 5" --db {db}')
    return "\n".join(lines)
