"""The live demo: a real model answers arithmetic questions through the recording gateway.

The whole data path with nothing simulated: rollouts are queued in the store, a worker runs a plain
OpenAI-client agent on each, the agent calls vLLM (the embedded default model on CPU) through the
gateway, which records every call with its exact token IDs; the reward (1 when the final number is
right) goes into the store. No training yet: the base model gets most answers wrong, which is what
the algorithms are for.

Run: spanlab demo --engine [--db runs/demo.duckdb] [--rollouts 8]
"""

from __future__ import annotations

import asyncio
import random
import re
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from openai import AsyncOpenAI

from spanlab.engine.config import EngineConfig
from spanlab.runner import Agent, RolloutContext, Worker
from spanlab.types import Rollout, RolloutConfig

SYSTEM = "You are a careful calculator. Answer with the number only."


class ArithmeticAgent(Agent):
    """One chat call per question; reward 1.0 when the last number in the reply equals the answer."""

    def __init__(self, model: str, max_tokens: int = 64) -> None:
        self.model, self.max_tokens = model, max_tokens

    async def run(self, task: Any, ctx: RolloutContext) -> float:
        client = AsyncOpenAI(base_url=ctx.llm_base_url, api_key=ctx.llm_api_key)
        reply = await client.chat.completions.create(
            model=self.model,
            messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": task["question"]}],
            max_tokens=self.max_tokens,
            temperature=0,
        )
        numbers = re.findall(r"-?\d+", reply.choices[0].message.content or "")
        return float(bool(numbers) and int(numbers[-1]) == task["answer"])


def run_live_demo(db: Path, n_rollouts: int = 8, seed: int = 0, engine: EngineConfig | None = None,
                  upstream: tuple[str, str] | None = None) -> str:
    """Queue ``n_rollouts`` questions and run them; ``upstream=(root_url, model)`` uses a running engine."""
    from spanlab.engine.server import VLLMServer
    from spanlab.gateway.app import GatewayServer
    from spanlab.store import SpanStore

    rand = random.Random(seed)
    with SpanStore(db) as store:
        for _ in range(n_rollouts):
            a, b = rand.randint(2, 60), rand.randint(2, 60)
            store.enqueue([Rollout(input={"question": f"What is {a} + {b}?", "answer": a + b},
                                   config=RolloutConfig(timeout_s=300, max_attempts=2))])
        with ExitStack() as stack:
            if upstream is None:
                server = stack.enter_context(VLLMServer(engine or EngineConfig()))
                upstream = (server.root_url, server.model)
            root_url, model = upstream
            gateway = stack.enter_context(GatewayServer(store, root_url))
            worker = Worker(store, ArithmeticAgent(model), gateway_url=gateway.url, concurrency=4)
            stats = asyncio.run(worker.run())
            gateway.flush()
        summaries = store.rollout_summaries()
        rows = {"calls": sum(s.llm_calls for s in summaries), "prompt_tokens": sum(s.prompt_tokens for s in summaries),
                "response_tokens": sum(s.response_tokens for s in summaries)}
        rewards = [s.final_reward for s in summaries if s.final_reward is not None]
        reward = sum(rewards) / len(rewards) if rewards else None
    return (
        f"ran {stats.succeeded + stats.failed + stats.timeout} attempts on {model}: "
        f"{rows['calls']} LLM calls recorded with exact token IDs ({rows['prompt_tokens']} prompt, "
        f"{rows['response_tokens']} sampled tokens), mean reward {reward or 0:.2f}, in {db}\n"
        f'try: spanlab sql "SELECT rollout_id, final_reward, input FROM rollout_summary" --db {db}'
    )
